//! `multirail bench group`: an ordered multicast group of N ranks
//! (`multirail::Group`), measured as Derecho's bandwidth_test measures its
//! groups. Per size, every sender multicasts `--count` messages with
//! `ordered_send` as fast as the window lets it while every member
//! receives; then:
//!
//! * per node, the delivered payload rate: payload bytes delivered (of
//!   every sender, own messages included) over the time from the start
//!   (after a barrier) to the node's last delivery, in GB/s (10^9 B/s);
//! * the mean of that over the nodes (the headline value);
//! * the latency from the `ordered_send` call to the sender's own delivery
//!   of that message, median and p99 over every sender's messages (under
//!   the run's load: a full window adds its wait).
//!
//! `--validate` fills each payload with a pattern of (sender, number) and
//! checks every byte at every member, per-sender order, and that every
//! member delivered the same sequence (ordered) or the same per-sender
//! sequences (unordered), by comparing hashes of the sequences at rank 0.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use multirail::group::{Mode, Senders};
use multirail::{Bytes, Endpoint, Group, GroupEvent, GroupOptions, JobInfo};
use multirail_proto::units::{format_size, parse_size};

use super::{config_of, fail, launch_local, parse_sizes};
use crate::cli::BenchArgs;
use crate::launch;

/// Tags of the result exchange (below multirail's reserved tags, above
/// the agreement's).
const RESULT_TAG: u64 = (1 << 62) + 40;
/// Tag of the survivors' barrier (`--fail-member`), past the result tags.
const SYNC_TAG: u64 = RESULT_TAG + 4096;
/// A payload starts with the sender's rank and the message's number.
const HEADER: usize = 12;
/// One size gives up after this long without a delivery.
const STALL: Duration = Duration::from_secs(60);

pub fn run(args: &BenchArgs) -> anyhow::Result<i32> {
    let launched = std::env::var_os(launch::LAUNCHED).is_some();
    if let Some(job) = JobInfo::from_env()? {
        return rank(args, &job);
    }
    if launched {
        bail!("MULTIRAIL_LAUNCHED is set but MULTIRAIL_RANK/SIZE are not");
    }
    if args.server || args.connect.is_some() {
        bail!(
            "bench group runs --nodes ranks: start it locally (the default), with --testbed, \
             `multirail run -n N` or mpirun/srun, not --server/--connect"
        );
    }
    if !args.compare.is_empty() {
        bail!(
            "bench group does not take --compare: run it once per configuration \
             (bench/group-sitting.sh repeats the runs and takes medians)"
        );
    }
    sizes(args)?;
    relay_min(args)?;
    chunk(args)?;
    check_member_failure(args, args.nodes, args.testbed)?;
    let (code, _) = launch_local(args, &[], &[], false)?;
    Ok(code)
}

fn sizes(args: &BenchArgs) -> anyhow::Result<Vec<u64>> {
    let s = args.sizes.as_deref().unwrap_or("10K,1M");
    let v = parse_sizes(s).with_context(|| format!("--sizes {s}"))?;
    if let Some(big) = v.iter().find(|x| **x > u32::MAX as u64 - 64) {
        bail!("--sizes: {} is above what a group message carries (4 GiB)", format_size(*big));
    }
    Ok(v)
}

fn senders_of(s: &str, n: u32) -> anyhow::Result<(Senders, Vec<u32>)> {
    Ok(match s.trim() {
        "all" => (Senders::All, (0..n).collect()),
        "one" => (Senders::One(0), vec![0]),
        list => {
            let mut v: Vec<u32> = list
                .split(',')
                .map(|x| x.trim().parse::<u32>())
                .collect::<Result<_, _>>()
                .with_context(|| format!("--senders {s}: give all, one or a list of ranks (0,2)"))?;
            v.sort_unstable();
            v.dedup();
            if let Some(r) = v.iter().find(|r| **r >= n) {
                bail!("--senders {s}: rank {r} is not one of the {n} ranks");
            }
            if v.is_empty() {
                bail!("--senders {s}: no sender");
            }
            (Senders::List(v.clone()), v)
        }
    })
}

/// Messages per sender: `--count`, else about 200 MB, 100 to 10000.
/// `--relay-min`: a size, `off` (never: `usize::MAX`) or the default.
fn relay_min(args: &BenchArgs) -> anyhow::Result<usize> {
    size_or_off("--relay-min", args.relay_min.as_deref(), GroupOptions::default().relay_min)
}

/// `--relay-chunk`: a size of at least 1 byte, `off` (whole messages:
/// `usize::MAX`) or the default.
fn chunk(args: &BenchArgs) -> anyhow::Result<usize> {
    let c = size_or_off("--relay-chunk", args.relay_chunk.as_deref(), GroupOptions::default().chunk)?;
    if c == 0 {
        bail!("--relay-chunk 0: a chunk carries at least one byte (`off` sends whole messages)");
    }
    Ok(c)
}

fn size_or_off(flag: &str, value: Option<&str>, default: usize) -> anyhow::Result<usize> {
    match value {
        None => Ok(default),
        Some("off") => Ok(usize::MAX),
        Some(s) => {
            let v = parse_size(s).map_err(|e| anyhow::anyhow!("{flag} {s}: {e}"))?;
            usize::try_from(v).map_err(|_| anyhow::anyhow!("{flag} {s}: too large"))
        }
    }
}

/// `--fail-member RANK@TIME[:silence]`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct MemberFailure {
    rank: u32,
    at: Duration,
    silence: bool,
}

fn member_failure(args: &BenchArgs) -> anyhow::Result<Option<MemberFailure>> {
    let Some(s) = args.fail_member.as_deref() else { return Ok(None) };
    let usage = || format!("--fail-member {s}: expected RANK@TIME[:silence], e.g. 2@1s or 0@500ms:silence");
    let (rank, rest) = s.split_once('@').with_context(usage)?;
    let rank: u32 = rank.trim().parse().with_context(usage)?;
    let (time, silence) = match rest.split_once(':') {
        None => (rest, false),
        Some((t, "silence")) => (t, true),
        Some(_) => bail!("{}", usage()),
    };
    let at = fail::parse_duration(time).with_context(usage)?;
    Ok(Some(MemberFailure { rank, at, silence }))
}

/// Checks `--fail-member` against a group of `n` ranks.
fn check_member_failure(args: &BenchArgs, n: u32, testbed: bool) -> anyhow::Result<Option<MemberFailure>> {
    let Some(f) = member_failure(args)? else { return Ok(None) };
    if f.rank >= n {
        bail!("--fail-member {}@...: the group has ranks 0 to {}", f.rank, n - 1);
    }
    if n < 3 {
        bail!("--fail-member: a group of {n} cannot lose a member (partition safety: a majority must remain)");
    }
    if f.silence && !testbed {
        bail!("--fail-member ...:silence takes a testbed host's interfaces down: use it with --testbed");
    }
    if sizes(args)?.len() != 1 {
        bail!("--fail-member: give one size (--sizes): the group of the next size would miss the member");
    }
    Ok(Some(f))
}

/// The failing member itself: at `f.at` after `t0`, ends the process or
/// takes every rail of its host down (the caller brings them back with
/// [`set_links`] once the member stopped).
fn fail_self(f: MemberFailure, rails: usize, t0: Instant) {
    std::thread::sleep(f.at.saturating_sub(t0.elapsed()));
    if !f.silence {
        eprintln!("multirail: bench group: rank {} ends its process now (--fail-member)", f.rank);
        std::process::exit(0);
    }
    eprintln!("multirail: bench group: rank {} takes its {rails} rails down now (--fail-member)", f.rank);
    set_links(rails, true);
}

/// Takes every rail of this rank's testbed host down or up.
fn set_links(rails: usize, down: bool) {
    for r in 0..rails {
        fail::set_link(None, r, down, "--fail-member");
    }
}

fn count_for(args: &BenchArgs, size: u64) -> u64 {
    args.count.unwrap_or_else(|| (200_000_000 / size.max(1)).clamp(100, 10_000)).max(1)
}

/// Message `k` of `sender`: the header, then a pattern of both.
fn pattern(sender: u32, k: u64, len: usize) -> Bytes {
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&sender.to_le_bytes());
    v.extend_from_slice(&k.to_le_bytes());
    v.extend(
        (HEADER..len).map(|i| (i as u64).wrapping_mul(131).wrapping_add(k).wrapping_add(u64::from(sender) << 5) as u8),
    );
    v.truncate(len);
    Bytes::from(v)
}

/// What one node measured for one size.
struct NodeResult {
    rate: f64,
    /// Own-delivery latencies in µs (senders only).
    lat_us: Vec<f64>,
    /// Hash of the whole delivery sequence and of each sender's.
    order: u64,
    per_sender: Vec<u64>,
    error: Option<String>,
    /// `--fail-member`: seconds from the failure to the new view (NaN
    /// without one).
    view_after: f64,
    /// The most own messages handed to `ordered_send` and not yet
    /// delivered back at once (1 under `--light`).
    outstanding: u64,
}

impl NodeResult {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&self.rate.to_le_bytes());
        b.extend_from_slice(&self.order.to_le_bytes());
        b.extend_from_slice(&self.view_after.to_le_bytes());
        b.extend_from_slice(&self.outstanding.to_le_bytes());
        b.extend_from_slice(&(self.per_sender.len() as u64).to_le_bytes());
        for h in &self.per_sender {
            b.extend_from_slice(&h.to_le_bytes());
        }
        b.extend_from_slice(&(self.lat_us.len() as u64).to_le_bytes());
        for l in &self.lat_us {
            b.extend_from_slice(&l.to_le_bytes());
        }
        let e = self.error.as_deref().unwrap_or("").as_bytes();
        b.extend_from_slice(&(e.len() as u64).to_le_bytes());
        b.extend_from_slice(e);
        b
    }

    fn decode(b: &[u8]) -> anyhow::Result<NodeResult> {
        let mut at = 0;
        let mut word = || -> anyhow::Result<[u8; 8]> {
            let w = b.get(at..at + 8).context("short result message")?;
            at += 8;
            Ok(w.try_into().expect("8 bytes"))
        };
        let rate = f64::from_le_bytes(word()?);
        let order = u64::from_le_bytes(word()?);
        let view_after = f64::from_le_bytes(word()?);
        let outstanding = u64::from_le_bytes(word()?);
        let ns = u64::from_le_bytes(word()?) as usize;
        let per_sender = (0..ns).map(|_| word().map(u64::from_le_bytes)).collect::<anyhow::Result<_>>()?;
        let nl = u64::from_le_bytes(word()?) as usize;
        let lat_us = (0..nl).map(|_| word().map(f64::from_le_bytes)).collect::<anyhow::Result<_>>()?;
        let ne = u64::from_le_bytes(word()?) as usize;
        let e = b.get(at..at + ne).context("short result message")?;
        let error = (ne > 0).then(|| String::from_utf8_lossy(e).into_owned());
        Ok(NodeResult { rate, lat_us, order, per_sender, error, view_after, outstanding })
    }
}

fn mix(h: u64, x: u64) -> u64 {
    (h ^ x).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(17)
}

fn rank(args: &BenchArgs, job: &JobInfo) -> anyhow::Result<i32> {
    let mut cfg = config_of(args)?;
    let sizes = sizes(args)?;
    let plans = args.fail_rail.iter().map(|s| fail::FailPlan::parse(s)).collect::<anyhow::Result<Vec<_>>>()?;
    let failure = Some(fail::Injector::prepare(plans, &mut cfg, job.rank)?).filter(|i| !i.is_empty());
    let ep = Endpoint::from_job(cfg, job).with_context(|| format!("rank {} of {}", job.rank, job.size))?;
    let me = ep.rank();
    let ep = Arc::new(ep);
    // --fail-rail: rank 0 takes its rails down as planned (in the testbed,
    // host0's interface, under every member's traffic through host0) and
    // reports what rank 0 and rank 1 moved around it.
    let run = || match failure.as_ref().filter(|_| me == 0) {
        Some(inj) => {
            inj.check_rails(&ep, 1)?;
            let (r, report) = inj.watch(&ep, 1, || sizes_at(&ep, args, &sizes));
            eprint!("{report}");
            r
        }
        None => sizes_at(&ep, args, &sizes),
    };
    let code = crate::launch::reported_before_drop(run())?;
    let ep = Arc::try_unwrap(ep).ok().context("the group let go of the endpoint")?;
    ep.close().with_context(|| format!("rank {me}: closing"))?;
    Ok(code)
}

/// Every size, in order, at one member; the lead prints each size's row.
fn sizes_at(ep: &Arc<Endpoint>, args: &BenchArgs, sizes: &[u64]) -> anyhow::Result<i32> {
    let (n, me) = (ep.size(), ep.rank());
    let (senders, from) = senders_of(&args.senders, n)?;
    let mode = if args.unordered { Mode::Unordered } else { Mode::Ordered };
    let relay_min = relay_min(args)?;
    let chunk = chunk(args)?;
    let testbed = std::env::var(fail::TESTBED_PREFIX).is_ok_and(|p| !p.is_empty());
    let failure = check_member_failure(args, n, testbed)?;
    // Results go to the lowest member that does not fail; only rank 0's
    // output reaches the terminal under `bench`, so another lead writes
    // its row to stderr.
    let survivors: Vec<u32> = (0..n).filter(|r| failure.is_none_or(|f| f.rank != *r)).collect();
    let lead_rank = survivors[0];
    let lead = me == lead_rank;
    let rails = ep.rail_names().join(",");
    let mut out: Box<dyn Write> =
        if me == 0 { Box::new(std::io::stdout().lock()) } else { Box::new(std::io::stderr()) };
    if me == 0 && !args.json {
        let mut h = format!(
            "# multirail bench group (ordered multicast, Derecho's bandwidth_test) v{}\n",
            env!("CARGO_PKG_VERSION")
        );
        h.push_str(&format!(
            "# nodes: {n}  senders: {}  mode: {}  window: {}{}  relay: {}  relay chunk: {}  validate: {}\n# rails: {rails}  progress: {}\n",
            args.senders,
            if args.unordered { "unordered" } else { "ordered" },
            args.window,
            if args.light { " (light load: one own message at a time)" } else { "" },
            if relay_min == usize::MAX { "off".to_string() } else { format!(">= {}", format_size(relay_min as u64)) },
            if chunk == usize::MAX { "off".to_string() } else { format_size(chunk as u64) },
            if args.validate { "on" } else { "off" },
            ep.config().progress,
        ));
        h.push_str("# GB/s = 10^9 payload bytes/s delivered per node; latency: ordered_send to own delivery\n");
        h.push_str(&format!("{:<10}{:>8}{:>14}", "# Size", "Count", "Mean GB/s"));
        for r in 0..n {
            h.push_str(&format!("{:>12}", format!("Node{r} GB/s")));
        }
        h.push_str(&format!("{:>14}{:>14}\n", "P50 lat(us)", "P99 lat(us)"));
        out.write_all(h.as_bytes())?;
        out.flush()?;
    }
    let mut code = 0;
    for (i, &size) in sizes.iter().enumerate() {
        let count = count_for(args, size);
        ep.barrier().context("barrier before a size")?;
        let opts = GroupOptions {
            id: i as u16,
            members: None,
            senders: senders.clone(),
            window: args.window.max(1),
            mode,
            max_message: (size as usize).max(HEADER),
            relay_min,
            chunk,
            ..GroupOptions::default()
        };
        let g = Group::new(ep.clone(), opts).context("joining the group")?;
        let run =
            Run { me, n, from: &from, size: size as usize, count, validate: args.validate, light: args.light, failure };
        let mine = measure(&g, &run, ep.rail_names().len());
        if failure.is_some_and(|f| f.rank == me) {
            // The failed member (silenced: a crashed one is gone): no
            // barrier, no result; its rails come back for the next run.
            g.close();
            drop(g);
            set_links(ep.rail_names().len(), false);
            let why = match &mine {
                Ok(r) => r.error.clone().unwrap_or_else(|| "the run ended before it failed".into()),
                Err(e) => format!("{e:#}"),
            };
            eprintln!("multirail: bench group: rank {me} (--fail-member) stopped: {why}");
            return Ok(0);
        }
        // Everybody is done before anybody stops driving its group.
        if failure.is_some() {
            survivors_barrier(ep, &survivors).context("barrier of the survivors after the size")?;
        } else {
            ep.barrier().context("barrier after a size")?;
        }
        g.close();
        drop(g);
        let mine = mine?;
        let tag = RESULT_TAG + i as u64;
        if !lead {
            ep.send(lead_rank, tag, &mine.encode())?;
            continue;
        }
        let cap = 64 + 8 * (from.len() + count as usize) + 4096;
        let mut all: Vec<(u32, NodeResult)> = Vec::new();
        let mut mine = Some(mine);
        for &r in &survivors {
            if r == me {
                all.push((r, mine.take().expect("once")));
                continue;
            }
            let mut buf = vec![0u8; cap];
            let st = ep.recv(Some(r), Some(tag), &mut buf)?;
            all.push((r, NodeResult::decode(&buf[..st.len as usize]).with_context(|| format!("rank {r}'s result"))?));
        }
        let mut failed: Vec<String> =
            all.iter().filter_map(|(r, x)| x.error.as_ref().map(|e| format!("rank {r}: {e}"))).collect();
        if let Some(f) = failure
            && all.iter().any(|(_, x)| x.view_after.is_nan())
        {
            failed.push(format!(
                "rank {} was to fail at {:?} but the run ended without a view change: give an earlier time",
                f.rank, f.at
            ));
        }
        let all: Vec<NodeResult> = all.into_iter().map(|(_, x)| x).collect();
        if args.validate {
            let same = match mode {
                Mode::Ordered => all.iter().all(|x| x.order == all[0].order),
                Mode::Unordered => all.iter().all(|x| x.per_sender == all[0].per_sender),
            };
            if !same {
                failed.push("the members delivered different sequences".into());
            }
        }
        let rates: Vec<f64> = all.iter().map(|x| x.rate / 1e9).collect();
        let mean = rates.iter().sum::<f64>() / rates.len() as f64;
        let mut lat: Vec<f64> = all.iter().flat_map(|x| x.lat_us.iter().copied()).collect();
        lat.sort_by(f64::total_cmp);
        let pct = |p: f64| if lat.is_empty() { f64::NAN } else { lat[((lat.len() - 1) as f64 * p).round() as usize] };
        let (p50, p99) = (pct(0.5), pct(0.99));
        let line = if args.json {
            let v = serde_json::json!({
                "test": "group",
                "size": size,
                "value": mean,
                "unit": "GB/s",
                "nodes": n,
                "senders": args.senders,
                "mode": if args.unordered { "unordered" } else { "ordered" },
                "window": args.window,
                "light": args.light,
                "outstanding_max": all.iter().map(|x| x.outstanding).max(),
                "relay_min": (relay_min != usize::MAX).then_some(relay_min),
                "relay_chunk": (chunk != usize::MAX).then_some(chunk),
                "count": count,
                "per_node": rates,
                "p50": p50,
                "p99": p99,
                "latency_unit": "us",
                "validated": args.validate && failed.is_empty(),
                "fail_member": failure.map(|f| serde_json::json!({
                    "rank": f.rank,
                    "at_ms": f.at.as_secs_f64() * 1e3,
                    "how": if f.silence { "silence" } else { "crash" },
                    "view_after_ms": all.iter().map(|x| x.view_after * 1e3).collect::<Vec<_>>(),
                })),
            });
            format!("{v}\n")
        } else {
            let mut l = format!("{:<10}{:>8}{:>14.3}", size, count, mean);
            let mut rs = rates.iter();
            for r in 0..n {
                match failure.filter(|f| f.rank == r) {
                    Some(_) => l.push_str(&format!("{:>12}", "-")),
                    None => l.push_str(&format!("{:>12.3}", rs.next().copied().unwrap_or(f64::NAN))),
                }
            }
            l.push_str(&format!("{p50:>14.1}{p99:>14.1}\n"));
            if let Some(f) = failure {
                let mut v: Vec<f64> = all.iter().map(|x| x.view_after * 1e3).collect();
                v.sort_by(f64::total_cmp);
                l.push_str(&format!(
                    "# fail-member: rank {} {} at {:.0} ms; the others installed a view without it {:.0} to {:.0} ms later\n",
                    f.rank,
                    if f.silence { "went silent" } else { "crashed" },
                    f.at.as_secs_f64() * 1e3,
                    v[0],
                    v[v.len() - 1],
                ));
            }
            l
        };
        out.write_all(line.as_bytes())?;
        out.flush()?;
        if !failed.is_empty() {
            for f in &failed {
                eprintln!("multirail: bench group, size {}: {f}", format_size(size));
            }
            code = 1;
        }
    }
    Ok(code)
}

/// One size's parameters at one node.
struct Run<'a> {
    me: u32,
    n: u32,
    from: &'a [u32],
    size: usize,
    count: u64,
    validate: bool,
    /// `--light`: the sender waits for each own delivery before the next.
    light: bool,
    failure: Option<MemberFailure>,
}

/// Every survivor waits for the others (the failed member is not asked).
fn survivors_barrier(ep: &Endpoint, survivors: &[u32]) -> anyhow::Result<()> {
    let (me, lead) = (ep.rank(), survivors[0]);
    let mut b = [0u8; 1];
    if me == lead {
        for &r in &survivors[1..] {
            ep.recv(Some(r), Some(SYNC_TAG), &mut b)?;
        }
        for &r in &survivors[1..] {
            ep.send(r, SYNC_TAG, &b)?;
        }
    } else {
        ep.send(lead, SYNC_TAG, &b)?;
        ep.recv(Some(lead), Some(SYNC_TAG), &mut b)?;
    }
    Ok(())
}

/// A sender's own messages handed to the group and not yet delivered back.
#[derive(Default)]
struct Sent {
    /// When each was handed over, oldest first.
    at: VecDeque<Instant>,
    /// The most there were at once.
    most: u64,
    /// The receiving loop ended: nothing more comes back.
    stopped: bool,
}

/// One size at one node: send (if a sender) from a second thread, deliver
/// here. `rails`: how many the endpoint has (`--fail-member ...:silence`).
fn measure(g: &Group, run: &Run, rails: usize) -> anyhow::Result<NodeResult> {
    let Run { me, n, from, size, count, validate, light, failure } = *run;
    let mut expected = count * from.len() as u64;
    // Own messages not yet delivered back; `--light` waits on `back` for
    // them to be none.
    let sent = Mutex::new(Sent::default());
    let back = Condvar::new();
    let fixed = Bytes::from(vec![0x5a; size]);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        if let Some(f) = failure.filter(|f| f.rank == me) {
            s.spawn(move || fail_self(f, rails, t0));
        }
        let sender = from.contains(&me).then(|| {
            let (sent, back, fixed) = (&sent, &back, &fixed);
            s.spawn(move || -> anyhow::Result<()> {
                for k in 0..count {
                    let p = if validate { pattern(me, k, size) } else { fixed.clone() };
                    {
                        let mut s = sent.lock().unwrap_or_else(|e| e.into_inner());
                        s.at.push_back(Instant::now());
                        s.most = s.most.max(s.at.len() as u64);
                    }
                    g.ordered_send_timeout(p, STALL).with_context(|| format!("ordered_send of message {k}"))?;
                    if light {
                        let mut s = sent.lock().unwrap_or_else(|e| e.into_inner());
                        while !s.at.is_empty() && !s.stopped {
                            s = back.wait(s).unwrap_or_else(|e| e.into_inner());
                        }
                    }
                }
                Ok(())
            })
        });
        let mut got = 0u64;
        let mut bytes = 0u64;
        let mut last = t0;
        let mut lat_us = Vec::with_capacity(if sender.is_some() { count as usize } else { 0 });
        let mut order = 0u64;
        let mut per_sender = vec![0u64; n as usize];
        let mut next = vec![0u64; n as usize];
        let mut got_from = vec![0u64; n as usize];
        let mut view_after = f64::NAN;
        let mut error = None;
        while got < expected {
            let ev = match g.recv_timeout(STALL) {
                Ok(Some(ev)) => ev,
                Ok(None) => {
                    error = Some(format!("no delivery for {STALL:?} after {got} of {expected}"));
                    break;
                }
                Err(e) => {
                    error = Some(format!("after {got} of {expected} deliveries: {e}"));
                    break;
                }
            };
            let d = match ev {
                GroupEvent::Message(d) => d,
                GroupEvent::View { view, members } => match failure {
                    // The planned failure: one view without that member.
                    Some(f) if view_after.is_nan() && members.len() as u32 == n - 1 && !members.contains(&f.rank) => {
                        view_after = t0.elapsed().as_secs_f64() - f.at.as_secs_f64();
                        if from.contains(&f.rank) {
                            // Its messages after the cut are gone.
                            expected -= count - got_from[f.rank as usize];
                        }
                        continue;
                    }
                    _ => {
                        error = Some(format!("view {view} installed with {members:?}: a member was lost"));
                        break;
                    }
                },
            };
            let now = Instant::now();
            got += 1;
            got_from[d.sender as usize] += 1;
            bytes += d.payload.len() as u64;
            last = now;
            if d.sender == me {
                if let Some(t) = sent.lock().unwrap_or_else(|e| e.into_inner()).at.pop_front() {
                    lat_us.push(now.duration_since(t).as_secs_f64() * 1e6);
                }
                if light {
                    back.notify_one();
                }
            }
            if validate && error.is_none() {
                let k = next[d.sender as usize];
                next[d.sender as usize] += 1;
                if d.payload.len() != size || d.payload != pattern(d.sender, k, size) {
                    error = Some(format!("message {k} of sender {} is wrong (order or bytes)", d.sender));
                }
                let id = (u64::from(d.sender) << 40) | k;
                order = mix(order, id);
                per_sender[d.sender as usize] = mix(per_sender[d.sender as usize], id);
            }
        }
        if let Some(h) = sender {
            sent.lock().unwrap_or_else(|e| e.into_inner()).stopped = true;
            back.notify_one();
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    error.get_or_insert(format!("{e:#}"));
                }
                Err(_) => {
                    error.get_or_insert("the sending thread panicked".into());
                }
            }
        }
        let secs = last.duration_since(t0).as_secs_f64().max(1e-9);
        let outstanding = sent.lock().unwrap_or_else(|e| e.into_inner()).most;
        Ok(NodeResult { rate: bytes as f64 / secs, lat_us, order, per_sender, error, view_after, outstanding })
    })
}

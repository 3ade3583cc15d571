//! `multirail run -n N -- CMD...`: start N ranks of any program with the
//! environment multirail endpoints need to meet.

use anyhow::Context;

use crate::cli::RunArgs;
use crate::launch::{self, RankEnv};

pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    if args.np == 0 {
        anyhow::bail!("-n must be at least 1");
    }
    let pins = launch::parse_pin(&args.pin, args.np)?;
    let layout = args.layout();
    let placement = crate::testbed::placement(args.testbed, &args.testbed_prefix, args.np, layout)?;
    if let Some(r) = &args.rails {
        let specs = multirail_transport::RailSpec::parse_list(r).map_err(|e| anyhow::anyhow!("--rails {r}: {e}"))?;
        // Interfaces of testbed hosts exist only inside them: each rank
        // resolves its list there.
        if placement.is_none() {
            launch::check_rails(&specs, &format!("--rails {r}"))?;
        }
    } else if placement.is_none() {
        // The ranks read MULTIRAIL_* as the endpoint does: say once what
        // is wrong with them, before starting any.
        let cfg = multirail::Config::from_env()?;
        if let Some(v) = std::env::var("MULTIRAIL_RAILS").ok().filter(|v| !v.trim().is_empty()) {
            launch::check_rails(&cfg.rails, &format!("MULTIRAIL_RAILS={v}"))?;
        }
    }
    let root = match &placement {
        Some(p) => p.root(launch::free_port("127.0.0.1")?),
        None => format!("127.0.0.1:{}", launch::free_port("127.0.0.1")?),
    };
    let key = multirail::generate_key();
    let job = format!("run-{}-{}", std::process::id(), multirail::generate_key());
    let errors = launch::RankErrors::new(&job)?;
    let mut children = Vec::new();
    for rank in 0..args.np {
        let mut env = RankEnv {
            rank,
            size: args.np,
            root: root.clone(),
            key: key.clone(),
            job: job.clone(),
            extra: vec![],
            error_file: Some(errors.path(rank)),
        };
        // Every rank shares this machine's CPUs, the testbed's hosts too.
        env.extra.push(("MULTIRAIL_LOCAL_SIZE".into(), args.np.to_string()));
        let netns = placement.as_ref().map(|p| p.hosts[rank as usize].netns.clone());
        match (&args.rails, &placement) {
            (Some(r), _) => env.extra.push(("MULTIRAIL_RAILS".into(), r.clone())),
            (None, Some(p)) => env.extra.push(("MULTIRAIL_RAILS".into(), p.hosts[rank as usize].rails.clone())),
            (None, None) => {}
        }
        let mut cmd = launch::rank_command(&args.cmd[0], &args.cmd[1..], pins[rank as usize], netns.as_deref());
        env.apply(&mut cmd);
        match cmd.spawn().with_context(|| format!("starting rank {rank}: {}", args.cmd.join(" "))) {
            Ok(c) => children.push((rank, c)),
            Err(e) => {
                launch::kill_all(&mut children);
                return Err(e);
            }
        }
    }
    launch::wait_all(children, &errors)
}

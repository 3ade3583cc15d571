//! OSU's short flags on `multirail bench`, with OSU's meaning: `-m
//! [MIN:]MAX`, `-i`, `-x`, `-W`, `-f`.

use std::process::{Command, Output};

fn multirail(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_multirail"));
    c.args(args).env_remove("MULTIRAIL_RAILS").env_remove("MULTIRAIL_LAUNCHED").env_remove("MULTIRAIL_RANK");
    c
}

fn ok(c: &mut Command) -> Output {
    let o = c.output().expect("multirail runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

fn json_lines(o: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
}

#[test]
fn m_is_up_to_max_from_osus_smallest_and_i_x_w_are_loop_counts() {
    let o = ok(&mut multirail(&["bench", "latency", "-m", "8", "-i", "3", "-x", "1", "--json"]));
    let v = json_lines(&o);
    let sizes: Vec<u64> = v.iter().map(|r| r["size"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [0, 1, 2, 4, 8], "latency tests start at 0, as OSU's");
    assert!(v.iter().all(|r| r["iterations"] == 3 && r["warmup"] == 1), "{v:?}");

    let o = ok(&mut multirail(&["bench", "bw", "-m", "4:16", "-W", "8", "-i", "2", "-x", "1", "--json"]));
    let v = json_lines(&o);
    let sizes: Vec<u64> = v.iter().map(|r| r["size"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [4, 8, 16]);
    assert!(v.iter().all(|r| r["config"]["window"] == 8 && r["iterations"] == 2), "{v:?}");

    let o = ok(&mut multirail(&["bench", "bw", "-m", "8", "-i", "2", "-x", "1", "--json"]));
    let sizes: Vec<u64> = json_lines(&o).iter().map(|r| r["size"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [1, 2, 4, 8], "bandwidth tests start at 1, as OSU's");

    let o = multirail(&["bench", "bw", "-m", "16:8"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("-m 16:8: MIN 16 is above MAX 8"));
    let o = multirail(&["bench", "bw", "-m", "8", "--sizes", "8"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "-m and --sizes are one choice");
}

#[test]
fn f_prints_min_max_iterations_and_percentiles() {
    let o = ok(&mut multirail(&["bench", "latency", "-m", "2:8", "-i", "5", "-x", "1", "-f"]));
    let t = String::from_utf8_lossy(&o.stdout).into_owned();
    let head = t.lines().find(|l| l.starts_with("# Size")).expect("column names");
    for c in
        ["Latency (us)", "Min Latency(us)", "Max Latency(us)", "Iterations", "P50 Tail Lat(us)", "P99 Tail Lat(us)"]
    {
        assert!(head.contains(c), "{c}: {head}");
    }
    let rows: Vec<Vec<f64>> = t
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().map(|x| x.parse().expect("numeric")).collect())
        .collect();
    assert_eq!(rows.len(), 3, "{t}");
    for r in &rows {
        let (avg, min, max, iters) = (r[1], r[2], r[3], r[4]);
        assert_eq!(r.len(), 8, "{t}");
        assert!(min <= avg && avg <= max && iters == 5.0, "{r:?}");
    }
    let o = multirail(&["bench", "bw", "-f"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("-f/--full"), "refused where nothing per message is timed");
}

#[test]
fn help_says_which_osu_flag_each_is() {
    let o = ok(&mut multirail(&["bench", "--help"]));
    let h = String::from_utf8_lossy(&o.stdout);
    for f in ["-m, --message-size", "OSU's -m", "-i, --iterations", "OSU's -i", "-x, --warmup", "OSU's -x"] {
        assert!(h.contains(f), "{f}: {h}");
    }
    for f in ["-W, --window", "OSU's -W", "-f, --full", "OSU's -f"] {
        assert!(h.contains(f), "{f}: {h}");
    }
}

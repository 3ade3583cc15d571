//! CPU time of this process, for the tests and examples that measure how
//! much a waiting rank uses (`tests/idle.rs`, `examples/idle_wait.rs`,
//! which includes this file by path).

/// User + system CPU seconds of this process so far (/proc/self/stat).
pub fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which may hold spaces) start after ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).expect("utime and stime in /proc/self/stat");
    // utime and stime are fields 14 and 15 (11 and 12 after ')'), in
    // USER_HZ: 100 on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

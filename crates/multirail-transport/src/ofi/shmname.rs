//! Names for `ofi:shm` endpoints, and removal of the names a dead process
//! left behind.
//!
//! libfabric 1.17's `shm` provider backs each endpoint with a file in
//! `/dev/shm`, by default named `<pid>:<uid>:<n>` (`n` counts the
//! process's endpoints), created by `fi_enable` and removed by `fi_close`.
//! A process that ends without closing (killed, or with endpoints kept
//! open as [`super::OfiStream`]'s `Drop` does) leaves the file behind. A
//! later process that gets the same pid (`pid_max` is often 32768, so pids
//! come round within one CI run) then fails `fi_enable` with `-FI_EBUSY`
//! (-16): the provider finds the file, sees that its owner pid is alive
//! (it is the new process itself) and refuses it.
//!
//! So multirail names its `shm` endpoints itself, before `fi_enable`
//! (`fi_setname`): `multirail-ofi-<pid>-<start>-<n>`, where `start` is the
//! process's start time (clock ticks since boot, field 22 of
//! `/proc/<pid>/stat`). A name can then only collide with one from the
//! same process. Before opening an endpoint, [`reclaim`] removes every such
//! file whose process is gone: no `/proc/<pid>`, or a process there that
//! started at another time (the pid was reused). Files of other programs,
//! libfabric's default names included, are left alone.

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where `shm_open` keeps its files on Linux.
pub const SHM_DIR: &str = "/dev/shm";

/// Every name multirail gives an `ofi:shm` endpoint starts with this.
pub const PREFIX: &str = "multirail-ofi-";

/// libfabric's `shm` addresses carry this scheme; the file name is what
/// follows it.
const SCHEME: &str = "fi_shm://";

/// The start time of process `pid` (clock ticks after boot), or None when
/// there is no such process.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    start_time_of(&stat)
}

/// Field 22 (`starttime`) of a `/proc/<pid>/stat` line. The command name
/// (field 2) is in parentheses and may hold spaces and parentheses itself,
/// so fields are counted after its last `)`: field 3 is the first there.
fn start_time_of(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(22 - 3)?.parse().ok()
}

/// The owner (pid, start time) written into a name of ours, or None for a
/// name that is not ours.
fn owner_of(file_name: &str) -> Option<(u32, u64)> {
    let mut parts = file_name.strip_prefix(PREFIX)?.split('-');
    let pid = parts.next()?.parse().ok()?;
    let start = parts.next()?.parse().ok()?;
    parts.next()?.parse::<u64>().ok()?;
    parts.next().is_none().then_some((pid, start))
}

/// Numbers this process's `shm` endpoints.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// The file name of this process's `n`th `shm` endpoint.
fn file_name(n: u64) -> String {
    let pid = std::process::id();
    let start = start_time(pid).unwrap_or(0);
    format!("{PREFIX}{pid}-{start}-{n}")
}

/// The file name for this process's next `shm` endpoint.
pub fn next_file_name() -> String {
    file_name(NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The names the next `count` endpoints will get (for tests that make
/// them collide).
#[cfg(test)]
pub(crate) fn upcoming(count: u64) -> Vec<String> {
    let next = NEXT.load(Ordering::Relaxed);
    (next..next + count).map(file_name).collect()
}

/// The endpoint address (`fi_setname`'s argument) for a file name.
pub fn address_of(file_name: &str) -> String {
    format!("{SCHEME}{file_name}")
}

/// Removes from `dir` every file named by [`next_file_name`] whose process
/// is gone, and returns how many it removed. Errors (a file another
/// process removed first, a directory that cannot be read) are not
/// reported: nothing depends on the removal but disk space. Without a
/// readable `/proc` (this process's own start time unknown) nothing can
/// be told gone, and nothing is removed.
///
/// A process in another PID namespace that shares `/dev/shm` (containers
/// of one pod, `--ipc=host`) cannot be seen in `/proc` and would look
/// gone; libfabric's `shm` provider itself assumes the same visibility
/// (it checks `/proc/<pid>` of a region's owner).
pub fn reclaim(dir: &Path) -> usize {
    if start_time(std::process::id()).is_none() {
        return 0;
    }
    let Ok(entries) = fs::read_dir(dir) else { return 0 };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((pid, start)) = name.to_str().and_then(owner_of) else { continue };
        if start_time(pid) != Some(start) && fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Removes the file of an endpoint that will not be used again, while the
/// endpoint stays open: the mappings the two ends already hold stay
/// valid, only the name goes.
pub fn unlink(file_name: &str) {
    let _ = fs::remove_file(Path::new(SHM_DIR).join(file_name));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_field_22_even_after_a_strange_command_name() {
        let fields_3_to_21 = (3..=21).map(|f| f.to_string()).collect::<Vec<_>>().join(" ");
        let line = format!("4242 (a) b (c d) {fields_3_to_21} 987654 23 24\n");
        assert_eq!(start_time_of(&line), Some(987_654));
        assert_eq!(start_time_of("4242 (short) S 1 2"), None);
        assert_eq!(start_time_of("no parenthesis"), None);
    }

    #[test]
    fn this_process_has_a_start_time_and_its_names_are_its_own() {
        let me = std::process::id();
        let start = start_time(me).expect("/proc/self/stat");
        let (a, b) = (next_file_name(), next_file_name());
        assert_ne!(a, b);
        assert_eq!(owner_of(&a), Some((me, start)));
        assert_eq!(address_of(&a), format!("fi_shm://{a}"));
    }

    #[test]
    fn only_names_of_ours_have_an_owner() {
        assert_eq!(owner_of("multirail-ofi-12-345-6"), Some((12, 345)));
        for other in ["12:0:0", "multirail-ofi-12-345", "multirail-ofi-12-345-6-7", "multirail-ofi-x-1-2", "mr-1-2-3"] {
            assert_eq!(owner_of(other), None, "{other}");
        }
    }

    /// The case that failed CI: a file of an earlier process that had this
    /// very pid. It and a file of a pid that does not exist go; this
    /// process's own file and other programs' files stay.
    #[test]
    fn reclaim_removes_the_files_of_gone_processes_only() {
        let dir = std::env::temp_dir().join(format!("multirail-shmname-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let me = std::process::id();
        let start = start_time(me).unwrap();
        // pid_max is at most 2^22, so this pid never exists.
        let gone = [format!("{PREFIX}{me}-{}-0", start + 1), format!("{PREFIX}{}-{start}-3", (1u32 << 22) + 1)];
        let kept = [next_file_name(), format!("{me}:0:0"), "unrelated".to_string()];
        for name in gone.iter().chain(&kept) {
            fs::write(dir.join(name), b"x").unwrap();
        }
        assert_eq!(reclaim(&dir), gone.len());
        for name in &gone {
            assert!(!dir.join(name).exists(), "{name} is still there");
        }
        for name in &kept {
            assert!(dir.join(name).exists(), "{name} was removed");
        }
        assert_eq!(reclaim(&dir), 0, "a second pass finds nothing");
        fs::remove_dir_all(&dir).unwrap();
    }
}

//! Compiling a large workflow in a fresh process spends a third of its time on page faults: the
//! heap it builds (about 20 MB for 10,000 nodes) is touched one 4 KB page at a time, each page a
//! fault. glibc can ask the kernel for transparent huge pages for its heap and grow it in large
//! steps (`glibc.malloc.hugetlb=1`, `glibc.malloc.top_pad`), which turns some 6,600 faults into
//! about 1,200 (both starts together) — but it reads those settings only when a process starts. So
//! a command that is about to compile large files starts itself again with them set (see
//! `docs/benchmarks.md`, 2026-11-28): `validate` of 10,000 nodes takes about 70 % of the time, for
//! 3 MB more at its peak. Small files are not worth the second start, and runs never do this
//! (their peak memory is a target and huge pages only add to it).

use std::path::PathBuf;

/// Below this much workflow text, starting again costs more than the faults it saves.
const FROM_BYTES: u64 = 256 * 1024;

/// What the process is started again with, before any settings of the user's own.
const TUNABLES: &str = "glibc.malloc.hugetlb=1:glibc.malloc.top_pad=33554432";

/// Starts this command again with huge pages for its heap when `files` hold enough text to gain
/// and the kernel grants huge pages on request; returns (doing nothing) otherwise, when that was
/// done already (or the user's own `GLIBC_TUNABLES` chose a `hugetlb` setting), or when starting
/// again fails.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn start_again_for(files: &[PathBuf]) {
    use std::os::unix::process::CommandExt as _;

    let own = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if own.contains("glibc.malloc.hugetlb") {
        return;
    }
    let bytes: u64 = files
        .iter()
        .filter_map(|file| std::fs::metadata(file).ok())
        .map(|metadata| metadata.len())
        .sum();
    if bytes < FROM_BYTES || !huge_pages_on_request() {
        return;
    }
    let Ok(executable) = std::env::current_exe() else {
        return;
    };
    let tunables = if own.is_empty() {
        TUNABLES.to_owned()
    } else {
        format!("{TUNABLES}:{own}")
    };
    let mut args = std::env::args_os();
    let mut command = std::process::Command::new(executable);
    if let Some(name) = args.next() {
        command.arg0(name);
    }
    // Returns only when the new start failed; this process then does the work itself.
    let _ = command.args(args).env("GLIBC_TUNABLES", tunables).exec();
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn start_again_for(_files: &[PathBuf]) {}

/// Whether the kernel gives transparent huge pages to memory that asks for them (`madvise` or
/// `always` chosen in `/sys/kernel/mm/transparent_hugepage/enabled`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn huge_pages_on_request() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|modes| modes.contains("[madvise]") || modes.contains("[always]"))
}

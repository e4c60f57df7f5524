//! `trellis-reap PROGRAM ARGS...`: the reaper an unconfined command runs under, as a program of its
//! own. It is what `trellis __reap` is, without the rest of Trellis: a small executable starts in a
//! fraction of the time the whole of `trellis` takes, once per command a run starts. `trellis` uses it
//! when it is installed beside it, and falls back to `trellis __reap` (see `trellis_process::reaper`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let code = trellis_process::reaper::main(&args);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

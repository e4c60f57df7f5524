//! Links `trellis` and `trellis-reap` with their relative relocations packed (`-z
//! pack-relative-relocs`: a `DT_RELR` table of 16 KB instead of 1.4 MB of `.rela.dyn`), which
//! keeps them position-independent (ASLR) while a start no longer reads a megabyte of relocations
//! into memory: every run's peak resident set is 0.6 – 2 MB lower (a 10,000-stage chain, alternated
//! by hand: 24.7 – 25.1 MB before, 23.6 – 24.1 MB after; docs/benchmarks.md, 2026-12-05 evening).
//! Only where the C library that will load them reads such a table: glibc 2.36 or later, building
//! for the machine that builds (elsewhere nothing changes; a linker too old for the option ignores
//! it with a warning).

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let target = |key: &str| std::env::var(key).unwrap_or_default();
    let native = target("TARGET") == target("HOST");
    if native
        && target("CARGO_CFG_TARGET_OS") == "linux"
        && target("CARGO_CFG_TARGET_ENV") == "gnu"
        && glibc_reads_relr()
    {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether this machine's glibc is 2.36 or later (`getconf GNU_LIBC_VERSION`: `glibc 2.36`).
fn glibc_reads_relr() -> bool {
    let Ok(output) = Command::new("getconf").arg("GNU_LIBC_VERSION").output() else {
        return false;
    };
    let text = String::from_utf8_lossy(&output.stdout);
    let Some(version) = text.trim().strip_prefix("glibc ") else {
        return false;
    };
    let mut parts = version
        .split('.')
        .map(|part| part.parse::<u32>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    (major, minor) >= (2, 36)
}

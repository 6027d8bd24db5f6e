//! What runs an aarch64 program on this machine: qemu-user with the right C library, or
//! nothing on an aarch64 machine. The Pi's tier runs its tests and programs under it, and the
//! packages' programs write their man pages and completions under it.

use std::path::Path;

/// Debian's aarch64 libraries for cross-compiling (libc6-arm64-cross), where the emulator
/// finds the dynamic loader and libc when the machine has no arm64 libc of its own.
const SYSROOT: &str = "/usr/aarch64-linux-gnu";

/// The arm64 dynamic loader of a multiarch libc6:arm64 (which libstd-rust-web-dev:arm64
/// brings).
const MULTIARCH_LOADER: &str = "/lib/ld-linux-aarch64.so.1";

/// The emulator and its arguments, to put before an aarch64 program; empty on an aarch64
/// machine.
pub(crate) fn runner() -> Vec<String> {
    if std::env::consts::ARCH == "aarch64" {
        return Vec::new();
    }
    runner_for(multiarch())
}

/// Whether this machine has a multiarch libc6:arm64 (see [`runner_for`]).
pub(crate) fn multiarch() -> bool {
    Path::new(MULTIARCH_LOADER).exists()
}

/// The emulator's command line. With a multiarch libc6:arm64 it runs programs with that
/// libc and its own loader, found at their usual paths. Pointing it at the cross sysroot
/// (`-L`) then would pair the sysroot's loader with the multiarch libc.so.6 (the loader looks
/// for it where the sysroot has none, and the emulator falls back to the machine's path):
/// two builds of glibc whose shared state differs, and the first thread a program starts
/// spins for ever in pthread_create (seen with Debian 12's 2.36-8cross1 and 2.36-9+deb12u14).
pub(crate) fn runner_for(multiarch: bool) -> Vec<String> {
    let mut r = vec!["qemu-aarch64-static".to_owned()];
    r.extend(library_args(multiarch));
    r
}

/// The emulator's arguments that find an aarch64 program's C library (see [`runner_for`]).
pub(crate) fn library_args(multiarch: bool) -> Vec<String> {
    if multiarch {
        Vec::new()
    } else {
        vec!["-L".to_owned(), SYSROOT.to_owned()]
    }
}

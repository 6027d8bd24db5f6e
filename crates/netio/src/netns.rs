//! Network namespaces, for test beds and tools: move the calling thread into one.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use crate::sys::cvt;

/// Moves the calling thread (only it) into the network namespace that `ip netns add <name>`
/// created. Sockets it opens afterwards live there. Run it on a thread of your own: the thread
/// never comes back to its original namespace.
///
/// # Errors
/// The namespace does not exist, or `setns(2)` is not permitted (needs `CAP_SYS_ADMIN`).
pub fn enter(name: &str) -> io::Result<()> {
    if name.is_empty() || name.contains('/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("invalid namespace name {name:?}"),
        ));
    }
    let file = File::open(format!("/run/netns/{name}"))
        .or_else(|_| File::open(format!("/var/run/netns/{name}")))?;
    // SAFETY: setns(2) with a valid namespace file descriptor that stays open for the call;
    // it only changes the calling thread's namespace.
    cvt(unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) }).map(|_| ())
}

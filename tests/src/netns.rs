//! Running code inside a network namespace from a test process.
//!
//! `setns(CLONE_NEWNET)` moves only the calling thread, so [`in_netns`] runs its closure on
//! a thread made for it alone, which ends with it. Sockets and devices made there stay in
//! that namespace whichever thread uses them after.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Runs `f` on a new thread inside namespace `netns` (a name under `/run/netns`, as
/// `ip netns add` makes) and returns what it returns.
pub fn in_netns<T: Send + 'static>(
    netns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    let path = format!("/run/netns/{netns}");
    std::thread::spawn(move || -> io::Result<T> {
        let ns = File::open(&path).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
        // SAFETY: `ns` is an open namespace file; CLONE_NEWNET moves only this thread.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("setns {path}: {e}")));
        }
        Ok(f())
    })
    .join()
    .map_err(|_| io::Error::other(format!("a thread inside {netns} panicked")))?
}

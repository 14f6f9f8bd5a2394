//! A lossy, slow cable in user space, for kernels built without `sch_netem`.
//!
//! Each end of the cable is a TAP device, made in its own network namespace. Two threads
//! per direction carry Ethernet frames across: a reader drops each frame with probability
//! `loss` and stamps the rest with the time they may leave, `delay` after they arrived; a
//! writer hands them to the other end at that time. That is what `tc netem loss L delay D`
//! on both ends of a cable does: every frame, ARP, TCP segment or acknowledgement, is
//! lost or late independently in each direction, and the kernels' own TCP recovers.
//!
//! The TAP devices exist while the [`Wire`] holds them: dropping it removes them and stops
//! the threads. Their open files also hold their namespaces, so a namespace is deleted for
//! good only once its wire is dropped. The drop decisions come from a seeded
//! generator, so a run loses the same frames of the same traffic.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::netns::in_netns;

/// What a [`Wire`] does to every frame, in each direction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Impairment {
    /// The probability that a frame is dropped, in `[0, 1]`.
    pub loss: f64,
    /// How long each frame that is not dropped is held.
    pub delay: Duration,
}

/// Frames a [`Wire`] has seen so far, both directions together.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WireCounts {
    /// Frames read from either end.
    pub frames: u64,
    /// Frames dropped on purpose.
    pub dropped: u64,
    /// Frames the far end refused (its device down, say): a cable that is unplugged.
    pub refused: u64,
}

impl std::fmt::Display for WireCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of {} frames dropped", self.dropped, self.frames)
    }
}

/// The running tallies behind [`WireCounts`], shared by the relay threads.
#[derive(Debug, Default)]
struct Counters {
    frames: AtomicU64,
    dropped: AtomicU64,
    refused: AtomicU64,
}

/// A running cable between two TAP devices; see the module docs.
#[derive(Debug)]
pub struct Wire {
    stop: Arc<AtomicBool>,
    counts: Arc<Counters>,
    threads: Vec<JoinHandle<()>>,
}

/// The largest frame a TAP device hands over (its MTU plus the Ethernet header, far
/// below this: TAP devices made here take no offloads, so no frame is merged).
const FRAME_MAX: usize = 65_536;

/// How often a blocked reader looks at the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// Opens a new TAP device `dev` in network namespace `netns` (a name under `/run/netns`).
fn open_tap(netns: &str, dev: &str) -> io::Result<OwnedFd> {
    if dev.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "device name {dev:?} is longer than {} bytes",
                libc::IFNAMSIZ - 1
            ),
        ));
    }
    let dev = dev.to_owned();
    in_netns(netns, move || -> io::Result<OwnedFd> {
        let tun = File::options()
            .read(true)
            .write(true)
            .open("/dev/net/tun")
            .map_err(|e| io::Error::new(e.kind(), format!("/dev/net/tun: {e}")))?;
        // SAFETY: an all-zero `ifreq` is a valid value (an empty name, no flags).
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in req.ifr_name.iter_mut().zip(dev.bytes()) {
            *d = s as libc::c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: TUNSETIFF reads and writes one `ifreq`, which `req` is.
        if unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, &mut req) } != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("TUNSETIFF {dev}: {e}")));
        }
        Ok(tun.into())
    })?
}

/// Waits up to [`POLL`] for `fd` to be readable; `Ok(false)` on timeout.
fn readable(fd: &OwnedFd) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid `pollfd`.
    let n = unsafe { libc::poll(&mut p, 1, POLL.as_millis() as libc::c_int) };
    match n {
        0 => Ok(false),
        n if n > 0 && p.revents & libc::POLLIN != 0 => Ok(true),
        n if n > 0 => Err(io::Error::other("the TAP device is gone")),
        _ => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}

impl Wire {
    /// Makes TAP device `a.1` in namespace `a.0` and `b.1` in `b.0`, and carries frames
    /// between them with `imp` in each direction. The devices are down and unaddressed:
    /// the caller configures them with `ip` as it would a veth pair's ends.
    pub fn connect(
        a: (&str, &str),
        b: (&str, &str),
        imp: Impairment,
        seed: u64,
    ) -> io::Result<Self> {
        if !(0.0..=1.0).contains(&imp.loss) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("loss {} is not a probability", imp.loss),
            ));
        }
        let fa = Arc::new(open_tap(a.0, a.1)?);
        let fb = Arc::new(open_tap(b.0, b.1)?);
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counters::default());
        let mut threads = Vec::new();
        for (i, (from, to)) in [(fa.clone(), fb.clone()), (fb, fa)].into_iter().enumerate() {
            let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
            let (stop_r, counts_r, counts_w) = (stop.clone(), counts.clone(), counts.clone());
            let mut rng = StdRng::seed_from_u64(seed.wrapping_add(i as u64));
            threads.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; FRAME_MAX];
                while !stop_r.load(Ordering::Relaxed) {
                    match readable(&from) {
                        Ok(false) => continue,
                        Ok(true) => {}
                        Err(_) => return,
                    }
                    // SAFETY: `buf` is writable for its length.
                    let n =
                        unsafe { libc::read(from.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                    if n < 0 {
                        if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                            continue;
                        }
                        return;
                    }
                    counts_r.frames.fetch_add(1, Ordering::Relaxed);
                    if rng.random_bool(imp.loss) {
                        counts_r.dropped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let frame = buf[..n as usize].to_vec();
                    if tx.send((Instant::now() + imp.delay, frame)).is_err() {
                        return;
                    }
                }
            }));
            // Ends when the reader does (the channel closes), or at a stop, dropping what
            // is still in flight.
            let stop_w = stop.clone();
            threads.push(std::thread::spawn(move || {
                for (due, frame) in rx {
                    if stop_w.load(Ordering::Relaxed) {
                        return;
                    }
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    // SAFETY: `frame` is readable for its length.
                    let n =
                        unsafe { libc::write(to.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
                    if n < 0 {
                        counts_w.refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        Ok(Wire {
            stop,
            counts,
            threads,
        })
    }

    /// What the wire has done so far.
    pub fn counts(&self) -> WireCounts {
        let c = &self.counts;
        WireCounts {
            frames: c.frames.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

//! The child processes of `corvid run` and what this process watches them through: the
//! interrupt count, [`ChildProcess`] (a `corvid` subcommand in its own process group, stopped
//! with SIGTERM then SIGKILL), a free loopback port for a learner, and [`MetricsTail`], which
//! follows a JSONL metrics file a learner appends to and yields its lines as typed records.
//!
//! Children run in their own process groups, so a Ctrl-C at the terminal reaches only this
//! process, which then decides in which order to stop them.

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::marker::PhantomData;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::de::DeserializeOwned;

/// Ctrl-C / SIGTERM count, set by a signal thread.
pub(super) fn interrupts() -> Arc<AtomicU32> {
    let count = Arc::new(AtomicU32::new(0));
    let c = count.clone();
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async move {
            let Ok(mut term) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            else {
                return;
            };
            loop {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
                let n = c.fetch_add(1, Ordering::SeqCst) + 1;
                eprintln!(
                    "\n[run] interrupt {n}: {}",
                    if n == 1 {
                        "stopping training cleanly (Ctrl-C again to skip evaluation)"
                    } else {
                        "evaluation will be skipped"
                    }
                );
            }
        });
    });
    count
}

/// A child process in its own process group, stopped with SIGTERM then SIGKILL; killed when
/// dropped while still running.
pub(super) struct ChildProcess {
    name: String,
    child: Child,
}

impl ChildProcess {
    /// Starts `corvid <args>` logging to `log`. `shares_cores`: other processes of this run
    /// compute at the same time (RL), so OpenMP threads should sleep rather than spin.
    pub(super) fn spawn(
        name: &str,
        args: &[String],
        log: &Path,
        shares_cores: bool,
    ) -> Result<Self> {
        let exe = std::env::current_exe().context("locating the corvid binary")?;
        let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone().context("duplicating a log handle")?;
        let mut cmd = Command::new(&exe);
        // libtorch's OpenMP threads busy-wait after every op: with a learner and actors
        // sharing a few cores that spinning costs 2x or more, while a process alone (SFT)
        // runs ~20% faster spinning than sleeping (BENCHMARKS.md, Model). A policy set by
        // the user wins.
        if std::env::var_os("OMP_WAIT_POLICY").is_none() {
            cmd.env(
                "OMP_WAIT_POLICY",
                if shares_cores { "PASSIVE" } else { "ACTIVE" },
            );
        }
        let child = cmd
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {name} ({})", exe.display()))?;
        Ok(Self {
            name: name.to_string(),
            child,
        })
    }

    /// The name it was started under, for messages.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    pub(super) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The exit status once it has exited.
    pub(super) fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub(super) fn signal(&self, sig: i32) {
        // SAFETY: `kill` has no memory-safety preconditions; the pid is our own child's.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL. Returns whether it exited on its own.
    pub(super) fn stop(&mut self, grace: Duration) -> bool {
        if !self.alive() {
            return true;
        }
        self.signal(libc::SIGTERM);
        let t = Instant::now();
        while t.elapsed() < grace {
            if !self.alive() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!(
            "[run] {} did not stop within {grace:?}; killing it",
            self.name
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if self.alive() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A loopback port no one is listening on now, for a learner to listen on.
pub(super) fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")
        .context("finding a free loopback port")?
        .local_addr()?
        .port())
}

/// Follows a JSONL file that a child appends to, yielding each complete new line as an `R`
/// (`corvid_learner::metrics::UpdateRecord` for `metrics.jsonl`,
/// `corvid_learner::trainer::SftRecord` for `sft.jsonl`). A last line without its newline is
/// still being written and is read once it is complete. A missing file has no lines yet.
pub(super) struct MetricsTail<R> {
    path: PathBuf,
    /// Bytes of the complete lines read so far.
    pos: u64,
    /// Complete lines read so far: the 1-based number of the last one.
    lines: u64,
    record: PhantomData<fn() -> R>,
}

/// A complete line of a metrics file that is not a record of the expected kind.
#[derive(Debug)]
pub(super) struct BadLine {
    pub path: PathBuf,
    /// 1-based line number.
    pub line: u64,
    /// The record type expected, e.g. `UpdateRecord`.
    pub expected: &'static str,
    pub error: serde_json::Error,
}

impl fmt::Display for BadLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} line {}: not a {}: {}",
            self.path.display(),
            self.line,
            self.expected,
            self.error
        )
    }
}

impl std::error::Error for BadLine {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<R: DeserializeOwned> MetricsTail<R> {
    pub(super) fn new(path: PathBuf) -> Self {
        Self {
            path,
            pos: 0,
            lines: 0,
            record: PhantomData,
        }
    }

    /// The complete lines appended since the last call, each as its record or as why it is
    /// not one.
    pub(super) fn read(&mut self) -> Vec<Result<R, BadLine>> {
        let Ok(mut f) = File::open(&self.path) else {
            return Vec::new();
        };
        if f.seek(SeekFrom::Start(self.pos)).is_err() {
            return Vec::new();
        }
        let expected = std::any::type_name::<R>()
            .rsplit("::")
            .next()
            .unwrap_or("record");
        let mut out = Vec::new();
        let mut reader = BufReader::new(f);
        let mut line = Vec::new();
        while let Ok(n) = reader.read_until(b'\n', &mut line) {
            if n == 0 || !line.ends_with(b"\n") {
                break;
            }
            self.pos += n as u64;
            self.lines += 1;
            out.push(serde_json::from_slice(&line).map_err(|error| BadLine {
                path: self.path.clone(),
                line: self.lines,
                expected,
                error,
            }));
            line.clear();
        }
        out
    }

    /// The records appended since the last call; a line that is not one is reported on
    /// stderr, naming the file and the line, and skipped.
    pub(super) fn records(&mut self) -> Vec<R> {
        self.read()
            .into_iter()
            .filter_map(|r| r.map_err(|e| eprintln!("[run] {e}; skipped")).ok())
            .collect()
    }
}

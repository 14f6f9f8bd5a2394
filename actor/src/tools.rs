//! Sandbox workers: each live episode's workspace lives on its own blocking thread.
//!
//! A [`corvid_tasks::Episode`] borrows its environment and task, so it cannot hop between
//! pool threads; instead every episode gets one worker thread that creates the episode,
//! runs its tool calls and its checker one at a time, and reports each result on the
//! engine's channel. The engine thread never waits for a tool: it keeps decoding the other
//! episodes and picks the result up on its next iteration. A panic inside a tool is caught
//! and reported as an infrastructure failure of that episode only.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corvid_proto::{ToolCall, ToolStatus};
use corvid_sandbox::ToolOutput;
use corvid_tasks::{Episode, TaskEnv, TaskInstance, Verdict};

/// A job for an episode's worker.
#[derive(Debug)]
pub(crate) enum Job {
    /// Run one tool call through the task's gate and the sandbox.
    Call(ToolCall),
    /// Judge the final state.
    Check,
}

/// What a worker reports.
#[derive(Debug)]
pub(crate) enum ToolEvent {
    /// The workspace is ready (or could not be created).
    Started(Result<(), String>),
    /// A call returned: its output, the turn's process reward, the time it took, and the
    /// notes file's text after it (when the episode folds with notes and the file exists).
    Called {
        out: ToolOutput,
        process_reward: f64,
        wall: Duration,
        notes: Option<String>,
    },
    /// The checker's verdict and the time it took.
    Checked { verdict: Verdict, wall: Duration },
    /// The worker panicked; the episode cannot go on.
    Crashed(String),
}

/// The handle the engine keeps per episode; dropping it ends the worker after its current
/// job.
#[derive(Debug)]
pub(crate) struct Worker {
    jobs: Sender<Job>,
}

impl Worker {
    /// Starts the worker thread for `task` in `env`, reading the workspace file `notes`
    /// after each call when given. Events arrive on `events` wrapped by `wrap` (which tags
    /// them with the episode's key).
    pub(crate) fn spawn<M: Send + 'static>(
        env: TaskEnv,
        task: Arc<TaskInstance>,
        notes: Option<String>,
        events: Sender<M>,
        wrap: impl Fn(ToolEvent) -> M + Send + 'static,
    ) -> std::io::Result<Self> {
        let (jobs, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name(format!("tools-{}", task.id))
            .spawn(move || worker_main(&env, &task, notes.as_deref(), rx, &events, &wrap))?;
        Ok(Self { jobs })
    }

    /// Queues a job; false if the worker is gone.
    pub(crate) fn send(&self, job: Job) -> bool {
        self.jobs.send(job).is_ok()
    }
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

fn worker_main<M>(
    env: &TaskEnv,
    task: &TaskInstance,
    notes: Option<&str>,
    jobs: Receiver<Job>,
    events: &Sender<M>,
    wrap: &dyn Fn(ToolEvent) -> M,
) {
    let started = std::panic::catch_unwind(AssertUnwindSafe(|| Episode::start(env, task)));
    let mut ep = match started {
        Ok(Ok(ep)) => {
            if events.send(wrap(ToolEvent::Started(Ok(())))).is_err() {
                return;
            }
            ep
        }
        Ok(Err(e)) => {
            let _ = events.send(wrap(ToolEvent::Started(Err(e.to_string()))));
            return;
        }
        Err(p) => {
            let _ = events.send(wrap(ToolEvent::Crashed(panic_text(p))));
            return;
        }
    };
    while let Ok(job) = jobs.recv() {
        let ev = std::panic::catch_unwind(AssertUnwindSafe(|| match job {
            Job::Call(call) => {
                let t0 = Instant::now();
                let out = ep.call(&call);
                let wall = t0.elapsed();
                let process_reward = if out.result.status == ToolStatus::InfraError {
                    0.0
                } else {
                    ep.last_process_reward()
                };
                // A missing or unreadable notes file is no notes (`Workspace::read` refuses a
                // symlink out of the workspace).
                let notes = notes.map(|path| ep.read_file(path).unwrap_or_default());
                ToolEvent::Called {
                    out,
                    process_reward,
                    wall,
                    notes: notes.map(|b| String::from_utf8_lossy(&b).into_owned()),
                }
            }
            Job::Check => {
                let t0 = Instant::now();
                let verdict = ep.check();
                ToolEvent::Checked {
                    verdict,
                    wall: t0.elapsed(),
                }
            }
        }));
        let ev = match ev {
            Ok(ev) => ev,
            Err(p) => {
                let _ = events.send(wrap(ToolEvent::Crashed(panic_text(p))));
                return;
            }
        };
        if events.send(wrap(ev)).is_err() {
            return;
        }
    }
}

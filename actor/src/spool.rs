//! The spool: trajectories on disk until the learner has acknowledged them.
//!
//! ```text
//! <root>/LOCK        pid of the actor using this spool (one actor per spool)
//! <root>/active/     journals of episodes in progress (see crate::journal)
//! <root>/ready/      finished journals waiting to be (re)submitted
//! <root>/rejected/   journals the learner refused as invalid (kept for inspection)
//! ```
//!
//! Every episode is journaled under `active/` while it runs; when the learner acks it the
//! journal is deleted, and when the learner cannot be reached it moves to `ready/`, where
//! the drainer ([`crate::submit::drain_spool`]) picks it up once the learner is back. At
//! start-up [`Spool::recover`] closes the journals a previous actor process left in
//! `active/` (as `abandoned`, with the steps they hold) and moves them to `ready/`: an
//! actor restart loses nothing that reached the disk.

use std::path::{Path, PathBuf};

use crate::error::ActorError;
use crate::journal::{scan, seal_abandoned};

const EXT: &str = "traj";

/// A spool folder, locked for this process.
#[derive(Debug)]
pub struct Spool {
    root: PathBuf,
    active: PathBuf,
    ready: PathBuf,
    rejected: PathBuf,
    lock: PathBuf,
}

/// What [`Spool::recover`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Unfinished journals closed as `abandoned` and queued.
    pub sealed: usize,
    /// Finished journals (footer present) queued.
    pub finished: usize,
    /// Journals without a header, removed: no step of theirs was recorded.
    pub empty: usize,
    /// Journals whose records do not validate, moved to `rejected/`.
    pub rejected: usize,
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

impl Spool {
    /// Opens (creating) the spool at `root` and takes its lock. Fails when another live
    /// process holds it.
    pub fn open(root: &Path) -> Result<Self, ActorError> {
        let s = Self {
            root: root.to_path_buf(),
            active: root.join("active"),
            ready: root.join("ready"),
            rejected: root.join("rejected"),
            lock: root.join("LOCK"),
        };
        for d in [&s.root, &s.active, &s.ready, &s.rejected] {
            std::fs::create_dir_all(d).map_err(ActorError::io(d))?;
        }
        let me = std::process::id();
        if let Ok(text) = std::fs::read_to_string(&s.lock) {
            if let Ok(pid) = text.trim().parse::<u32>() {
                if pid != me && pid_alive(pid) {
                    return Err(ActorError::invalid(
                        "spool",
                        format!(
                            "{} is in use by process {pid}; give each actor its own --spool",
                            root.display()
                        ),
                    ));
                }
            }
        }
        std::fs::write(&s.lock, format!("{me}\n")).map_err(ActorError::io(&s.lock))?;
        Ok(s)
    }

    /// The spool folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the journal of a running episode lives.
    pub fn active_path(&self, trajectory_id: &str) -> PathBuf {
        self.active.join(format!("{trajectory_id}.{EXT}"))
    }

    fn move_into(&self, path: &Path, dir: &Path) -> Result<PathBuf, ActorError> {
        let name = path
            .file_name()
            .ok_or_else(|| ActorError::invalid("journal path", path.display().to_string()))?;
        let to = dir.join(name);
        std::fs::rename(path, &to).map_err(ActorError::io(path))?;
        // Make the rename durable.
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(to)
    }

    /// Queues a finished journal for the drainer.
    pub fn mark_ready(&self, journal: &Path) -> Result<PathBuf, ActorError> {
        self.move_into(journal, &self.ready)
    }

    /// Sets aside a journal the learner refused as invalid.
    pub fn reject(&self, journal: &Path) -> Result<PathBuf, ActorError> {
        self.move_into(journal, &self.rejected)
    }

    fn list(dir: &Path) -> Result<Vec<PathBuf>, ActorError> {
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
        for e in std::fs::read_dir(dir).map_err(ActorError::io(dir))? {
            let e = e.map_err(ActorError::io(dir))?;
            let p = e.path();
            if p.extension().and_then(|x| x.to_str()) != Some(EXT) {
                continue;
            }
            let t = e
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            files.push((t, p));
        }
        files.sort();
        Ok(files.into_iter().map(|(_, p)| p).collect())
    }

    /// Journals waiting for submission, oldest first.
    pub fn ready_files(&self) -> Result<Vec<PathBuf>, ActorError> {
        Self::list(&self.ready)
    }

    /// Journals set aside as invalid.
    pub fn rejected_files(&self) -> Result<Vec<PathBuf>, ActorError> {
        Self::list(&self.rejected)
    }

    /// Closes and queues what a previous process left in `active/`. Call once, before any
    /// episode starts.
    pub fn recover(&self) -> Result<Recovered, ActorError> {
        let mut r = Recovered::default();
        for p in Self::list(&self.active)? {
            let usable = match scan(&p) {
                Ok(s) if s.footer.is_some() => {
                    r.finished += 1;
                    true
                }
                Ok(s) if s.header.is_some() => {
                    seal_abandoned(&p)?;
                    r.sealed += 1;
                    true
                }
                Ok(_) => false,
                Err(ActorError::Journal { why, .. }) => {
                    tracing::warn!(journal = %p.display(), %why, "damaged journal set aside");
                    self.reject(&p)?;
                    r.rejected += 1;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if usable {
                self.mark_ready(&p)?;
            } else {
                std::fs::remove_file(&p).map_err(ActorError::io(&p))?;
                r.empty += 1;
            }
        }
        Ok(r)
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.lock);
    }
}

//! The spool: trajectories on disk until the learner has acknowledged them.
//!
//! ```text
//! <root>/LOCK        pid of the actor using this spool (one actor per spool)
//! <root>/active/     journals of episodes in progress (see crate::journal)
//! <root>/ready/      finished journals waiting to be (re)submitted
//! <root>/rejected/   journals the learner refused as invalid, or that cannot be read
//!                    (kept for inspection)
//! ```
//!
//! Every episode is journaled under `active/` while it runs; when the learner acks it the
//! journal is deleted, and when the learner cannot be reached it moves to `ready/`, where
//! the drainer ([`crate::submit::drain_spool`]) picks it up once the learner is back. At
//! start-up [`Spool::recover`] closes the journals a previous actor process left in
//! `active/` (as `abandoned`, with the steps they hold) and moves them to `ready/`: an
//! actor restart loses nothing that reached the disk. A journal whose records cannot be
//! read as a trajectory (no readable header, a damaged record before the end, or a record
//! that does not validate) is moved to `rejected/` with a warning, bytes intact; only a
//! 0-byte journal is deleted, since nothing of its episode ever reached the disk.

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
    /// 0-byte journals, removed: the actor died between creating the file and the first
    /// flush of its header, so no record of theirs reached the disk.
    pub empty: usize,
    /// Journals that cannot be read as a trajectory (no readable header record, a damaged
    /// record, or a record that does not validate), moved to `rejected/` as they are.
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

    /// `path`'s file name, or an error naming the path.
    fn file_name(path: &Path) -> Result<&std::ffi::OsStr, ActorError> {
        path.file_name()
            .ok_or_else(|| ActorError::invalid("journal path", path.display().to_string()))
    }

    /// Renames `path` to `to` and makes the rename durable.
    fn move_to(path: &Path, to: PathBuf) -> Result<PathBuf, ActorError> {
        std::fs::rename(path, &to).map_err(ActorError::io(path))?;
        // The rename is done either way; a folder whose sync fails may lose it in a power
        // cut, which the operator should hear about (the journal itself is synced).
        let dir = to.parent().unwrap_or(Path::new("."));
        if let Err(e) = corvid_durable::sync_dir(dir) {
            tracing::warn!(folder = %dir.display(), error = %e, "could not sync the spool folder after a rename");
        }
        Ok(to)
    }

    /// Queues a finished journal for the drainer.
    pub fn mark_ready(&self, journal: &Path) -> Result<PathBuf, ActorError> {
        Self::move_to(journal, self.ready.join(Self::file_name(journal)?))
    }

    /// Sets aside a journal the learner refused as invalid (or that cannot be read). A
    /// journal of the same name already in `rejected/` is kept: this one gets a numbered
    /// name (`<name>.1.traj`, …).
    pub fn reject(&self, journal: &Path) -> Result<PathBuf, ActorError> {
        let mut to = self.rejected.join(Self::file_name(journal)?);
        let stem = journal
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut n = 1u32;
        while to.exists() {
            to = self.rejected.join(format!("{stem}.{n}.{EXT}"));
            n += 1;
        }
        Self::move_to(journal, to)
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
    ///
    /// - a finished journal (footer present) goes to `ready/`;
    /// - an unfinished one with a readable header is cut at its torn tail (an incomplete
    ///   last record), closed as `abandoned` and goes to `ready/`;
    /// - one that cannot be read as a trajectory — its first record is short, fails its
    ///   checksum or is not a header; a later record is complete but fails its checksum or
    ///   does not decode (damage, which is not cut: what follows may be intact); or a
    ///   record does not validate — goes to `rejected/` untouched, with a warning naming it
    ///   and why;
    /// - a 0-byte file is deleted: [`crate::journal::JournalWriter::create`] makes the file
    ///   and the header reaches it at the first flush, so an empty file holds nothing.
    pub fn recover(&self) -> Result<Recovered, ActorError> {
        let mut r = Recovered::default();
        for p in Self::list(&self.active)? {
            let len = std::fs::metadata(&p).map_err(ActorError::io(&p))?.len();
            if len == 0 {
                tracing::info!(journal = %p.display(), "removing an empty journal: its episode recorded nothing");
                std::fs::remove_file(&p).map_err(ActorError::io(&p))?;
                r.empty += 1;
                continue;
            }
            match scan(&p) {
                Ok(s) if s.header.is_none() => {
                    let why = match (&s.stopped, s.valid_len) {
                        (Some(stop), 0) => {
                            format!("no header can be read: {stop} (the file has {len} bytes)")
                        }
                        (None, _) => format!(
                            "its {len} bytes are readable records, but none is the trajectory \
                             header"
                        ),
                        (Some(stop), n) => format!(
                            "its first {n} of {len} bytes are readable records, but none is the \
                             trajectory header; then {stop}"
                        ),
                    };
                    self.set_aside(&p, &why)?;
                    r.rejected += 1;
                }
                Ok(s) if s.footer.is_some() => {
                    self.mark_ready(&p)?;
                    r.finished += 1;
                }
                Ok(_) => match seal_abandoned(&p) {
                    Ok(_) => {
                        self.mark_ready(&p)?;
                        r.sealed += 1;
                    }
                    Err(ActorError::Journal { why, .. }) => {
                        self.set_aside(&p, &why)?;
                        r.rejected += 1;
                    }
                    Err(e) => return Err(e),
                },
                Err(ActorError::Journal { why, .. }) => {
                    self.set_aside(&p, &why)?;
                    r.rejected += 1;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(r)
    }

    /// Moves an unreadable journal from `active/` to `rejected/`, as it is, with a warning.
    fn set_aside(&self, journal: &Path, why: &str) -> Result<(), ActorError> {
        let to = self.reject(journal)?;
        tracing::warn!(
            journal = %journal.display(),
            moved_to = %to.display(),
            %why,
            "journal cannot be read as a trajectory; set aside in rejected/ for inspection"
        );
        Ok(())
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.lock);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::JournalWriter;
    use corvid_proto::{synthetic, Termination};

    const SHAPE: synthetic::Shape = synthetic::Shape {
        steps: 2,
        tokens_per_step: 12,
    };

    /// A journal of synthetic trajectory `id` in `dir`: header, steps, and the footer if
    /// `finished`.
    fn journal(dir: &Path, id: &str, finished: bool) -> PathBuf {
        let path = dir.join(format!("{id}.{EXT}"));
        let mut w = JournalWriter::create(&path).unwrap();
        w.header(&synthetic::header(id, "hops", 1, 1)).unwrap();
        for s in synthetic::steps(id, SHAPE) {
            w.step(s).unwrap();
        }
        if finished {
            w.footer(synthetic::footer(id, SHAPE)).unwrap();
        }
        w.sync().unwrap();
        path
    }

    fn names(files: Vec<PathBuf>) -> Vec<String> {
        let mut n: Vec<String> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    }

    #[test]
    fn recovery_sets_unreadable_journals_aside_intact_and_deletes_only_empty_ones() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("spool");
        let active = root.join("active");
        std::fs::create_dir_all(&active).unwrap();

        let finished = journal(&active, "finished", true);
        // The actor died mid-episode, in the middle of appending a record.
        let unfinished = journal(&active, "unfinished", false);
        let torn = std::fs::read(&unfinished).unwrap();
        std::fs::write(&unfinished, &torn[..torn.len() - 5]).unwrap();
        // Random bytes: the first record's length or checksum cannot be right.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let random: Vec<u8> = (0..1000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        std::fs::write(active.join("random.traj"), &random).unwrap();
        // A whole trajectory whose header record is damaged: everything after it is fine.
        let damaged = journal(&active, "damaged-header", true);
        let mut bytes = std::fs::read(&damaged).unwrap();
        bytes[8 + 3] ^= 0x40;
        std::fs::write(&damaged, &bytes).unwrap();
        // A readable header, then a complete step record that fails its checksum, then
        // intact records: damage, not a torn tail, so nothing may be cut.
        let mid = journal(&active, "damaged-step", true);
        let mut mid_bytes = std::fs::read(&mid).unwrap();
        let header_len = 8 + u32::from_le_bytes(mid_bytes[..4].try_into().unwrap()) as usize;
        mid_bytes[header_len + 8 + 2] ^= 0x01;
        std::fs::write(&mid, &mid_bytes).unwrap();
        // Valid records, but no header.
        let steps_only = active.join(format!("steps-only.{EXT}"));
        let mut w = JournalWriter::create(&steps_only).unwrap();
        for s in synthetic::steps("steps-only", SHAPE) {
            w.step(s).unwrap();
        }
        w.sync().unwrap();
        drop(w);
        let steps_only_bytes = std::fs::read(&steps_only).unwrap();
        // Created, then the actor died before the header reached the disk.
        let empty = active.join(format!("empty.{EXT}"));
        drop(JournalWriter::create(&empty).unwrap());
        assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0);

        // What run_actor does at start.
        let spool = Spool::open(&root).unwrap();
        let r = spool.recover().unwrap();
        assert_eq!(
            r,
            Recovered {
                sealed: 1,
                finished: 1,
                empty: 1,
                rejected: 4,
            }
        );
        assert_eq!(names(Spool::list(&active).unwrap()), Vec::<String>::new());
        assert!(!empty.exists() && !finished.exists() && !unfinished.exists());

        let rejected = root.join("rejected");
        assert_eq!(
            names(spool.rejected_files().unwrap()),
            [
                "damaged-header.traj",
                "damaged-step.traj",
                "random.traj",
                "steps-only.traj"
            ]
        );
        assert_eq!(
            std::fs::read(rejected.join("damaged-step.traj")).unwrap(),
            mid_bytes
        );
        assert_eq!(std::fs::read(rejected.join("random.traj")).unwrap(), random);
        assert_eq!(
            std::fs::read(rejected.join("damaged-header.traj")).unwrap(),
            bytes
        );
        assert_eq!(
            std::fs::read(rejected.join("steps-only.traj")).unwrap(),
            steps_only_bytes
        );

        // The good journals are queued: the finished one as it was, the other sealed.
        assert_eq!(
            names(spool.ready_files().unwrap()),
            ["finished.traj", "unfinished.traj"]
        );
        let ready = root.join("ready");
        let f = scan(&ready.join("finished.traj")).unwrap();
        assert_eq!(f.footer, Some(synthetic::footer("finished", SHAPE)));
        let u = scan(&ready.join("unfinished.traj")).unwrap();
        assert_eq!(u.header.unwrap().trajectory_id, "unfinished");
        assert_eq!(u.steps, SHAPE.steps - 1, "the torn step is cut");
        assert_eq!(u.footer.unwrap().termination, Termination::Abandoned);

        // A second start finds nothing more to do and keeps what was set aside.
        let again = spool.recover().unwrap();
        assert_eq!(again, Recovered::default());
        assert_eq!(spool.rejected_files().unwrap().len(), 4);
    }

    #[test]
    fn a_rejected_journal_never_replaces_an_earlier_one_of_the_same_name() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path()).unwrap();
        let active = dir.path().join("active");
        std::fs::write(active.join("t.traj"), b"first").unwrap();
        let a = spool.reject(&active.join("t.traj")).unwrap();
        std::fs::write(active.join("t.traj"), b"second").unwrap();
        let b = spool.reject(&active.join("t.traj")).unwrap();
        assert_ne!(a, b);
        assert_eq!(std::fs::read(&a).unwrap(), b"first");
        assert_eq!(std::fs::read(&b).unwrap(), b"second");
        assert_eq!(
            names(spool.rejected_files().unwrap()),
            ["t.1.traj", "t.traj"]
        );
    }
}

//! corvid-store: the durable trajectory store, on sled 0.34. Commands open it by folder
//! with [`open_existing`] (readers) or [`open_or_create`] (writers). This file is past ~800
//! lines because it is one mechanism, the write path that the guarantees below rest on;
//! readers are in `read.rs`, the tree layout in `keys.rs`, opening by folder in `open.rs`.
//!
//! # Guarantees
//!
//! 1. **Acked ⇒ durable.** [`TrajectoryWriter::finish`] returns only after
//!    `sled::Db::flush` has returned, and sled 0.34 promises that "if this
//!    succeeds, it is guaranteed that all previous writes will be recovered if the
//!    system crashes", and after its route file, if it has one, was fsynced with its
//!    name. The learner acks a trajectory only after `finish` returns.
//! 2. **No half-written trajectory is visible.** Readers ([`TrajectoryStore::get`],
//!    [`TrajectoryStore::steps`], [`TrajectoryStore::list`], export and the trainer's
//!    [`TrajectoryStore::finished_since`]) only ever see trajectories whose record
//!    says `Finished`, and that flag flips in the same sled transaction that writes
//!    the indexes and clears the `open` marker.
//! 3. **Idempotent by id.** Beginning a trajectory whose id is already finished
//!    returns [`Begin::Duplicate`] and writes nothing.
//!
//! # Write path
//!
//! 1. `begin`: insert the record (status `Open`) into `meta` and the id into `open`; with a
//!    route shape of [`ROUTE_FILE_BYTES_PER_TOKEN`] bytes per token or more in the
//!    header, create the trajectory's route file (`routes.rs`).
//! 2. `append_checked` (or `append`, which checks a typed step first): insert each step's
//!    bytes into `steps` under (id, seq) as it arrives, in pieces of at most
//!    [`STEP_PIECE_BYTES`], its `routes` field cut out and appended to the route file;
//!    the stream is never held whole in memory.
//! 3. `finish`: check the footer's totals against what was appended, fsync the route file
//!    (and its name), then one transaction over `meta`, `open`, `by_version`, `by_task`,
//!    `by_status` and `by_seq` flips the record to `Finished` and writes its index entries;
//!    then sled's `flush`, then return. `finish` runs both on tokio's blocking pool, so a
//!    slow disk never stalls the RPC workers.
//!
//! # Writers against flushes
//!
//! sled 0.34 guards every tree operation with one process-wide reader-writer lock:
//! writers (transactions, batches) hold it alone, a flush holds it shared while it
//! waits for log writes. A writer queued behind a running flush blocks every later
//! reader, including other flushes, and when those fill the thread pool that runs
//! sled's log writes, the write the first flush waits for never runs: the whole store
//! deadlocks (sled issue #1301; a demo learner stopped answering RPCs mid-run, and
//! `tests/store.rs` reproduced it). `GATE` orders the two from outside: our flushes
//! share it, our transactions and batches hold it alone, so none of them ever waits
//! inside sled while one of our flushes holds sled's lock, and no flush runs on sled's
//! pool (`flush_async` would put it there).
//!
//! # Recovery rule
//!
//! [`TrajectoryStore::open`] deletes every trajectory still listed in `open`
//! (its steps, its route file and its record): it was never acknowledged, so as far as any
//! client knows it never happened, and the actor resends it under the same id; then every
//! route file whose trajectory is not finished (its open record never reached the disk). A
//! writer dropped without `finish` (a broken stream, a validation error) deletes its
//! partial data at once in the same way.
//!
//! # Damage is refused, not recovered
//!
//! sled recovers a damaged log by cutting it at the first bad entry, which would turn
//! acknowledged trajectories back into partial ones (and the rule above would delete them)
//! or drop them outright. So the store records a lower bound of its finished trajectories
//! in [`FINISHED_FILE`] (after a flush, every `RECORD_EVERY` (64) finishes and when the store
//! is dropped), and `open` refuses a store holding fewer ([`StoreError::Lost`]) before it
//! sweeps anything. A log smaller than recorded is read whole at open: sled can open a
//! cut log with the right count and fail only when a page past the cut is read. A sled
//! panic or corruption while opening a damaged store, and a cut log that does not read
//! whole, are reported as [`StoreError::Damaged`] naming the store.
//!
//! # Trees
//!
//! | tree | key | value |
//! |---|---|---|
//! | `meta` | id | [`TrajectoryRecord`] as JSON |
//! | `steps` | id ‖ 0 ‖ seq (u64 BE) | the step as it arrived (`corvid.v1.Step` bytes), less its `routes` field when the trajectory has a route file, or its first [`STEP_PIECE_BYTES`] |
//! | `steps` | id ‖ 0 ‖ seq ‖ piece (u32 BE) | the step's next pieces, 1, 2, … |
//! | `open` | id | empty: begun, not finished |
//! | `by_version` | policy version (u64 BE) ‖ id | empty |
//! | `by_task` | family ‖ 0 ‖ level (u32 BE) ‖ id | empty |
//! | `by_status` | termination (u8) ‖ success (u8) ‖ id | empty |
//! | `by_seq` | finish order (u64 BE) | id: the trainer's cursor walks this |
//! | `consumed` | id | trainer step (u64 BE) that consumed it |
//!
//! Beside the trees, [`ROUTES_DIR`]`/<id>.routes` holds the routes of a trajectory whose
//! header declares a route shape of [`ROUTE_FILE_BYTES_PER_TOKEN`] bytes per token or more,
//! one checksummed frame per step (`routes.rs`).

#![deny(missing_docs)]

mod keys;
mod open;
mod read;
mod routes;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use corvid_proto::{CheckedStep, ProtoError, Step, StepRules, TrajectoryFooter, TrajectoryHeader};
use serde::{Deserialize, Serialize};
use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};

pub use open::{is_store, open_existing, open_or_create, OpenError};
pub use read::{ExportSummary, Filter, StoreStats};
pub use routes::{FILE_BYTES_PER_TOKEN as ROUTE_FILE_BYTES_PER_TOKEN, ROUTES_DIR};

/// Orders our sled writers against our flushes (see "Writers against flushes"). It is
/// process-wide because sled's lock is.
static GATE: RwLock<()> = RwLock::new(());

/// Held around a transaction or a batch.
fn writer_gate() -> RwLockWriteGuard<'static, ()> {
    GATE.write().unwrap_or_else(PoisonError::into_inner)
}

/// Held around a flush.
fn flush_gate() -> RwLockReadGuard<'static, ()> {
    GATE.read().unwrap_or_else(PoisonError::into_inner)
}

/// The file in the store folder that records how many trajectories were finished and
/// flushed at least (see "Damage is refused, not recovered").
pub const FINISHED_FILE: &str = "corvid-finished.json";

/// Finishes between two records of [`FINISHED_FILE`].
const RECORD_EVERY: u64 = 64;

/// The contents of [`FINISHED_FILE`].
#[derive(Debug, Serialize, Deserialize)]
struct FinishedRecord {
    /// Trajectories finished and flushed when the file was written.
    finished_at_least: u64,
    /// The size of sled's `db` file then. A smaller file at open was cut, and sled's
    /// recovery would cut it further: `open` keeps a copy of it first.
    #[serde(default)]
    db_bytes: u64,
}

/// Largest value the store writes for one step: a longer step is cut into pieces of this
/// size under consecutive keys. sled 0.34 keeps a value over ~128 KiB as a blob whose
/// cache entry counts only its pointer, so such values stay in memory however small the
/// cache: 470 KB steps held +453 MB for 470 MB written, 8 KiB pieces +63–77 MB
/// (docs/bench/raw/sled-value-size.txt).
pub const STEP_PIECE_BYTES: usize = 8 << 10;

/// Page-cache budget handed to sled. Bounds the store's memory no matter how
/// much is ingested (sled's default is 1 GiB).
pub const DEFAULT_CACHE_BYTES: u64 = 64 << 20;

/// How long [`TrajectoryStore::open`] waits for sled's file lock. sled 0.34
/// finishes in-flight log writes on background threads after the last `Db`
/// handle drops, so a store closed a moment ago in this process can still hold
/// its lock briefly; another process that really holds the store is still
/// reported, after this wait.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether sled refused to open a store because another process holds its file lock.
fn is_lock_error(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.to_string().contains("could not acquire lock"))
}

/// The finished count recorded in `path`'s [`FINISHED_FILE`], if there is one.
fn read_finished_record(path: &Path) -> Result<Option<FinishedRecord>> {
    let file = path.join(FINISHED_FILE);
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StoreError::Io {
                what: format!("reading {}", file.display()),
                source,
            })
        }
    };
    let r: FinishedRecord = serde_json::from_str(&text).map_err(|e| StoreError::Io {
        what: format!(
            "reading {} (the store's count of acknowledged trajectories; delete it to open the store without that check)",
            file.display()
        ),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    Ok(Some(r))
}

/// Copies sled's `db` file of the store `path` aside, when it is smaller than `record` says
/// it was: sled's recovery is about to cut it, and the copy keeps what a careful repair
/// could still read. Returns the copy's path.
fn keep_cut_log(path: &Path, record: &FinishedRecord) -> Result<Option<PathBuf>> {
    let db = path.join("db");
    let Ok(meta) = std::fs::metadata(&db) else {
        return Ok(None);
    };
    if meta.len() >= record.db_bytes {
        return Ok(None);
    }
    let copy = path.join(format!("db.cut-{}", now_unix_ms()));
    std::fs::copy(&db, &copy).map_err(|source| StoreError::Io {
        what: format!(
            "keeping a copy of the cut log {} at {}",
            db.display(),
            copy.display()
        ),
        source,
    })?;
    tracing::warn!(
        db = %db.display(),
        bytes = meta.len(),
        recorded = record.db_bytes,
        copy = %copy.display(),
        "the store's log is smaller than when it was last closed; kept a copy before opening it"
    );
    Ok(Some(copy))
}

/// What [`open_sled`] found.
enum Opened {
    /// sled opened the store (or returned an error): the log, the `by_seq` tree and its
    /// length (the finished trajectories).
    Sled(sled::Result<(sled::Db, sled::Tree, u64)>),
    /// sled opened the log, but reading it whole failed (only asked for a cut log).
    Unreadable(sled::Error),
    /// sled panicked; the panic's message.
    Panicked(String),
}

thread_local! {
    /// Where a panic on this thread is reported instead of printed (set by [`open_sled`]).
    static REPORT_PANIC: std::cell::RefCell<Option<std::sync::mpsc::Sender<Opened>>> =
        const { std::cell::RefCell::new(None) };
}

/// Opens sled's log at `path` on a thread of its own. A panic there is sent back as
/// [`Opened::Panicked`] from the panic hook, before unwinding starts, so the caller never
/// waits on the unwinding: dropping a half-recovered sled can hang (a cut-log test did, in
/// a fresh process). That thread is then left to finish or hang on its own.
///
/// `read_all` also reads every record of every tree before answering (see [`read_all`]).
fn open_sled(path: &Path, cache_bytes: u64, read_all: bool) -> Opened {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let reported = REPORT_PANIC.with(|r| {
                r.borrow()
                    .as_ref()
                    .is_some_and(|tx| tx.send(Opened::Panicked(panic_message(info))).is_ok())
            });
            if !reported {
                previous(info);
            }
        }));
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let dir = path.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("store-open".into())
        .spawn(move || {
            REPORT_PANIC.with(|r| *r.borrow_mut() = Some(tx.clone()));
            let opened = match open_db(&dir, cache_bytes) {
                Ok(db) if read_all => match self::read_all(&db) {
                    Ok(()) => Opened::Sled(count_finished(db)),
                    Err(e) => Opened::Unreadable(e),
                },
                r => Opened::Sled(r.and_then(count_finished)),
            };
            REPORT_PANIC.with(|r| *r.borrow_mut() = None);
            let _ = tx.send(opened);
        });
    if let Err(e) = spawned {
        return Opened::Sled(Err(sled::Error::Io(e)));
    }
    // sled's recovery can also hang on a cut log without panicking (a log cut to 90% did, in
    // 2 runs of 3). A healthy log opens far faster than 10 MB/s.
    let log_bytes = std::fs::metadata(path.join("db")).map_or(0, |m| m.len());
    let limit = std::time::Duration::from_secs(20 + log_bytes / (10 << 20));
    match rx.recv_timeout(limit) {
        Ok(opened) => opened,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Opened::Panicked(format!(
            "sled's recovery did not finish in {} s (a healthy log of this size opens in a fraction of that)",
            limit.as_secs()
        )),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            Opened::Panicked("the thread opening it ended without a word".into())
        }
    }
}

/// `db`, its `by_seq` tree and that tree's length (the finished trajectories).
fn count_finished(db: sled::Db) -> sled::Result<(sled::Db, sled::Tree, u64)> {
    let by_seq = db.open_tree("by_seq")?;
    let found = by_seq.len() as u64;
    Ok((db, by_seq, found))
}

/// Reads every key and value of every tree in `db`. sled finds a page it cannot read only
/// when the page is read: a log cut short under a snapshot opens cleanly, with the right
/// count of finished trajectories, and fails (or panics) at the first read of a page that
/// lay past the cut. Reading everything at open turns that into a refusal there.
fn read_all(db: &sled::Db) -> sled::Result<()> {
    for name in db.tree_names() {
        for record in db.open_tree(name)?.iter() {
            record?;
        }
    }
    Ok(())
}

/// A panic's message, without its location.
fn panic_message(info: &std::panic::PanicHookInfo<'_>) -> String {
    let payload = info.payload();
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".into())
}

fn open_db(path: &Path, cache_bytes: u64) -> sled::Result<sled::Db> {
    let started = std::time::Instant::now();
    loop {
        match sled::Config::new()
            .path(path)
            .cache_capacity(cache_bytes)
            .open()
        {
            Err(e) if is_lock_error(&e) && started.elapsed() < LOCK_WAIT => {
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            other => return other,
        }
    }
}

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// sled failed (I/O, corruption).
    #[error("store at {path}: {source}")]
    Sled {
        /// Store directory.
        path: PathBuf,
        /// The sled error.
        #[source]
        source: sled::Error,
    },
    /// A stored value did not decode: the store is corrupt or from another version.
    #[error("store record for trajectory {id:?} is corrupt: {reason}")]
    Corrupt {
        /// Trajectory id.
        id: String,
        /// What failed to decode.
        reason: String,
    },
    /// A submitted part is invalid; nothing of the trajectory is kept.
    #[error("trajectory {id:?}: {reason}")]
    Invalid {
        /// Trajectory id.
        id: String,
        /// What was wrong.
        reason: String,
    },
    /// The blocking task finishing a trajectory panicked or was cancelled (a learner
    /// failure, not bad input: the client may resend).
    #[error("finishing trajectory {id:?} did not complete: {reason}")]
    Interrupted {
        /// Trajectory id.
        id: String,
        /// The task's error.
        reason: String,
    },
    /// Another stream is writing the same id right now.
    #[error("trajectory {id:?} is being written by another stream; retry later")]
    Busy {
        /// Trajectory id.
        id: String,
    },
    /// The store holds fewer finished trajectories than it recorded having acknowledged.
    #[error(
        "store at {}: sled recovered {found} finished trajectories, but at least {expected} were \
         acknowledged ({FINISHED_FILE}): its files are damaged or were truncated (or it is a copy \
         taken while a learner was writing it: copy a stopped store). Restore them from a \
         backup; to open what is left and accept the loss, delete {}",
        path.display(),
        path.join(FINISHED_FILE).display()
    )]
    Lost {
        /// Store directory.
        path: PathBuf,
        /// Finished trajectories recorded.
        expected: u64,
        /// Finished trajectories found.
        found: u64,
    },
    /// sled panicked reading the store's files, or found them corrupt, or could not read a
    /// log that was cut short.
    #[error("store at {}: its files are damaged (sled: {reason}); restore them from a backup", path.display())]
    Damaged {
        /// Store directory.
        path: PathBuf,
        /// What sled said.
        reason: String,
    },
    /// An I/O error outside sled (a route file, export).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl StoreError {
    /// Whether the store could not be opened because another process has it open (sled
    /// allows one).
    pub fn is_locked(&self) -> bool {
        matches!(self, StoreError::Sled { source, .. } if is_lock_error(source))
    }
}

/// Result alias for the store.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Whether a trajectory has been finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordStatus {
    /// Begun, steps may be arriving; invisible to readers.
    Open,
    /// Footer stored and flushed; visible.
    Finished,
}

/// The `meta` value of one trajectory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrajectoryRecord {
    /// The header as submitted.
    pub header: TrajectoryHeader,
    /// Open or finished.
    pub status: RecordStatus,
    /// The footer, once finished.
    pub footer: Option<TrajectoryFooter>,
    /// Position in finish order (the trainer's cursor), once finished.
    pub finish_seq: Option<u64>,
    /// When the store finished it, ms since the Unix epoch.
    pub stored_unix_ms: u64,
    /// Set when it finishes with routes of [`ROUTE_FILE_BYTES_PER_TOKEN`] bytes per token or
    /// more: its steps' routes are then in its route file ([`ROUTES_DIR`]), not in the steps
    /// stored in sled. False for a trajectory without routes, one with smaller routes, one
    /// still open, and one stored before route files.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub routes_in_file: bool,
}

impl TrajectoryRecord {
    fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a record of plain data serialises to JSON")
    }

    fn decode(id: &str, bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
            id: id.to_owned(),
            reason: format!("record: {e}"),
        })
    }
}

/// What [`TrajectoryStore::begin`] found.
// One `Begin` exists per submitted trajectory and is matched at once; boxing the writer
// would add an allocation per trajectory to save stack space nobody holds.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Begin {
    /// A new trajectory: append its steps, then finish.
    New(TrajectoryWriter),
    /// This id is already finished; nothing was written.
    Duplicate(Box<TrajectoryRecord>),
}

/// The trajectory store. Cheap to share behind an [`Arc`]; all methods take `&self`.
pub struct TrajectoryStore {
    path: PathBuf,
    db: sled::Db,
    meta: sled::Tree,
    steps: sled::Tree,
    open: sled::Tree,
    by_version: sled::Tree,
    by_task: sled::Tree,
    by_status: sled::Tree,
    by_seq: sled::Tree,
    consumed: sled::Tree,
    /// Ids with a live writer in this process.
    active: Arc<Mutex<HashSet<String>>>,
    /// Finished trajectories (committed; flushed or not).
    finished: AtomicU64,
    /// The count last written to [`FINISHED_FILE`].
    recorded: AtomicU64,
    /// Held while [`FINISHED_FILE`] is written.
    record_lock: Mutex<()>,
}

impl Drop for TrajectoryStore {
    /// Flushes and records the finished count, so that the next open can tell a damaged
    /// store from this one.
    fn drop(&mut self) {
        let finished = self.finished.load(Ordering::Acquire);
        let recorded = self
            .flush_sync()
            .and_then(|()| self.record_finished(finished, true));
        if let Err(e) = recorded {
            tracing::warn!(path = %self.path.display(), error = %e, "closing the store: could not record its finished count");
        }
    }
}

impl std::fmt::Debug for TrajectoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrajectoryStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl TrajectoryStore {
    /// Opens (or creates) the store in `path` and applies the recovery rule.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with_cache(path, DEFAULT_CACHE_BYTES)
    }

    /// Like [`open`](Self::open) with an explicit sled page-cache budget in bytes.
    pub fn open_with_cache(path: impl AsRef<Path>, cache_bytes: u64) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let sled_err = |source| StoreError::Sled {
            path: path.clone(),
            source,
        };
        let record = read_finished_record(&path)?;
        // A log smaller than when it was last recorded was cut: it is read whole before
        // anything is trusted. An intact log is not, so opening stays quick.
        let cut = match &record {
            Some(r) => keep_cut_log(&path, r)?.map(|_| r.db_bytes),
            None => None,
        };
        let expected = record.map(|r| r.finished_at_least);
        // sled panics on some damage (a zeroed block), and unwinding from such a panic can
        // hang in sled's destructors: `open_sled` reports a panic the moment it happens, from
        // its own thread. The store is built only once the checks pass: a refused one is
        // never flushed.
        let (db, by_seq, found) = match open_sled(&path, cache_bytes, cut.is_some()) {
            Opened::Sled(Err(source @ sled::Error::Corruption { .. })) => {
                return Err(StoreError::Damaged {
                    path,
                    reason: source.to_string(),
                })
            }
            Opened::Sled(r) => r.map_err(sled_err)?,
            Opened::Unreadable(e) => {
                return Err(StoreError::Damaged {
                    reason: format!(
                        "its log was cut (smaller than the {} bytes recorded) and reading it whole failed: {e}",
                        cut.unwrap_or_default()
                    ),
                    path,
                })
            }
            Opened::Panicked(reason) => return Err(StoreError::Damaged { path, reason }),
        };
        if let Some(expected) = expected.filter(|&e| e > found) {
            return Err(StoreError::Lost {
                path,
                expected,
                found,
            });
        }
        let tree = |name: &str| db.open_tree(name).map_err(sled_err);
        let store = Self {
            meta: tree("meta")?,
            steps: tree("steps")?,
            open: tree("open")?,
            by_version: tree("by_version")?,
            by_task: tree("by_task")?,
            by_status: tree("by_status")?,
            by_seq,
            consumed: tree("consumed")?,
            db,
            path: path.clone(),
            active: Arc::default(),
            finished: AtomicU64::new(found),
            recorded: AtomicU64::new(expected.unwrap_or(0)),
            record_lock: Mutex::new(()),
        };
        let swept = store.sweep_open()? + store.sweep_route_files()?;
        if swept > 0 {
            tracing::warn!(
                path = %store.path.display(),
                swept,
                "removed unacknowledged partial trajectories left by a crash"
            );
            store.flush_sync()?;
        }
        Ok(store)
    }

    /// The store directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn sled_err(&self, source: sled::Error) -> StoreError {
        StoreError::Sled {
            path: self.path.clone(),
            source,
        }
    }

    /// Deletes every trajectory in `open` (recovery rule). Returns how many.
    fn sweep_open(&self) -> Result<usize> {
        let ids: Vec<String> = self
            .open
            .iter()
            .keys()
            .map(|k| {
                k.map(|k| String::from_utf8_lossy(&k).into_owned())
                    .map_err(|e| self.sled_err(e))
            })
            .collect::<Result<_>>()?;
        for id in &ids {
            self.purge_partial(id)?;
        }
        Ok(ids.len())
    }

    /// Removes `id`'s route file, if it has one.
    fn remove_route_file(&self, id: &str) -> Result<()> {
        let path = routes::path(&self.path, id);
        match std::fs::remove_file(&path) {
            Err(source) if source.kind() != std::io::ErrorKind::NotFound => Err(StoreError::Io {
                what: format!("removing {}", path.display()),
                source,
            }),
            _ => Ok(()),
        }
    }

    /// Makes the route folder where there is none, and removes the route files of
    /// trajectories that are not finished: a crash can leave one whose open record never
    /// reached the disk. Returns how many it removed.
    fn sweep_route_files(&self) -> Result<usize> {
        let dir = self.path.join(ROUTES_DIR);
        let io = |what: &str, path: &Path| {
            let what = format!("{what} {}", path.display());
            move |source| StoreError::Io { what, source }
        };
        if !dir.is_dir() {
            std::fs::create_dir(&dir).map_err(io("creating", &dir))?;
            corvid_durable::sync_dir(&self.path).map_err(io("syncing", &self.path))?;
            return Ok(0);
        }
        let mut removed = 0;
        for entry in std::fs::read_dir(&dir).map_err(io("listing", &dir))? {
            let name = entry.map_err(io("listing", &dir))?.file_name();
            let Some(id) = name.to_str().and_then(routes::id_of) else {
                continue;
            };
            if self.get(id)?.is_none() {
                self.remove_route_file(id)?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes an unfinished trajectory's route file, steps, record and open marker; a
    /// finished one is left as it is.
    fn purge_partial(&self, id: &str) -> Result<()> {
        // Only the writer that owns `id` (or `open`, before any) purges it, so the record
        // read here is still the record when it is removed below.
        let record = self.record(id)?;
        if record
            .as_ref()
            .is_some_and(|r| r.status == RecordStatus::Finished)
        {
            return Ok(());
        }
        self.remove_route_file(id)?;
        let mut batch = sled::Batch::default();
        for key in self.steps.scan_prefix(keys::step_prefix(id)).keys() {
            batch.remove(key.map_err(|e| self.sled_err(e))?);
        }
        {
            let _gate = writer_gate();
            self.steps
                .apply_batch(batch)
                .map_err(|e| self.sled_err(e))?;
        }
        if record.is_some() {
            self.meta.remove(id).map_err(|e| self.sled_err(e))?;
        }
        self.open.remove(id).map_err(|e| self.sled_err(e))?;
        Ok(())
    }

    /// Starts storing a trajectory, or reports that it is already stored.
    ///
    /// A leftover open trajectory with the same id (a stream that broke earlier)
    /// is discarded first. A trajectory being written right now by another stream
    /// is refused with [`StoreError::Busy`].
    pub fn begin(self: &Arc<Self>, header: TrajectoryHeader) -> Result<Begin> {
        let id = header.trajectory_id.clone();
        // What is stored must read back: a bad id or a NaN sampling parameter (stored as
        // JSON null) would make every later read of the store fail on this record.
        corvid_proto::validate_trajectory_id(&id)
            .and_then(|()| header.sampling.validate())
            .and_then(|()| header.routes.map_or(Ok(()), |r| r.validate()))
            .map_err(|e| StoreError::Invalid {
                id: id.clone(),
                reason: e.to_string(),
            })?;
        if let Some(rec) = self.record(&id)? {
            if rec.status == RecordStatus::Finished {
                return Ok(Begin::Duplicate(Box::new(rec)));
            }
        }
        {
            let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
            if !active.insert(id.clone()) {
                return Err(StoreError::Busy { id });
            }
        }
        // From here on the writer's drop guard owns cleanup of `id`.
        let mut writer = TrajectoryWriter {
            store: Arc::clone(self),
            typed: StepRules::new(header.routes, None),
            header,
            next_seq: 0,
            tokens: 0,
            generated: 0,
            finished: false,
            routes: None,
            broken: false,
        };
        // Re-check under the active lock: a finish may have raced with the check above.
        if let Some(rec) = self.record(&id)? {
            if rec.status == RecordStatus::Finished {
                let mut w = writer;
                w.finished = true; // nothing of ours to clean up
                return Ok(Begin::Duplicate(Box::new(rec)));
            }
            self.purge_partial(&id)?;
        }
        let rec = TrajectoryRecord {
            header: writer.header.clone(),
            status: RecordStatus::Open,
            footer: None,
            finish_seq: None,
            stored_unix_ms: 0,
            routes_in_file: false,
        };
        self.open
            .insert(id.as_bytes(), &[][..])
            .map_err(|e| self.sled_err(e))?;
        self.meta
            .insert(id.as_bytes(), rec.encode())
            .map_err(|e| self.sled_err(e))?;
        if routes::in_file(writer.header.routes) {
            let path = routes::path(&self.path, &id);
            writer.routes = Some(routes::RouteWriter::create(path.clone()).map_err(|source| {
                StoreError::Io {
                    what: format!("creating {}", path.display()),
                    source,
                }
            })?);
        }
        Ok(Begin::New(writer))
    }

    /// Flushes everything written so far to disk (blocking).
    pub fn flush_sync(&self) -> Result<()> {
        // Every finish committed before the flush starts is durable once it returns.
        let finished = self.finished.load(Ordering::Acquire);
        {
            let _gate = flush_gate();
            self.db.flush().map_err(|e| self.sled_err(e))?;
        }
        if finished >= self.recorded.load(Ordering::Relaxed) + RECORD_EVERY {
            self.record_finished(finished, false)?;
        }
        Ok(())
    }

    /// Writes `finished` and the log's size to [`FINISHED_FILE`] (a new file renamed over the
    /// old one) when `finished` is above the recorded count, or `on_close` at all (the log
    /// may have shrunk: sled cuts free segments off its tail). One writer at a time: they
    /// share the temporary file.
    fn record_finished(&self, finished: u64, on_close: bool) -> Result<()> {
        let _one_writer = self
            .record_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let recorded = self.recorded.load(Ordering::Acquire);
        if finished < recorded || (finished == recorded && !on_close) {
            return Ok(());
        }
        let path = self.path.join(FINISHED_FILE);
        let db_bytes = std::fs::metadata(self.path.join("db")).map_or(0, |m| m.len());
        let text = serde_json::to_string(&FinishedRecord {
            finished_at_least: finished,
            db_bytes,
        })
        .expect("a struct of two integers serialises");
        corvid_durable::replace_file(&path, text.as_bytes()).map_err(|source| StoreError::Io {
            what: format!("writing {}", path.display()),
            source,
        })?;
        self.recorded.store(finished, Ordering::Release);
        Ok(())
    }

    /// Raw record of `id`, open or finished (internal; readers use [`get`](Self::get)).
    fn record(&self, id: &str) -> Result<Option<TrajectoryRecord>> {
        match self.meta.get(id).map_err(|e| self.sled_err(e))? {
            Some(bytes) => Ok(Some(TrajectoryRecord::decode(id, &bytes)?)),
            None => Ok(None),
        }
    }

    /// Marks trajectories as consumed by trainer step `step`.
    pub fn mark_consumed<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a str>,
        step: u64,
    ) -> Result<()> {
        let mut batch = sled::Batch::default();
        for id in ids {
            batch.insert(id.as_bytes(), &step.to_be_bytes());
        }
        let _gate = writer_gate();
        self.consumed
            .apply_batch(batch)
            .map_err(|e| self.sled_err(e))
    }

    /// The trainer step that consumed `id`, if any.
    pub fn consumed_at(&self, id: &str) -> Result<Option<u64>> {
        Ok(self
            .consumed
            .get(id)
            .map_err(|e| self.sled_err(e))?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map(u64::from_be_bytes))
    }
}

/// Writes one trajectory. Dropping it without [`finish`](Self::finish) deletes
/// everything it wrote.
#[derive(Debug)]
pub struct TrajectoryWriter {
    store: Arc<TrajectoryStore>,
    header: TrajectoryHeader,
    next_seq: u64,
    tokens: u64,
    generated: u64,
    finished: bool,
    /// The rules typed steps ([`append`](Self::append)) are checked against, in sequence.
    typed: StepRules,
    /// The route file the steps' routes go to, when the header declares a route shape of
    /// [`ROUTE_FILE_BYTES_PER_TOKEN`] bytes per token or more.
    routes: Option<routes::RouteWriter>,
    /// An append failed part-way (a frame written, its step not stored): the trajectory can
    /// only be dropped.
    broken: bool,
}

impl TrajectoryWriter {
    /// The trajectory's id.
    pub fn id(&self) -> &str {
        &self.header.trajectory_id
    }

    /// Steps appended so far (also the next expected seq).
    pub fn steps_appended(&self) -> u64 {
        self.next_seq
    }

    /// Tokens appended so far.
    pub fn tokens_appended(&self) -> u64 {
        self.tokens
    }

    fn invalid(&self, reason: impl Into<String>) -> StoreError {
        StoreError::Invalid {
            id: self.id().to_owned(),
            reason: reason.into(),
        }
    }

    /// The rules every step of this trajectory is checked against, from its first: its
    /// header's route shape, and `vocab_size` when the policy is known.
    pub fn rules(&self, vocab_size: Option<u32>) -> StepRules {
        StepRules::new(self.header.routes, vocab_size)
    }

    /// Checks step `seq` ([`CheckedStep::new`]) and appends it ([`append_checked`]).
    ///
    /// [`append_checked`]: Self::append_checked
    pub fn append(&mut self, seq: u64, step: Step) -> Result<()> {
        let mut rules = self.typed;
        let checked = CheckedStep::new(seq, step, &mut rules)
            .map_err(|e: ProtoError| self.invalid(e.to_string()))?;
        self.typed = rules;
        self.append_checked(seq, checked)
    }

    /// Appends step `seq`, which must be the next in sequence, as its checked bytes: written
    /// at once, in pieces of at most [`STEP_PIECE_BYTES`]; nothing is buffered.
    pub fn append_checked(&mut self, seq: u64, step: CheckedStep) -> Result<()> {
        if self.broken {
            return Err(self.invalid(format!(
                "step chunk seq {seq}: an earlier step failed to store; the trajectory is dropped"
            )));
        }
        if seq != self.next_seq {
            return Err(self.invalid(format!(
                "sequence gap: expected step chunk seq {}, got {seq}",
                self.next_seq
            )));
        }
        if seq >= corvid_proto::limits::MAX_STEPS_PER_TRAJECTORY {
            return Err(self.invalid(format!(
                "more than {} steps",
                corvid_proto::limits::MAX_STEPS_PER_TRAJECTORY
            )));
        }
        if step.rules().routes != self.header.routes {
            return Err(self.invalid(format!(
                "step chunk seq {seq} was checked against route shape {:?}, but the header declares {:?}",
                step.rules().routes,
                self.header.routes
            )));
        }
        // From here a failure leaves a frame or a piece behind: the writer is broken until
        // it is dropped, which removes them.
        self.broken = true;
        // With a route file, the routes go there and the rest of the step to `steps`.
        let joined;
        let bytes = match &mut self.routes {
            Some(file) => {
                let Some((before, routes, after)) = step.split_routes() else {
                    return Err(self.invalid(format!(
                        "step chunk seq {seq}: its bytes are not a corvid.v1.Step"
                    )));
                };
                file.append(seq, routes).map_err(|source| StoreError::Io {
                    what: format!(
                        "writing step chunk seq {seq}'s routes to {}",
                        file.path().display()
                    ),
                    source,
                })?;
                joined = [before, after].concat();
                &joined[..]
            }
            None => step.bytes(),
        };
        // An empty step (no field set) still gets its key.
        let pieces = bytes.chunks(STEP_PIECE_BYTES);
        let pieces = pieces.chain(bytes.is_empty().then_some(&[][..]));
        for (piece, bytes) in pieces.enumerate() {
            let key = match piece {
                0 => keys::step_key(self.id(), seq),
                n => keys::piece_key(self.id(), seq, n as u32),
            };
            self.store
                .steps
                .insert(key, bytes)
                .map_err(|e| self.store.sled_err(e))?;
        }
        self.broken = false;
        self.next_seq += 1;
        self.tokens += step.tokens();
        self.generated += step.generated();
        Ok(())
    }

    /// Checks the footer against what was appended, makes the trajectory visible
    /// and durable, and returns its record. Only after this returns may it be acked.
    /// Runs on tokio's blocking pool.
    pub async fn finish(self, footer: TrajectoryFooter) -> Result<TrajectoryRecord> {
        let id = self.id().to_owned();
        tokio::task::spawn_blocking(move || self.finish_blocking(footer))
            .await
            .map_err(|e| StoreError::Interrupted {
                id,
                reason: e.to_string(),
            })?
    }

    /// Blocking twin of [`finish`](Self::finish), for tools and tests outside async code.
    pub fn finish_blocking(mut self, footer: TrajectoryFooter) -> Result<TrajectoryRecord> {
        let rec = self.commit(footer)?;
        // Committed: from here a failed flush must not purge it (a resend is acked
        // as a duplicate once it is on disk).
        self.finished = true;
        self.store.flush_sync()?;
        Ok(rec)
    }

    /// The transaction of write-path step 3 (everything but the flush).
    fn commit(&mut self, footer: TrajectoryFooter) -> Result<TrajectoryRecord> {
        if self.broken {
            return Err(
                self.invalid("a step failed to store; the trajectory cannot finish".to_owned())
            );
        }
        for (what, claimed, actual) in [
            ("step_count", footer.step_count, self.next_seq),
            ("token_count", footer.token_count, self.tokens),
            (
                "generated_token_count",
                footer.generated_token_count,
                self.generated,
            ),
        ] {
            if claimed != actual {
                return Err(self.invalid(format!(
                    "footer.{what} is {claimed} but {actual} were streamed"
                )));
            }
        }
        // The route file is durable before the record that points at it can be.
        if let Some(file) = &mut self.routes {
            file.sync().map_err(|source| StoreError::Io {
                what: format!("syncing {}", file.path().display()),
                source,
            })?;
        }
        let s = &self.store;
        // The position is drawn under the writer gate, so positions commit in their own
        // order: a reader keeping only the last position it saw (the trainer's cursor)
        // can never step past one that commits later. Positions start at 1 so that
        // cursor 0 means "from the start".
        let _gate = writer_gate();
        let finish_seq = s.db.generate_id().map_err(|e| s.sled_err(e))? + 1;
        let rec = TrajectoryRecord {
            header: self.header.clone(),
            status: RecordStatus::Finished,
            footer: Some(footer),
            finish_seq: Some(finish_seq),
            stored_unix_ms: now_unix_ms(),
            routes_in_file: self.routes.is_some(),
        };
        let id = self.header.trajectory_id.as_bytes();
        let [kv, kt, ks] = keys::index_keys(&self.header, &footer);
        let value = rec.encode();
        (
            &s.meta,
            &s.open,
            &s.by_version,
            &s.by_task,
            &s.by_status,
            &s.by_seq,
        )
            .transaction(|(meta, open, by_version, by_task, by_status, by_seq)| {
                meta.insert(id, value.clone())?;
                open.remove(id)?;
                by_version.insert(kv.clone(), &[][..])?;
                by_task.insert(kt.clone(), &[][..])?;
                by_status.insert(ks.clone(), &[][..])?;
                by_seq.insert(&finish_seq.to_be_bytes(), id)?;
                Ok::<_, ConflictableTransactionError<()>>(())
            })
            .map_err(|e| match e {
                TransactionError::Storage(e) => s.sled_err(e),
                TransactionError::Abort(()) => s.sled_err(sled::Error::Unsupported(
                    "finish transaction aborted".into(),
                )),
            })?;
        s.finished.fetch_add(1, Ordering::AcqRel);
        Ok(rec)
    }
}

impl Drop for TrajectoryWriter {
    fn drop(&mut self) {
        // Nothing buffered may reach the file after it is removed and the id is free again.
        if let Some(file) = self.routes.take() {
            file.discard();
        }
        let id = self.header.trajectory_id.clone();
        if !self.finished {
            if let Err(e) = self.store.purge_partial(&id) {
                // The recovery rule removes it at the next open.
                tracing::error!(trajectory = %id, error = %e, "could not remove partial trajectory");
            }
        }
        let mut active = self.store.active.lock().unwrap_or_else(|p| p.into_inner());
        active.remove(&id);
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

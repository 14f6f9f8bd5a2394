//! Where an evaluation's episodes go as they are decoded: into the trajectory store (so
//! `corvid replay` can show, export and re-score them) and, whole, into memory for the
//! figures.
//!
//! The rollout engine's [`TrajectorySink`] methods return nothing, so a store error is kept
//! (the first one) and read back once the batch has run.

use std::collections::HashMap;
use std::sync::Arc;

use corvid_actor::{CollectSink, TrajectorySink};
use corvid_proto::{Step, Trajectory, TrajectoryFooter, TrajectoryHeader};
use corvid_store::{Begin, TrajectoryStore, TrajectoryWriter};

/// Writes every trajectory into the store as it grows.
struct StoreSink {
    store: Arc<TrajectoryStore>,
    /// Open writers by trajectory id, with the sequence number of the next step.
    open: HashMap<String, (TrajectoryWriter, u64)>,
    error: Option<anyhow::Error>,
    /// Episodes already stored (under an id checked to be free before the run: another
    /// evaluation in this process stored them meanwhile).
    duplicates: usize,
}

impl StoreSink {
    fn fail(&mut self, e: anyhow::Error) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }
}

impl TrajectorySink for StoreSink {
    fn header(&mut self, header: &TrajectoryHeader) {
        match self.store.begin(header.clone()) {
            Ok(Begin::New(w)) => {
                self.open.insert(header.trajectory_id.clone(), (w, 0));
            }
            Ok(_) => self.duplicates += 1,
            Err(e) => self.fail(anyhow::Error::new(e).context("storing an eval episode")),
        }
    }
    fn step(&mut self, id: &str, step: Step) {
        if let Some((w, seq)) = self.open.get_mut(id) {
            let r = w.append(*seq, step);
            *seq += 1;
            if let Err(e) = r {
                self.fail(anyhow::Error::new(e).context("storing an eval step"));
            }
        }
    }
    fn footer(&mut self, id: &str, footer: TrajectoryFooter) {
        if let Some((w, _)) = self.open.remove(id) {
            if let Err(e) = w.finish_blocking(footer) {
                self.fail(anyhow::Error::new(e).context("finishing an eval episode"));
            }
        }
    }
}

/// A sink that stores every episode and also keeps the finished ones whole for the metrics.
pub(crate) struct EvalSink {
    store: StoreSink,
    collect: CollectSink,
}

/// What an [`EvalSink`] holds once its batch has run.
pub(crate) struct Collected {
    /// Finished trajectories, in the order they finished.
    pub finished: Vec<Trajectory>,
    /// The first error storing an episode, if any.
    pub error: Option<anyhow::Error>,
    /// Episodes whose id the store already held when they began (not written again).
    pub duplicates: usize,
}

impl EvalSink {
    /// A sink writing into `store`.
    pub fn new(store: Arc<TrajectoryStore>) -> Self {
        Self {
            store: StoreSink {
                store,
                open: HashMap::new(),
                error: None,
                duplicates: 0,
            },
            collect: CollectSink::default(),
        }
    }

    /// The finished trajectories and what went wrong storing them.
    pub fn into_collected(self) -> Collected {
        Collected {
            finished: self.collect.finished,
            error: self.store.error,
            duplicates: self.store.duplicates,
        }
    }
}

impl TrajectorySink for EvalSink {
    fn header(&mut self, h: &TrajectoryHeader) {
        self.store.header(h);
        self.collect.header(h);
    }
    fn step(&mut self, id: &str, step: Step) {
        self.collect.step(id, step.clone());
        self.store.step(id, step);
    }
    fn footer(&mut self, id: &str, f: TrajectoryFooter) {
        self.store.footer(id, f);
        self.collect.footer(id, f);
    }
}

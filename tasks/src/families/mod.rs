//! The built-in families: `hops`, `search`, `shell` and `keychain`.
//!
//! All four share one length schedule for levels 1–8 (`keychain` goes on to level 12): the main chain of level `L` needs
//! [`CHAIN_CALLS`]`[L−1]` tool calls (1, 2, 3, 4, 6, 8, 11, 16 — roughly ×1.5 per level),
//! and from [`RECOVERY_FROM`] up the oracle adds one recoverable failure (a call that
//! fails, then the fix), so demonstrations teach recovery.

mod hops;
mod keychain;
mod search;
pub mod shell;

pub use hops::Hops;
pub use keychain::Keychain;
pub use search::Search;
pub use shell::Shell;

use std::collections::BTreeMap;

use corvid_proto::ToolStatus;

use crate::error::TasksError;
use crate::sim::Simulator;
use crate::task::{Document, OracleStep, TaskFamily};

/// Main-chain tool calls per level (index = level − 1).
pub const CHAIN_CALLS: [usize; 8] = [1, 2, 3, 4, 6, 8, 11, 16];

/// The first level whose oracle includes a recoverable failure.
pub const RECOVERY_FROM: u32 = 4;

/// Every built-in family.
pub fn builtin_families() -> Vec<Box<dyn TaskFamily>> {
    vec![
        Box::new(Hops),
        Box::new(Search),
        Box::new(Shell),
        Box::new(Keychain),
    ]
}

/// The names of the built-in families, in [`builtin_families`] order.
pub fn builtin_names() -> Vec<String> {
    builtin_families()
        .iter()
        .map(|f| f.name().to_string())
        .collect()
}

/// The built-in family called `name`.
pub fn builtin_family(name: &str) -> Result<Box<dyn TaskFamily>, TasksError> {
    builtin_families()
        .into_iter()
        .find(|f| f.name() == name)
        .ok_or_else(|| TasksError::UnknownFamily {
            name: name.to_string(),
            known: builtin_names().join(", "),
        })
}

/// Builds oracle steps by running each call in the reference simulator, so that the
/// recorded outputs are exactly what the files produce.
pub(crate) struct PlanBuilder<'a> {
    sim: Simulator<'a>,
    steps: Vec<OracleStep>,
}

impl<'a> PlanBuilder<'a> {
    pub(crate) fn new(files: &BTreeMap<String, Vec<u8>>, corpus: &'a [Document]) -> Self {
        Self {
            sim: Simulator::new(files.clone(), corpus),
            steps: Vec::new(),
        }
    }

    /// Adds a call and returns its output.
    pub(crate) fn call(&mut self, name: &str, arguments: serde_json::Value) -> String {
        let (expect, output) = self.sim.call(name, &arguments);
        self.steps.push(OracleStep {
            name: name.to_string(),
            arguments,
            expect,
            output: output.clone(),
        });
        output
    }

    /// Adds a call to a tool the simulator cannot run (a pack's own WASI tool): it is
    /// expected to succeed and its output is known only from the real sandbox. The
    /// simulated workspace does not see anything the tool writes.
    pub(crate) fn external(&mut self, name: &str, arguments: serde_json::Value) {
        self.steps.push(OracleStep {
            name: name.to_string(),
            arguments,
            expect: ToolStatus::Ok,
            output: String::new(),
        });
    }

    pub(crate) fn last_status(&self) -> ToolStatus {
        self.steps
            .last()
            .map(|s| s.expect)
            .unwrap_or(ToolStatus::Ok)
    }

    pub(crate) fn finish(self) -> Vec<OracleStep> {
        self.steps
    }
}

/// Filler text of about `bytes` bytes, in lines of a few pseudo-words, none of which
/// contains `next:`, `value:` or an upper-case word (so it never collides with a marker).
pub(crate) fn filler(rng: &mut crate::rng::SplitMix64, bytes: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut total = 0;
    while total < bytes {
        let n = rng.range(3, 7) as usize;
        let line: Vec<String> = (0..n)
            .map(|_| {
                let len = rng.range(2, 8) as usize;
                rng.word(len)
                    .chars()
                    .filter(|c| c.is_ascii_lowercase())
                    .collect::<String>()
            })
            .filter(|w| !w.is_empty())
            .collect();
        let line = line.join(" ");
        total += line.len() + 1;
        lines.push(line);
    }
    lines
}

/// A context budget comfortably above the oracle's tokens: twice, rounded up to 1024.
pub(crate) fn budget_for(tokens: usize) -> u32 {
    (((tokens * 2).div_ceil(1024)).max(1) * 1024) as u32
}

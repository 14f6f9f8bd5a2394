//! Corvid task families, task packs, oracles, checkers, process-reward rules and the
//! curriculum.
//!
//! # Brief overview
//!
//! - [`TaskFamily`] generates a [`TaskInstance`] for a level and a seed, deterministically:
//!   prompt, initial files, tools with limits, a [`Checker`], [`ProcessRule`]s and an
//!   [`OraclePlan`] (the calls a correct agent makes). The built-in families are
//!   [`Hops`], [`Search`], [`Shell`], the log-reading [`Keychain`], [`Ledger`], [`Needles`]
//!   and [`Recall`], and the code families [`PyFix`] and [`PyData`] (their episodes run
//!   Python in the sandbox); a [`TaskPack`] is a family written in TOML.
//! - [`Checker::check`] judges an answer and a final workspace; [`score_turns`] gives each
//!   turn its process reward.
//! - [`Curriculum`] keeps each family's frontier level, promotes and demotes it, samples
//!   levels and sets the context-window stage; its state is serialisable.
//! - [`Simulator`] replays tool calls over an in-memory workspace, for tests and previews.
//!
//! ```
//! use corvid_tasks::{builtin_family, Simulator, TasksError};
//! let hops = builtin_family("hops")?;
//! let task = hops.instance(3, 7)?;
//! assert_eq!(task, hops.instance(3, 7)?); // same seed, same task
//! let mut sim = Simulator::new(task.files.clone(), &task.read_only.corpus);
//! for step in &task.oracle.steps {
//!     sim.call(&step.name, &step.arguments);
//! }
//! assert!(task.checker.check(Some(&task.oracle.answer), &sim.files).passed());
//! # Ok::<(), TasksError>(())
//! ```
#![deny(missing_docs)]

mod checker;
pub mod curriculum;
mod env;
mod error;
mod families;
mod pack;
mod process;
mod registry;
mod rng;
mod sim;
mod task;

pub use checker::{Checker, FileExpectation, Verdict};
pub use curriculum::{ContextStage, Curriculum, CurriculumConfig, FamilyProgress, LevelChange};
pub use env::{Episode, TaskEnv};
pub use error::TasksError;
pub use families::{
    builtin_families, builtin_family, builtin_names, shell, Hops, Keychain, Ledger, Needles,
    PyData, PyFix, Recall, Search, Shell, CHAIN_CALLS, RECOVERY_FROM,
};
pub use pack::{load_pack, PackDiagnostic, TaskPack};
pub use process::{paths_read, score_turns, ProcessRule, ScoredTurn};
pub use registry::Families;
pub use rng::SplitMix64;
pub use sim::Simulator;
pub use task::{
    CustomToolDecl, Document, FactLayout, OraclePlan, OracleStep, ReadOnlyData, TaskFamily,
    TaskInstance, ToolLimits, ToolSpec, KNOWN_TOOLS,
};

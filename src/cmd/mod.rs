//! One module per subcommand: its `Args` and its `run`.

pub mod actor;
pub mod eval;
pub mod learner;
pub mod model;
pub mod replay;
pub mod report;
pub mod run;
pub mod sandbox;
pub mod tasks;

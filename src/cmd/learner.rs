//! `corvid learner`: serve tasks and weights to actors, ingest trajectories and train.

use std::process::ExitCode;

use clap::Args;

/// serve tasks and weights to actors, ingest trajectories and train.
#[derive(Args, Debug)]
#[command(after_help = "Example:
  corvid learner --config configs/demo.toml --listen 127.0.0.1:50051 --run-dir runs/demo")]
pub struct LearnerArgs {
    /// Arguments, defined when this command lands.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

/// Runs the command.
pub fn run(_args: LearnerArgs) -> anyhow::Result<ExitCode> {
    super::not_yet("learner", "the learner issue")
}

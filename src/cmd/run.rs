//! `corvid run`: train an agent end to end: a learner and K actor processes, SFT then RL, evaluation and a report.

use std::process::ExitCode;

use clap::Args;

/// train an agent end to end: a learner and K actor processes, SFT then RL, evaluation and a report.
#[derive(Args, Debug)]
#[command(after_help = "Example:
  corvid run --config configs/demo.toml")]
pub struct RunArgs {
    /// Arguments, defined when this command lands.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

/// Runs the command.
pub fn run(_args: RunArgs) -> anyhow::Result<ExitCode> {
    super::not_yet("run", "the end-to-end issue")
}

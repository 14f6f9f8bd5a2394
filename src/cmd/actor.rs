//! `corvid actor`: roll out episodes against sandboxed tools and stream them to a learner.

use std::process::ExitCode;

use clap::Args;

/// roll out episodes against sandboxed tools and stream them to a learner.
#[derive(Args, Debug)]
#[command(after_help = "Example:
  corvid actor --learner http://127.0.0.1:50051 --token-file runs/demo/token --concurrency 8")]
pub struct ActorArgs {
    /// Arguments, defined when this command lands.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

/// Runs the command.
pub fn run(_args: ActorArgs) -> anyhow::Result<ExitCode> {
    super::not_yet("actor", "the actor issue")
}

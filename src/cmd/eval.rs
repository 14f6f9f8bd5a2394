//! `corvid eval`: evaluate a checkpoint on held-out tasks.

use std::process::ExitCode;

use clap::Args;

/// evaluate a checkpoint on held-out tasks.
#[derive(Args, Debug)]
#[command(after_help = "Example:
  corvid eval --checkpoint runs/demo/ckpt/latest --family hops --levels 1..4 --episodes 200 --k 4 --json")]
pub struct EvalArgs {
    /// Arguments, defined when this command lands.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

/// Runs the command.
pub fn run(_args: EvalArgs) -> anyhow::Result<ExitCode> {
    super::not_yet("eval", "the end-to-end issue")
}

//! `corvid tasks`: list, show, sample and validate task families and task packs.

use std::process::ExitCode;

use clap::Args;

/// list, show, sample and validate task families and task packs.
#[derive(Args, Debug)]
#[command(after_help = "Example:
  corvid tasks sample --family hops --level 8 --seed 1 --oracle")]
pub struct TasksArgs {
    /// Arguments, defined when this command lands.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

/// Runs the command.
pub fn run(_args: TasksArgs) -> anyhow::Result<ExitCode> {
    super::not_yet("tasks", "the tasks issue")
}

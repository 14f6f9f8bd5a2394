//! `corvid sandbox`: run tools in the sandbox exactly as the policy would.

use std::process::ExitCode;

use clap::Args;

/// run tools in the sandbox exactly as the policy would.
#[derive(Args, Debug)]
#[command(after_help = "Example:
  corvid sandbox exec --workspace /tmp/ws -- 'grep -c needle *.txt'")]
pub struct SandboxArgs {
    /// Arguments, defined when this command lands.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

/// Runs the command.
pub fn run(_args: SandboxArgs) -> anyhow::Result<ExitCode> {
    super::not_yet("sandbox", "the sandbox issue")
}

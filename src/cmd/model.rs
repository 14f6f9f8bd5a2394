//! `corvid model`: inspect model presets: parameters, FLOPs and cache size per token.

use std::process::ExitCode;

use clap::Args;

/// inspect model presets: parameters, FLOPs and cache size per token.
#[derive(Args, Debug)]
#[command(after_help = "Example:
  corvid model info --preset tiny")]
pub struct ModelArgs {
    /// Arguments, defined when this command lands.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

/// Runs the command.
pub fn run(_args: ModelArgs) -> anyhow::Result<ExitCode> {
    super::not_yet("model", "the model issue")
}

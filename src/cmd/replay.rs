//! `corvid replay`
use std::process::ExitCode;
use clap::Args;
/// List, show and export stored trajectories.
#[derive(Args, Debug)]
#[command(after_help = "Example:\n  corvid replay list --store runs/demo/store")]
pub struct ReplayArgs {}
/// Runs the command.
pub fn run(_args: ReplayArgs) -> anyhow::Result<ExitCode> { crate::cmd::not_yet("replay", "foundation") }

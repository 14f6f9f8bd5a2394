//! `corvid bench rollout`: actor rollout throughput at several concurrencies.

use std::process::ExitCode;

use clap::Args;

/// actor rollout throughput at several concurrencies.
#[derive(Args, Debug)]
pub struct RolloutBenchArgs {
    /// Arguments, defined when this benchmark lands.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

/// Runs the benchmark.
pub fn run(_args: RolloutBenchArgs) -> anyhow::Result<ExitCode> {
    crate::cmd::not_yet("bench rollout", "the actor issue")
}

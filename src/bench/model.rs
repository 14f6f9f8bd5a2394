//! `corvid bench model`: model cache size, cached decode and training throughput, against PyTorch eager.

use std::process::ExitCode;

use clap::Args;

/// model cache size, cached decode and training throughput, against PyTorch eager.
#[derive(Args, Debug)]
pub struct ModelBenchArgs {
    /// Arguments, defined when this benchmark lands.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

/// Runs the benchmark.
pub fn run(_args: ModelBenchArgs) -> anyhow::Result<ExitCode> {
    crate::cmd::not_yet("bench model", "the model issue")
}

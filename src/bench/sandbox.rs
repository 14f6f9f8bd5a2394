//! `corvid bench sandbox`: sandboxed tool-call latency and throughput, against spawning a native process.

use std::process::ExitCode;

use clap::Args;

/// sandboxed tool-call latency and throughput, against spawning a native process.
#[derive(Args, Debug)]
pub struct SandboxBenchArgs {
    /// Arguments, defined when this benchmark lands.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

/// Runs the benchmark.
pub fn run(_args: SandboxBenchArgs) -> anyhow::Result<ExitCode> {
    crate::cmd::not_yet("bench sandbox", "the sandbox issue")
}

//! `corvid bench ingest`
use std::process::ExitCode;
use clap::Args;
/// Ingest benchmark.
#[derive(Args, Debug)]
pub struct IngestArgs {}
/// Runs the benchmark.
pub fn run(_args: IngestArgs) -> anyhow::Result<ExitCode> { crate::cmd::not_yet("bench ingest", "foundation") }

//! `corvid bench`: benchmarks that print one JSON object each with `--json`.
//!
//! Every benchmark measures its baseline in the same run and reports a ratio,
//! because these machines are noisy. Results and commands are recorded in
//! `BENCHMARKS.md`.

use std::process::ExitCode;

use clap::{Args, Subcommand};

pub mod fleet;
pub mod gpu;
pub mod hf;
pub mod ingest;
pub mod long;
pub mod model;
pub mod rollout;
pub mod sandbox;

/// Benchmarks; each prints one JSON object with --json.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  corvid bench ingest --tokens 1000000 --json
  corvid bench fleet serve --store /tmp/fleet-store --listen 0.0.0.0:50051 --expect 2048 --json
  corvid bench fleet send --learner http://10.77.0.1:50051 --name a1 --streams 32 --json
  corvid bench sandbox --json
  corvid bench model --json
  corvid bench hf --model path/to/hf-folder --json
  corvid bench long --preset tiny --tokens 4096,65536 --checkpoint blocks --json
  corvid bench gpu --json --out gpu.json")]
pub struct BenchArgs {
    #[command(subcommand)]
    which: Bench,
}

#[derive(Subcommand, Debug)]
enum Bench {
    /// Stream a synthetic trajectory over loopback gRPC into a fresh store, against raw sled.
    Ingest(ingest::IngestArgs),
    /// Many concurrent actor streams from other hosts into one learner: `serve` on the
    /// learner's host, `send` on each actor host (scripts/bench_fleet.sh runs both).
    Fleet(fleet::FleetArgs),
    /// Sandboxed tool-call latency and throughput, against spawning a native process.
    Sandbox(sandbox::SandboxBenchArgs),
    /// Model cache size, cached decode and training throughput, against PyTorch eager.
    Model(model::ModelBenchArgs),
    /// Training and greedy-decoding throughput of a Hugging Face folder (beside transformers:
    /// scripts/bench_hf.py).
    Hf(hf::HfBenchArgs),
    /// One training forward + backward of a single long trajectory per length: time, tokens/s,
    /// peak memory (beside transformers: scripts/bench_long.py).
    Long(long::LongBenchArgs),
    /// Actor rollout throughput at several concurrencies.
    Rollout(rollout::RolloutBenchArgs),
    /// CUDA kernels' correctness, attention / MoE / decode / train-step speed on one GPU.
    Gpu(gpu::GpuBenchArgs),
}

/// Runs the selected benchmark.
pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    match args.which {
        Bench::Ingest(a) => ingest::run(a),
        Bench::Fleet(a) => fleet::run(a),
        Bench::Sandbox(a) => sandbox::run(a),
        Bench::Model(a) => model::run(a),
        Bench::Hf(a) => hf::run(a),
        Bench::Long(a) => long::run(a),
        Bench::Rollout(a) => rollout::run(a),
        Bench::Gpu(a) => gpu::run(a),
    }
}

/// Peak resident set size of this process since the last [`reset_peak_rss`], in bytes.
///
/// Reads `VmHWM` from `/proc/self/status` (Linux); `None` elsewhere.
pub fn peak_rss_bytes() -> Option<u64> {
    proc_status_kb("VmHWM:").map(|kb| kb * 1024)
}

/// Current resident set size, in bytes (`VmRSS`).
pub fn rss_bytes() -> Option<u64> {
    proc_status_kb("VmRSS:").map(|kb| kb * 1024)
}

/// CPU time this process has used, user and system, all threads, in seconds.
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes one rusage into the zeroed struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return f64::NAN;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// Resets the peak-RSS counter (writes 5 to `/proc/self/clear_refs`); best effort.
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn proc_status_kb(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

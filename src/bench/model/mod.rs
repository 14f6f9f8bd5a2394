//! `corvid bench model`: model cache size, cached decode and training throughput, against PyTorch eager.

use std::process::{Command, ExitCode};

use anyhow::Context;
use clap::Args;
mod measure;

use self::measure::{decode_throughput, set_num_threads, train_throughput};
use corvid_model::ModelConfig;

/// model cache size, cached decode and training throughput, against PyTorch eager.
#[derive(Args, Debug)]
#[command(after_help = "Example:
  corvid bench model --json
  corvid bench model --threads 2 --steps 5 --context 4096 --json")]
pub struct ModelBenchArgs {
    /// Intra-op threads for both Rust (tch) and the PyTorch baseline.
    #[arg(long, default_value_t = 2)]
    threads: i32,
    /// Timed training steps per preset.
    #[arg(long, default_value_t = 5)]
    steps: usize,
    /// Batch rows for training.
    #[arg(long, default_value_t = 16)]
    batch: i64,
    /// Sequence length for training.
    #[arg(long, default_value_t = 256)]
    seq: i64,
    /// Context for the decode comparison.
    #[arg(long, default_value_t = 4096)]
    context: i64,
    /// Python with torch for the eager baseline.
    #[arg(long, default_value = ".corvid/venv/bin/python")]
    python: String,
    /// Skip the PyTorch baseline.
    #[arg(long)]
    no_pytorch: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Runs the benchmark.
pub fn run(a: ModelBenchArgs) -> anyhow::Result<ExitCode> {
    set_num_threads(a.threads);
    let tiny = ModelConfig::tiny();
    let small = ModelConfig::small();
    let train_tiny = train_throughput(&tiny, a.batch, a.seq, 2, a.steps)?;
    let train_small = train_throughput(&small, a.batch, a.seq, 2, a.steps)?;
    let decode = decode_throughput(&tiny, a.context, 32, 3)?;
    let mut pytorch = serde_json::Value::Null;
    let mut ratio = serde_json::Value::Null;
    if !a.no_pytorch {
        let cfg_json = serde_json::to_string(&tiny)?;
        let out = Command::new(&a.python)
            .args([
                "scripts/bench_model.py",
                "--threads",
                &a.threads.to_string(),
            ])
            .args(["--batch", &a.batch.to_string(), "--seq", &a.seq.to_string()])
            .args(["--steps", &a.steps.to_string(), "--config-json", &cfg_json])
            .output()
            .with_context(|| format!("running {} scripts/bench_model.py", a.python))?;
        anyhow::ensure!(
            out.status.success(),
            "scripts/bench_model.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .context("scripts/bench_model.py did not print JSON")?;
        if let Some(py) = v["train_tokens_per_s"].as_f64() {
            ratio = serde_json::json!(train_tiny.tokens_per_s / py);
        }
        pytorch = v;
    }
    let report = serde_json::json!({
        "kv_bytes_ratio_vs_mha": small.kv_ratio_vs_mha(),
        "kv_bytes_ratio_vs_mha_by_preset": {
            "tiny": tiny.kv_ratio_vs_mha(),
            "small": small.kv_ratio_vs_mha(),
            "k3-shape": ModelConfig::k3_shape().kv_ratio_vs_mha(),
        },
        "decode_speedup_cached_at_4096": decode.cached_tokens_per_s / decode.recompute_tokens_per_s,
        "decode": decode,
        "train_tokens_per_s": {"tiny": train_tiny.tokens_per_s, "small": train_small.tokens_per_s},
        "train": {"tiny": train_tiny, "small": train_small},
        "ratio_vs_pytorch": ratio,
        "pytorch": pytorch,
        "threads": a.threads,
    });
    if a.json {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(ExitCode::SUCCESS)
}

//! `corvid bench gpu`: the one GPU check — custom-kernel correctness, attention and MoE-layer
//! TFLOP/s, decode tokens/s with the custom MLA kernel against the matmul path, and training
//! tokens/s and MFU of the `gpu-1b` preset, on one CUDA device (sized for one H200 in a few
//! minutes). Prints a table last; writes JSON after every section to `--out`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
mod measure;

pub(crate) use self::measure::H200_BF16_PEAK_TFLOPS;
use self::measure::{run_gpu_bench, GpuBenchOptions, GpuReport};
use corvid_model::cuda::{availability, CudaError};
use tch::Device;

/// Goals of the GPU issue, checked in the table.
const GOAL_ATTN_FWD_TFLOPS: f64 = 300.0;
const GOAL_MOE_TFLOPS: f64 = 150.0;
const GOAL_TRAIN_MFU: f64 = 0.25;

/// Custom CUDA kernels' correctness, attention / MoE / decode / train-step speed on one GPU.
#[derive(Args, Debug)]
#[command(after_help = "Example (on a machine with a CUDA GPU):
  corvid bench gpu --json --out gpu.json
  scripts/gpu-check.sh            (the carried-binary form, see BENCHMARKS.md)")]
pub struct GpuBenchArgs {
    /// CUDA device: `cuda` or `cuda:N`.
    #[arg(long, default_value = "cuda:0")]
    device: String,
    /// Model preset for the MoE, decode and train sections.
    #[arg(long, default_value = "gpu-1b")]
    preset: String,
    /// Cache lengths for the decode comparison (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "4096,32768")]
    decode_contexts: Vec<i64>,
    /// Timed training steps.
    #[arg(long, default_value_t = 6)]
    train_steps: usize,
    /// Timed repetitions of the kernel-level measurements.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Run the kernel checks only.
    #[arg(long)]
    checks_only: bool,
    /// Also print the JSON report (one line) before the table.
    #[arg(long)]
    json: bool,
    /// Write the JSON report here (rewritten after every section).
    #[arg(long)]
    out: Option<PathBuf>,
}

pub(crate) fn parse_device(s: &str) -> anyhow::Result<Device> {
    match s.trim() {
        "cuda" => Ok(Device::Cuda(0)),
        other => other
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(Device::Cuda)
            .with_context(|| format!("--device must be cuda or cuda:N, got `{other}`")),
    }
}

fn write_json(path: &Path, report: &GpuReport) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Runs the benchmark. Without CUDA it fails with "no CUDA device: ...".
pub fn run(a: GpuBenchArgs) -> anyhow::Result<ExitCode> {
    let device = parse_device(&a.device)?;
    if let Err(e) = availability(device) {
        let why = match e {
            CudaError::Unavailable(why) => why,
            other => other.to_string(),
        };
        anyhow::bail!("no CUDA device: {why}");
    }
    let mut o = GpuBenchOptions::new(device);
    o.preset_name = a.preset.clone();
    o.decode_contexts = a.decode_contexts.clone();
    o.train_steps = a.train_steps;
    o.iters = a.iters;
    o.checks_only = a.checks_only;
    let out = a.out.clone();
    let mut progress = |r: &GpuReport| {
        if let Some(path) = &out {
            if let Err(e) = write_json(path, r) {
                eprintln!("[bench gpu] {e:#}");
            }
        }
    };
    let report = run_gpu_bench(&o, &mut progress).map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Some(path) = &a.out {
        write_json(path, &report)?;
    }
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    print!("{}", table(&report));
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn goal(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "missed"
    }
}

/// The report as a Markdown table (what BENCHMARKS.md records).
pub fn table(r: &GpuReport) -> String {
    let mut s = String::new();
    let passed = r.checks.iter().filter(|c| c.passed).count();
    s += &format!(
        "\n# corvid bench gpu — {} (NVRTC: {}), {:.0} s\n\n",
        r.device_name, r.nvrtc, r.seconds
    );
    s += "| section | figure | value | goal |\n|---|---|---|---|\n";
    s += &format!(
        "| checks | kernels within tolerance | {passed}/{} | all: {} |\n",
        r.checks.len(),
        goal(r.checks_passed)
    );
    for c in r.checks.iter().filter(|c| !c.passed) {
        s += &format!(
            "| checks | FAILED {} [{} {}] | rel_err {:.3e} (tol {:.1e}), unwritten {}{} | |\n",
            c.name,
            c.kernel,
            c.dtype,
            c.rel_err,
            c.tolerance,
            c.unwritten,
            c.error
                .as_ref()
                .map(|e| format!(", error: {e}"))
                .unwrap_or_default()
        );
    }
    for a in &r.attention {
        s += &format!(
            "| attention | {} [B{} H{} T{}, {}] fwd / fwd+bwd TFLOP/s | {:.0} / {:.0} | fwd ≥ {GOAL_ATTN_FWD_TFLOPS:.0}: {} |\n",
            a.label,
            a.batch,
            a.heads,
            a.seq,
            a.backend,
            a.fwd_tflops,
            a.fwd_bwd_tflops,
            goal(a.fwd_tflops >= GOAL_ATTN_FWD_TFLOPS)
        );
    }
    if let Some(m) = &r.moe {
        s += &format!(
            "| moe | T{} k{} E{} d{} f{} fwd TFLOP/s ATen / kernels; fwd+bwd | {:.0} / {:.0}; {:.0} | ≥ {GOAL_MOE_TFLOPS:.0}: {} |\n",
            m.tokens,
            m.top_k,
            m.experts,
            m.hidden,
            m.ffn,
            m.fwd_aten_tflops,
            m.fwd_kernels_tflops,
            m.fwd_bwd_aten_tflops,
            goal(m.fwd_aten_tflops.max(m.fwd_kernels_tflops) >= GOAL_MOE_TFLOPS)
        );
        s += &format!(
            "| moe | dispatch+combine ms, kernels / ATen | {:.3} / {:.3} | |\n",
            m.movement_kernels_ms, m.movement_aten_ms
        );
    }
    for d in &r.decode {
        s += &format!(
            "| decode | ctx {} B{} attention core µs, kernel ({}) / matmul | {:.0} / {:.0} ({:.2}×) | |\n",
            d.context, d.batch, d.kernel, d.core_kernel_us, d.core_reference_us, d.core_speedup
        );
        s += &format!(
            "| decode | ctx {} B{} model tokens/s, kernel / matmul | {:.0} / {:.0} ({:.2}×) | kernel faster: {} |\n",
            d.context,
            d.batch,
            d.model_kernel_tokens_per_s,
            d.model_reference_tokens_per_s,
            d.model_speedup,
            goal(d.model_speedup > 1.0)
        );
    }
    if let Some(t) = &r.train {
        s += &format!(
            "| train | {} ({:.2}B total, {:.2}B active) [{}×{}] tokens/s, MFU | {:.0}, {:.1}% | ≥ {:.0}%: {} |\n",
            t.preset,
            t.params_total as f64 / 1e9,
            t.params_active as f64 / 1e9,
            t.batch,
            t.seq,
            t.tokens_per_s,
            100.0 * t.mfu,
            100.0 * GOAL_TRAIN_MFU,
            goal(t.mfu >= GOAL_TRAIN_MFU)
        );
        s += &format!(
            "| train | with health + balance update: tokens/s, MFU | {:.0}, {:.1}% | |\n",
            t.tokens_per_s_with_health,
            100.0 * t.mfu_with_health
        );
    }
    for e in &r.errors {
        s += &format!("| error | {e} | | |\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_cuda_the_command_fails_with_a_clear_message() {
        if tch::Cuda::is_available() {
            eprintln!("skipped: this machine has CUDA (the test covers CPU-only machines)");
            return;
        }
        let args = GpuBenchArgs {
            device: "cuda:0".into(),
            preset: "gpu-1b".into(),
            decode_contexts: vec![4096],
            train_steps: 1,
            iters: 1,
            checks_only: false,
            json: true,
            out: None,
        };
        let err = run(args).expect_err("no CUDA here");
        let msg = format!("{err:#}");
        assert!(msg.starts_with("no CUDA device: "), "{msg}");
        assert!(msg.contains("is_available"), "{msg}");
    }

    #[test]
    fn device_flag_accepts_cuda_forms_only() {
        assert_eq!(parse_device("cuda").unwrap(), Device::Cuda(0));
        assert_eq!(parse_device("cuda:3").unwrap(), Device::Cuda(3));
        assert!(parse_device("cpu").is_err());
        assert!(parse_device("cuda:x").is_err());
    }

    #[test]
    fn table_names_failed_checks_and_goals() {
        let r = GpuReport {
            device_name: "test".into(),
            checks: vec![corvid_model::cuda::check::CheckResult {
                name: "mla_decode X".into(),
                kernel: "tensorcore".into(),
                dtype: "bf16".into(),
                max_abs_err: 1.0,
                rel_err: 0.5,
                tolerance: 0.016,
                aten_rel_err: None,
                unwritten: 3,
                passed: false,
                error: None,
            }],
            ..GpuReport::default()
        };
        let t = table(&r);
        assert!(t.contains("| 0/1 | all: missed |"), "{t}");
        assert!(t.contains("FAILED mla_decode X [tensorcore bf16]"), "{t}");
        assert!(!r.ok());
    }
}

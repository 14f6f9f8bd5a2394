//! `corvid bench long`: one training forward + backward of a single long trajectory, per
//! length: seconds, tokens/s and peak memory growth. The peer is transformers on the same
//! config (`scripts/bench_long.py` runs both and reports the ratios).
//!
//! Each length runs in a child process of its own (this binary, `--tokens T --child`), so
//! that one length's peak RSS is not hidden by memory the allocator kept from the last, and a
//! length that runs out of memory is reported as killed while the others still run.
//!
//! The step is what an RL update does for one trajectory: the trunk (checkpointed with
//! `--checkpoint blocks`), then the chunked head with every term of the RL loss on
//! (clipped surrogate with the truncated importance weight, entropy bonus, k3 KL to a
//! reference, balance loss), then the trunk's backward. Random ids, random weights (a preset)
//! or a model folder's; fp32 on the CPU, bf16 weights with fp32 routers on CUDA (as the
//! trainer runs there). On CUDA the memory figure is the device memory the step added
//! (`cuMemGetInfo` after the step minus before it): libtorch's caching allocator keeps what it
//! reserved, so this is its peak reservation for the step, plus kernel modules and library
//! workspaces loaded during it (and less whatever the allocator freed to retry after running
//! out of memory).

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use corvid_learner::config::ModelSection;
use corvid_learner::train::config::TrainConfig;
use corvid_learner::train::loss::{
    clipped_surrogate, importance_ratio, k3_kl, token_sum_over, truncated_importance_weight,
};
use corvid_learner::train::pack::{PackedBatch, PackedRow};
use corvid_model::cuda::runtime::device_used_memory;
use corvid_model::precision::weight_kind_for;
use corvid_model::{arch, Checkpoint, MoePolicy};
use serde::{Deserialize, Serialize};
use tch::{nn, Device, Kind, Tensor};

/// One forward + backward of a single long trajectory, per length.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  corvid bench long --preset tiny --tokens 4096,16384,65536 --checkpoint blocks --json
  corvid bench long --model /tmp/corvid-bench/qwen3-moe-152k --tokens 4096,8192 --json
  corvid bench long --preset gpu-1b --device cuda --tokens 262144,1048576 --checkpoint blocks
  (.corvid/venv/bin/python scripts/bench_long.py runs it beside transformers)")]
pub struct LongBenchArgs {
    /// A model folder (Hugging Face or a run's policy); its `max_position_embeddings` must
    /// cover the longest length.
    #[arg(long, value_name = "DIR", conflicts_with = "preset")]
    model: Option<PathBuf>,
    /// A preset (random weights), its context raised to the longest length.
    #[arg(long)]
    preset: Option<String>,
    /// Field overrides on the preset, as a TOML table, e.g. `num_hidden_layers = 2`.
    #[arg(long, requires = "preset")]
    overrides: Option<String>,
    /// Trajectory lengths, comma-separated.
    #[arg(long, default_value = "4096,16384")]
    tokens: String,
    /// `none` or `blocks` (activation checkpointing).
    #[arg(long, default_value = "none")]
    checkpoint: String,
    /// MiB of logits per chunk.
    #[arg(long, default_value_t = 64)]
    chunk_mib: usize,
    /// Tokens per slice of a checkpointed block's FFN rerun.
    #[arg(long, default_value_t = corvid_model::DEFAULT_RECOMPUTE_SLICE_TOKENS)]
    slice_tokens: i64,
    /// Intra-op threads.
    #[arg(long, default_value_t = 2)]
    threads: i32,
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// One JSON line per length.
    #[arg(long)]
    json: bool,
    /// Run one length in this process (what the parent spawns).
    #[arg(long, hide = true)]
    child: bool,
}

/// One length's result.
#[derive(Debug, Serialize, Deserialize)]
struct LongResult {
    tokens: i64,
    seconds: f64,
    tokens_per_s: f64,
    peak_rss_delta_mb: f64,
    /// The process's whole peak RSS (the model, libtorch and the step).
    #[serde(default)]
    peak_rss_mb: f64,
    /// On CUDA: device memory added by the step (the caching allocator's peak reservation).
    #[serde(skip_serializing_if = "Option::is_none")]
    peak_cuda_mb: Option<f64>,
    /// On CUDA: model FLOPs utilisation, `tokens/s · 3 · flops_per_token(T/2)` over the
    /// H100/H200 dense bf16 peak (the rerun of checkpointed blocks is not counted as work).
    #[serde(skip_serializing_if = "Option::is_none")]
    mfu: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    killed: Option<String>,
}

fn lengths(text: &str) -> anyhow::Result<Vec<i64>> {
    text.split(',')
        .map(|s| {
            s.trim()
                .parse::<i64>()
                .ok()
                .filter(|t| *t >= 2)
                .with_context(|| format!("--tokens: `{}` is not a length of at least 2", s.trim()))
        })
        .collect()
}

/// Runs the benchmark.
pub fn run(a: LongBenchArgs) -> anyhow::Result<ExitCode> {
    let lens = lengths(&a.tokens)?;
    let device = device_arg(&a.device)?;
    if device.is_cuda() && !tch::Cuda::is_available() {
        bail!("--device {}: libtorch sees no CUDA device", a.device);
    }
    let checkpoint = Checkpoint::from_name(&a.checkpoint)
        .with_context(|| format!("--checkpoint: `{}` is not none or blocks", a.checkpoint))?;
    if a.model.is_none() && a.preset.is_none() {
        bail!("give --model DIR or --preset NAME");
    }
    if a.child {
        let [t] = lens[..] else {
            bail!("--child runs exactly one length");
        };
        let r = measure(&a, t, checkpoint, device)?;
        println!("{}", serde_json::to_string(&r)?);
        return Ok(ExitCode::SUCCESS);
    }
    let exe = std::env::current_exe().context("locating this binary")?;
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    // Drop `--tokens X` / `--tokens=X` and `--json`; the child gets one length.
    let mut i = 0;
    while i < args.len() {
        if args[i] == "--tokens" {
            args.drain(i..(i + 2).min(args.len()));
        } else if args[i].starts_with("--tokens=") || args[i] == "--json" {
            args.remove(i);
        } else {
            i += 1;
        }
    }
    for t in lens {
        let out = Command::new(&exe)
            .args(&args)
            .args(["--tokens", &t.to_string(), "--child"])
            .output()
            .context("running a length in a child process")?;
        let r = if out.status.success() {
            let line = String::from_utf8_lossy(&out.stdout);
            serde_json::from_str::<LongResult>(line.trim())
                .with_context(|| format!("reading the child's result: {line}"))?
        } else {
            let why = match out.status.code() {
                Some(c) => format!(
                    "exit {c}: {}",
                    String::from_utf8_lossy(&out.stderr)
                        .lines()
                        .last()
                        .unwrap_or("")
                ),
                None => "killed by a signal (out of memory?)".to_string(),
            };
            LongResult {
                tokens: t,
                seconds: 0.0,
                tokens_per_s: 0.0,
                peak_rss_delta_mb: 0.0,
                peak_rss_mb: 0.0,
                peak_cuda_mb: None,
                mfu: None,
                killed: Some(why),
            }
        };
        if a.json {
            println!("{}", serde_json::to_string(&r)?);
        } else if let Some(why) = &r.killed {
            println!("{:>8} tokens  failed: {why}", r.tokens);
        } else {
            let cuda = match (r.peak_cuda_mb, r.mfu) {
                (Some(m), Some(u)) => format!("  CUDA +{m:.0} MiB  MFU {:.1}%", u * 100.0),
                _ => String::new(),
            };
            println!(
                "{:>8} tokens  {:>8.2} s  {:>8.0} tok/s  peak RSS +{:.0} MiB ({:.0} MiB in all){cuda}",
                r.tokens, r.seconds, r.tokens_per_s, r.peak_rss_delta_mb, r.peak_rss_mb
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `cpu`, `cuda` or `cuda:N`.
fn device_arg(s: &str) -> anyhow::Result<Device> {
    match s.trim() {
        "cpu" => Ok(Device::Cpu),
        other => super::gpu::parse_device(other).context("--device may also be cpu"),
    }
}

/// The model on `device` in its training dtype ([`weight_kind_for`]): a preset built there,
/// or a folder loaded on the CPU and copied over.
fn load_model(
    a: &LongBenchArgs,
    t: i64,
    device: Device,
) -> anyhow::Result<(nn::VarStore, MoePolicy)> {
    let kind = weight_kind_for(device);
    if let Some(dir) = &a.model {
        let opened = arch::open(dir, Device::Cpu)
            .with_context(|| format!("loading the model folder {}", dir.display()))?;
        let max = opened.model.config().max_position_embeddings;
        if t > max {
            bail!(
                "{t} tokens exceed {}'s max_position_embeddings {max}",
                dir.display()
            );
        }
        if device == Device::Cpu {
            return Ok((opened.vs, opened.model));
        }
        let mut vs = nn::VarStore::new(device);
        let model = MoePolicy::new_in_kind(&vs, opened.model.config(), kind)?;
        // `copy` casts each value to the destination's dtype: routers stay fp32.
        vs.copy(&opened.vs)?;
        return Ok((vs, model));
    }
    let section = ModelSection {
        preset: a.preset.clone().unwrap_or_else(|| "tiny".into()),
        overrides: match &a.overrides {
            Some(o) => o
                .parse::<toml::Table>()
                .with_context(|| format!("--overrides `{o}` is not a TOML table"))?,
            None => toml::Table::new(),
        },
        ..ModelSection::default()
    };
    let mut cfg = section.resolve()?;
    cfg.max_position_embeddings = cfg.max_position_embeddings.max(t);
    tch::manual_seed(0);
    let vs = nn::VarStore::new(device);
    let model = MoePolicy::new_in_kind(&vs, &cfg, kind)?;
    Ok((vs, model))
}

/// Waits for `device`'s queued work (a no-op on the CPU).
fn sync(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

/// One forward + backward of a `t`-token trajectory, every generated-token term on.
fn measure(
    a: &LongBenchArgs,
    t: i64,
    checkpoint: Checkpoint,
    device: Device,
) -> anyhow::Result<LongResult> {
    tch::set_num_threads(a.threads);
    let (_vs, mut model) = load_model(a, t, device)?;
    model.set_recompute_slice_tokens(a.slice_tokens);
    let v = model.config().vocab_size;
    let ids: Vec<u32> = Vec::<i64>::try_from(Tensor::randint(v, [t], (Kind::Int64, Device::Cpu)))?
        .into_iter()
        .map(|x| x as u32)
        .collect();
    // The first tenth is the prompt; the rest was generated.
    let mask: Vec<bool> = (0..t).map(|i| i >= t / 10).collect();
    let row = PackedRow::single(&ids, &mask, 0);
    let cfg = TrainConfig {
        checkpoint,
        logit_chunk_mib: a.chunk_mib,
        ..TrainConfig::default()
    };
    sync(device);
    let ordinal = match device {
        Device::Cuda(i) => Some(i),
        _ => None,
    };
    let cuda_before = ordinal.and_then(device_used_memory);
    super::reset_peak_rss();
    let before = super::rss_bytes().unwrap_or(0);
    let start = Instant::now();
    let batch = PackedBatch::new(&[&row], device)?;
    let n = batch.n_trained as i64;
    let behaviour_n = Tensor::randn([n], (Kind::Float, device)) * 0.1 - 3.0;
    let reference_n = Tensor::randn([n], (Kind::Float, device)) * 0.1 - 3.0;
    let adv_n = Tensor::randn([n], (Kind::Float, device));
    let inv_temp_n1 = Tensor::ones([n, 1], (Kind::Float, device));
    batch.train(&model, &inv_temp_n1, &cfg, 1.0, |r, s| {
        let part = |x: &Tensor| x.narrow(0, r.start, r.end - r.start);
        let ratio = importance_ratio(&s.logp_n, &s.logp_n.detach());
        let (w, _) = truncated_importance_weight(&s.logp_n, &part(&behaviour_n), 2.0);
        let pg = w * clipped_surrogate(&ratio, &part(&adv_n), 0.2, 0.28);
        let kl = k3_kl(&s.logp_n, &part(&reference_n));
        Ok(
            token_sum_over(&pg, n as f64) - token_sum_over(&s.entropy_n, n as f64) * 1e-3
                + token_sum_over(&kl, n as f64) * 1e-2,
        )
    })?;
    sync(device);
    let seconds = start.elapsed().as_secs_f64();
    let peak = super::peak_rss_bytes().unwrap_or(0);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let peak_cuda_mb = match (cuda_before, ordinal.and_then(device_used_memory)) {
        (Some(b), Some(after)) => Some(mib(after.saturating_sub(b))),
        _ => None,
    };
    Ok(LongResult {
        tokens: t,
        seconds,
        tokens_per_s: t as f64 / seconds,
        peak_rss_delta_mb: mib(peak.saturating_sub(before)),
        peak_rss_mb: mib(peak),
        peak_cuda_mb,
        mfu: device.is_cuda().then(|| {
            t as f64 / seconds * 3.0 * model.config().flops_per_token(t / 2)
                / (super::gpu::H200_BF16_PEAK_TFLOPS * 1e12)
        }),
        killed: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: LongBenchArgs,
    }

    fn args(extra: &[&str]) -> LongBenchArgs {
        let mut argv = vec![
            "long",
            "--preset",
            "tiny",
            "--overrides",
            "num_hidden_layers = 1",
        ];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).expect("parses").a
    }

    #[test]
    fn device_flag_takes_cpu_and_cuda_forms() {
        assert_eq!(device_arg("cpu").unwrap(), Device::Cpu);
        assert_eq!(device_arg("cuda").unwrap(), Device::Cuda(0));
        assert_eq!(device_arg("cuda:1").unwrap(), Device::Cuda(1));
        let err = format!("{:#}", device_arg("gpu").unwrap_err());
        assert!(err.contains("cpu") && err.contains("`gpu`"), "{err}");
    }

    #[test]
    fn a_cpu_length_reports_time_and_memory_and_no_cuda_figures() {
        let a = args(&["--tokens", "96", "--slice-tokens", "40"]);
        let r = measure(&a, 96, Checkpoint::Blocks, Device::Cpu).unwrap();
        assert_eq!(r.tokens, 96);
        assert!(r.seconds > 0.0 && r.tokens_per_s > 0.0);
        assert!(r.peak_rss_mb > 0.0);
        assert!(r.peak_cuda_mb.is_none() && r.mfu.is_none() && r.killed.is_none());
        let line = serde_json::to_string(&r).unwrap();
        assert!(
            !line.contains("peak_cuda_mb") && !line.contains("mfu"),
            "{line}"
        );
    }
}

//! `corvid model logits | generate | export` on a model folder (a Hugging Face checkpoint, or
//! a policy folder a run wrote): what a user runs to check a checkpoint against transformers,
//! and to hand a trained one back to the ecosystem.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Args;
use corvid_actor::{ChoiceContext, NucleusSampler, TokenChooser};
use corvid_model::{arch, head, Checkpoint, MoePolicy};
use corvid_proto::SamplingParams;
use corvid_tasks::SplitMix64;
use tch::{Device, Kind, Tensor};

use super::ModelDir;

/// Token ids: comma-separated integers.
fn parse_ids(text: &str) -> anyhow::Result<Vec<i64>> {
    let ids = text
        .split(',')
        .map(|s| {
            s.trim()
                .parse::<i64>()
                .with_context(|| format!("--ids: `{}` is not a token id", s.trim()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if ids.is_empty() {
        bail!("--ids: give at least one token id");
    }
    Ok(ids)
}

/// Loads the folder on the CPU (fp32), one thread per forward unless `threads` says more.
fn load(dir: &ModelDir, threads: i32) -> anyhow::Result<MoePolicy> {
    tch::set_num_threads(threads);
    let opened = arch::open(&dir.model, Device::Cpu)
        .with_context(|| format!("loading the model folder {}", dir.model.display()))?;
    // The variables live in the graph the model holds; the store itself is not needed.
    Ok(opened.model)
}

/// Refuses a generation that would run past the model's position table before it starts (the
/// model checks ids and positions itself, but only when a step reaches them).
fn check_room(model: &MoePolicy, prompt: usize, new: i64) -> anyhow::Result<()> {
    let max = model.config().max_position_embeddings;
    let total = prompt as i64 + new;
    if total > max {
        bail!("{prompt} prompt ids + {new} new tokens exceed the model's max_position_embeddings {max}");
    }
    Ok(())
}

/// Arguments of `corvid model logits`.
#[derive(Args, Debug)]
pub(super) struct LogitsArgs {
    #[command(flatten)]
    dir: ModelDir,
    /// Comma-separated token ids.
    #[arg(long)]
    ids: String,
    /// libtorch threads.
    #[arg(long, default_value_t = 1)]
    threads: i32,
    /// Print `{"logits": [[...], ...]}` (one row per position) instead of a summary.
    #[arg(long)]
    json: bool,
}

/// `corvid model logits`.
pub(super) fn logits(a: LogitsArgs) -> anyhow::Result<ExitCode> {
    let ids = parse_ids(&a.ids)?;
    let model = load(&a.dir, a.threads)?;
    let tokens = Tensor::from_slice(&ids).unsqueeze(0);
    // Inference: no autograd graph, so no activation is kept past its layer.
    let logits_tv = tch::no_grad(|| model.forward(&tokens, false))?
        .logits_btv
        .get(0)
        .to_kind(Kind::Float);
    let rows: Vec<Vec<f32>> = (0..ids.len() as i64)
        .map(|t| Vec::<f32>::try_from(logits_tv.get(t)))
        .collect::<Result<_, _>>()?;
    if a.json {
        println!("{}", serde_json::json!({ "logits": rows }));
        return Ok(ExitCode::SUCCESS);
    }
    for (t, row) in rows.iter().enumerate() {
        let (best, value) =
            row.iter().enumerate().fold(
                (0, f32::NEG_INFINITY),
                |b, (i, &v)| if v > b.1 { (i, v) } else { b },
            );
        println!(
            "position {t:>4}  id {:>8}  argmax {best:>8} ({value:.4})",
            ids[t]
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `corvid model score`.
#[derive(Args, Debug)]
pub(super) struct ScoreArgs {
    #[command(flatten)]
    dir: ModelDir,
    /// A file of token ids: integers separated by commas, spaces or newlines, or a JSON
    /// array.
    #[arg(long, value_name = "FILE")]
    ids_file: PathBuf,
    /// Temperature the log-probs and entropy are taken at (`softmax(logits / T)`).
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    /// MiB of logits one chunk of positions may hold.
    #[arg(long, default_value_t = 64)]
    chunk_mib: usize,
    /// libtorch threads.
    #[arg(long, default_value_t = 1)]
    threads: i32,
    /// Print `{"logprobs": [...], "entropy": [...]}` (one entry per id after the first).
    #[arg(long)]
    json: bool,
}

/// Reads `--ids-file`.
fn read_ids_file(path: &Path) -> anyhow::Result<Vec<i64>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--ids-file: reading {}", path.display()))?;
    let trimmed = text.trim();
    let ids: Vec<i64> = if trimmed.starts_with('[') {
        serde_json::from_str(trimmed).with_context(|| {
            format!(
                "--ids-file {}: not a JSON array of token ids",
                path.display()
            )
        })?
    } else {
        trimmed
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .enumerate()
            .map(|(i, s)| {
                s.parse::<i64>().with_context(|| {
                    format!(
                        "--ids-file {}: entry {i}, `{s}`, is not a token id",
                        path.display()
                    )
                })
            })
            .collect::<anyhow::Result<_>>()?
    };
    if ids.len() < 2 {
        bail!(
            "--ids-file {}: holds {} ids; scoring needs at least two (each position predicts the next)",
            path.display(),
            ids.len()
        );
    }
    Ok(ids)
}

/// `corvid model score`: per position, the log-prob of the next id and the entropy, through
/// the training path (the trunk, then the chunked head: never `[T, V]` logits).
pub(super) fn score(a: ScoreArgs) -> anyhow::Result<ExitCode> {
    if !(a.temperature.is_finite() && a.temperature > 0.0) {
        bail!(
            "--temperature must be a positive number, got {}",
            a.temperature
        );
    }
    let ids = read_ids_file(&a.ids_file)?;
    let model = load(&a.dir, a.threads)?;
    let cfg = model.config();
    if ids.len() as i64 > cfg.max_position_embeddings {
        bail!(
            "--ids-file holds {} ids, past the model's max_position_embeddings {}",
            ids.len(),
            cfg.max_position_embeddings
        );
    }
    let n = ids.len() as i64 - 1;
    let tokens = Tensor::from_slice(&ids[..n as usize]).unsqueeze(0);
    let targets = Tensor::from_slice(&ids[1..]);
    let scores = tch::no_grad(|| -> anyhow::Result<_> {
        let trunk = model.trunk(&tokens, false, Checkpoint::None)?;
        let d = cfg.hidden_size;
        let inv_temp = Tensor::full([n, 1], 1.0 / a.temperature, (Kind::Float, Device::Cpu));
        Ok(head::score_chunked(
            &trunk.hidden_btd.view([-1, d]),
            model.head_weight_vd(),
            &targets,
            &inv_temp,
            head::chunk_rows(cfg.vocab_size, a.chunk_mib.max(1) << 20),
        )?)
    })?;
    let logprobs = Vec::<f32>::try_from(&scores.logp_n)?;
    let entropy = Vec::<f32>::try_from(&scores.entropy_n)?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({ "logprobs": logprobs, "entropy": entropy })
        );
        return Ok(ExitCode::SUCCESS);
    }
    for (t, (lp, h)) in logprobs.iter().zip(&entropy).enumerate() {
        println!(
            "position {t:>6}  next id {:>8}  log-prob {lp:>10.4}  entropy {h:>8.4}",
            ids[t + 1]
        );
    }
    let total: f64 = logprobs.iter().map(|x| f64::from(*x)).sum();
    println!("{n} positions, mean log-prob {:.4}", total / n as f64);
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `corvid model generate`.
#[derive(Args, Debug)]
pub(super) struct GenerateArgs {
    #[command(flatten)]
    dir: ModelDir,
    /// Comma-separated prompt token ids.
    #[arg(long)]
    ids: String,
    /// Tokens to generate.
    #[arg(long, default_value_t = 32)]
    max_new_tokens: u32,
    /// Greedy decoding (the argmax; its log-prob under `log softmax(logits)`).
    #[arg(long, conflicts_with = "temperature")]
    greedy: bool,
    /// Sampling temperature (without --greedy).
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    /// Nucleus mass for sampling.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Sampler seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// libtorch threads.
    #[arg(long, default_value_t = 1)]
    threads: i32,
    /// Print `{"ids": [...], "logprobs": [...]}` (the generated tokens only).
    #[arg(long)]
    json: bool,
}

/// `corvid model generate`: prefill, then one token at a time on the model's cache, each
/// token chosen by the actor's sampler (`corvid_actor::NucleusSampler`), as an actor decodes.
pub(super) fn generate(a: GenerateArgs) -> anyhow::Result<ExitCode> {
    let ids = parse_ids(&a.ids)?;
    let sampling = SamplingParams {
        temperature: if a.greedy { 0.0 } else { a.temperature },
        top_p: a.top_p,
        max_new_tokens: a.max_new_tokens,
        seed: a.seed,
    };
    sampling.validate().context("sampling settings")?;
    let model = load(&a.dir, a.threads)?;
    let n = i64::from(a.max_new_tokens);
    check_room(&model, ids.len(), n)?;
    let mut cache = model.new_cache(1, ids.len() as i64 + n);
    let mut logits = model.forward_cached(&mut cache, &Tensor::from_slice(&ids).unsqueeze(0))?;
    let mut rng = SplitMix64::new(a.seed);
    let mut sampler = NucleusSampler;
    let (mut out, mut logprobs) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let last_v = Vec::<f32>::try_from(logits.select(1, -1).get(0).to_kind(Kind::Float))?;
        let choice = sampler.choose(
            ChoiceContext {
                trajectory_id: "corvid model generate",
                turn: 0,
                generated: &out,
                sampling: &sampling,
                rng: &mut rng,
            },
            &last_v,
        )?;
        out.push(choice.token);
        logprobs.push(choice.logprob);
        let next = Tensor::from_slice(&[i64::from(choice.token)]).unsqueeze(0);
        logits = model.forward_cached(&mut cache, &next)?;
    }
    if a.json {
        println!(
            "{}",
            serde_json::json!({ "ids": out, "logprobs": logprobs })
        );
    } else {
        let text: Vec<String> = out.iter().map(u32::to_string).collect();
        println!("{}", text.join(","));
    }
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `corvid model export`.
#[derive(Args, Debug)]
pub(super) struct ExportArgs {
    #[command(flatten)]
    dir: ModelDir,
    /// The new folder (absent or empty: an export never overwrites a model).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Largest weight file, e.g. 5GB, 500MB, 2GiB; more weights go into shards with an index.
    #[arg(long, default_value = "5GB")]
    max_shard_size: String,
    /// Weight dtype on disk: fp32, bf16 or fp16 (routers stay fp32). Default: the source's,
    /// as `save_pretrained` keeps a model's (a Hugging Face folder's `dtype` in its
    /// config.json, a policy folder's weights as stored).
    #[arg(long)]
    dtype: Option<String>,
    /// The architecture to write a Corvid-native policy folder as: `corvid` (any model) or
    /// `deepseek_v3` (one without Corvid's own features). A Hugging Face folder, or a policy
    /// whose run started from one, exports as its own architecture.
    #[arg(long = "as", value_name = "MODEL_TYPE")]
    as_type: Option<String>,
}

/// A dtype by name: `--dtype`'s short names, or a Hugging Face config's (`float32`, ...).
fn parse_dtype(name: &str) -> Option<Kind> {
    Some(match name {
        "fp32" | "float32" => Kind::Float,
        "bf16" | "bfloat16" => Kind::BFloat16,
        "fp16" | "float16" => Kind::Half,
        _ => return None,
    })
}

/// The dtype a model folder's weights are in: a Hugging Face config's `dtype` (or
/// `torch_dtype`), else the kind most of its stored tensors have.
fn source_kind(dir: &Path) -> anyhow::Result<Kind> {
    let config = dir.join("config.json");
    let text = std::fs::read_to_string(&config)
        .with_context(|| format!("reading {}", config.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", config.display()))?;
    let named = ["dtype", "torch_dtype"]
        .iter()
        .find_map(|k| value.get(*k)?.as_str())
        .filter(|_| value.get("model_type").is_some());
    match named {
        Some(d) => parse_dtype(d).with_context(|| {
            format!(
                "{}: dtype `{d}` is not fp32, bf16 or fp16",
                config.display()
            )
        }),
        None => Ok(corvid_model::checkpoint::stored_kind(dir)?),
    }
}

/// `5GB`, `500MB`, `2GiB`, `1000` (bytes), as transformers' `max_shard_size` reads them.
fn parse_size(text: &str) -> anyhow::Result<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .with_context(|| format!("--max-shard-size `{text}`: expected a size such as 5GB"))?;
    let mult: f64 = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1.0,
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "KIB" => 1024.0,
        "MIB" => 1024.0 * 1024.0,
        "GIB" => 1024.0 * 1024.0 * 1024.0,
        other => bail!(
            "--max-shard-size `{text}`: unknown unit `{other}` (B, KB, MB, GB, KiB, MiB, GiB)"
        ),
    };
    let bytes = value * mult;
    if !(bytes >= 1.0 && bytes.is_finite()) {
        bail!("--max-shard-size `{text}`: must be at least one byte");
    }
    Ok(bytes as u64)
}

/// `corvid model export`.
pub(super) fn export(a: ExportArgs) -> anyhow::Result<ExitCode> {
    let kind = match &a.dtype {
        Some(d) => {
            parse_dtype(d).with_context(|| format!("--dtype `{d}`: expected fp32, bf16 or fp16"))?
        }
        None => source_kind(&a.dir.model).with_context(|| {
            format!(
                "the dtype of {} (name one with --dtype)",
                a.dir.model.display()
            )
        })?,
    };
    let max_shard = parse_size(&a.max_shard_size)?;
    let opened = arch::open(&a.dir.model, Device::Cpu)
        .with_context(|| format!("loading the model folder {}", a.dir.model.display()))?;
    let (family, report) = match &opened.hf {
        Some((hf, source)) => {
            if let Some(t) = a
                .as_type
                .as_deref()
                .filter(|t| *t != hf.family.model_type())
            {
                bail!(
                    "--as {t}: {} is a {} model and exports as one",
                    a.dir.model.display(),
                    hf.family.model_type()
                );
            }
            let report = arch::export(&opened.vs, hf, source, &a.out, kind, max_shard);
            (hf.family, report)
        }
        None => {
            let family = match a.as_type.as_deref().unwrap_or(arch::corvid::MODEL_TYPE) {
                arch::corvid::MODEL_TYPE => arch::Family::Corvid,
                arch::deepseek_v3::MODEL_TYPE => arch::Family::DeepseekV3,
                other => {
                    bail!("--as {other}: a Corvid-native model exports as corvid or deepseek_v3")
                }
            };
            let cfg = opened.model.config();
            let report = arch::export_native(&opened.vs, cfg, family, &a.out, kind, max_shard);
            (family, report)
        }
    };
    let report = report.with_context(|| format!("exporting to {}", a.out.display()))?;
    println!(
        "wrote {} ({}): {} tensors, {:.1} MB in {} file(s); copied {}",
        a.out.display(),
        family.model_type(),
        report.tensors,
        report.bytes as f64 / 1e6,
        report.shards,
        if report.copied.is_empty() {
            "nothing else".to_string()
        } else {
            report.copied.join(", ")
        }
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_ids_parse_or_say_what_is_wrong() {
        assert_eq!(parse_size("5GB").unwrap(), 5_000_000_000);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1000").unwrap(), 1000);
        assert!(parse_size("5XB")
            .unwrap_err()
            .to_string()
            .contains("unknown unit"));
        assert!(parse_size("0MB").is_err());
        assert_eq!(parse_ids("1, 2,3").unwrap(), [1, 2, 3]);
        assert!(parse_ids("1,x").unwrap_err().to_string().contains("`x`"));
    }
}

//! `corvid bench hf`: training and greedy-decoding throughput of a Hugging Face checkpoint on
//! the CPU, the Corvid half of `scripts/bench_hf.py`, which runs transformers on the same
//! folder with the same batch, lengths and threads and reports the ratios.
//!
//! - Training: the trainer's path (trunk, cross-entropy through the chunked head, backward) on
//!   random ids `[batch, seq]` (no optimizer step, as the transformers side), the fastest of
//!   `steps` timed steps after `warmup`.
//! - Decoding: per batch size, random prompts `[batch, prompt]`, prefill, then `new_tokens`
//!   greedy steps through the cached batched decode the actor uses (`forward_cached`); the
//!   rate counts generated tokens over the whole call (prefill included, as `generate`), the
//!   best of `repeats`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use corvid_model::{arch, head, Checkpoint, MoePolicy};
use tch::{nn, Device, Kind, Tensor};

/// Training and greedy-decoding throughput of a Hugging Face folder on the CPU.
#[derive(Args, Debug)]
#[command(after_help = "Example:
  corvid bench hf --model /tmp/corvid-bench/qwen3-moe-small --json
  (.corvid/venv/bin/python scripts/bench_hf.py --what train,decode runs it beside transformers)")]
pub struct HfBenchArgs {
    /// The Hugging Face folder.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// Intra-op threads.
    #[arg(long, default_value_t = 2)]
    threads: i32,
    /// Training batch rows.
    #[arg(long, default_value_t = 4)]
    batch: i64,
    /// Training sequence length.
    #[arg(long, default_value_t = 256)]
    seq: i64,
    /// Untimed training steps first.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Timed training steps (the rate uses the fastest).
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Decoding batch sizes, comma-separated.
    #[arg(long, default_value = "1,32")]
    decode_batches: String,
    /// Prompt length for decoding.
    #[arg(long, default_value_t = 16)]
    prompt: i64,
    /// Tokens generated per row.
    #[arg(long, default_value_t = 64)]
    new_tokens: i64,
    /// Timed generations per batch size (the rate uses the fastest).
    #[arg(long, default_value_t = 2)]
    repeats: usize,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Seconds of one training step on `ids [B, T + 1]`: the trainer's path (the trunk, the
/// cross-entropy through the chunked head, the backward), not full `[B, T, V]` logits.
fn train_step(model: &MoePolicy, vs: &nn::VarStore, ids: &Tensor) -> anyhow::Result<f64> {
    let start = Instant::now();
    let (b, t1) = ids.size2()?;
    let t = t1 - 1;
    let (inp, tgt) = (ids.narrow(1, 0, t), ids.narrow(1, 1, t));
    for v in vs.trainable_variables() {
        let mut g = v.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
    let trunk = model.trunk(&inp, false, Checkpoint::None)?;
    let d = model.config().hidden_size;
    let n = b * t;
    let inv_temp = Tensor::ones([n, 1], (Kind::Float, inp.device()));
    let (_, grad_nd) = head::backward_chunked(
        &trunk.hidden_btd.reshape([n, d]),
        model.head_weight_vd(),
        &tgt.reshape([-1]),
        &inv_temp,
        head::chunk_rows(model.config().vocab_size, head::DEFAULT_CHUNK_BYTES),
        |_, s| Ok(-s.logp_n.sum(Kind::Float) / n as f64),
    )?;
    model.backward(trunk, &grad_nd.view([b, t, d]), 0.0)?;
    Ok(start.elapsed().as_secs_f64())
}

/// Seconds to generate `new` greedy tokens for each row of `prompt [B, P]`, prefill included.
fn generate(model: &MoePolicy, prompt: &Tensor, new: i64) -> anyhow::Result<f64> {
    let start = Instant::now();
    let (b, p) = prompt.size2()?;
    let mut cache = model.new_cache(b as usize, p + new);
    let logits = model.forward_cached(&mut cache, prompt)?;
    let mut next = logits.select(1, p - 1).argmax(-1, true);
    for _ in 1..new {
        let l = model.forward_cached(&mut cache, &next)?;
        next = l.select(1, 0).argmax(-1, true);
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Runs the benchmark.
pub fn run(a: HfBenchArgs) -> anyhow::Result<ExitCode> {
    tch::set_num_threads(a.threads);
    tch::manual_seed(0);
    let start = Instant::now();
    let (vs, model, hf, _) = arch::load(&a.model, Device::Cpu)
        .with_context(|| format!("loading {}", a.model.display()))?;
    let load_s = start.elapsed().as_secs_f64();
    let vocab = model.config().vocab_size;
    let ids = Tensor::randint(vocab, [a.batch, a.seq + 1], (Kind::Int64, Device::Cpu));
    for _ in 0..a.warmup {
        train_step(&model, &vs, &ids)?;
    }
    let mut best = f64::INFINITY;
    for _ in 0..a.steps.max(1) {
        best = best.min(train_step(&model, &vs, &ids)?);
    }
    let train_tokens_per_s = (a.batch * a.seq) as f64 / best;
    let mut decode = Vec::new();
    for b in a.decode_batches.split(',') {
        let b: i64 = b
            .trim()
            .parse()
            .with_context(|| format!("--decode-batches: `{b}` is not a batch size"))?;
        let prompt = Tensor::randint(vocab, [b, a.prompt], (Kind::Int64, Device::Cpu));
        generate(&model, &prompt, a.new_tokens.min(4))?;
        let mut best = f64::INFINITY;
        for _ in 0..a.repeats.max(1) {
            best = best.min(generate(&model, &prompt, a.new_tokens)?);
        }
        decode.push(serde_json::json!({
            "batch": b,
            "tokens_per_s": (b * a.new_tokens) as f64 / best,
            "seconds": best,
        }));
    }
    let report = serde_json::json!({
        "model": a.model.display().to_string(),
        "model_type": hf.family.model_type(),
        "params": model.config().param_counts(),
        "load_s": load_s,
        "threads": a.threads,
        "train": {"batch": a.batch, "seq": a.seq, "tokens_per_s": train_tokens_per_s},
        "decode": {"prompt": a.prompt, "new_tokens": a.new_tokens, "batches": decode},
    });
    if a.json {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(ExitCode::SUCCESS)
}

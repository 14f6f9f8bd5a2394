//! Throughput measurements behind `corvid bench model`: training tokens/s (forward + backward)
//! and cached decode against recomputing the full forward per token.

use std::time::Instant;

use tch::{nn, Device, Kind, Tensor};

use corvid_model::{ModelConfig, ModelError, MoePolicy};

/// Training throughput of one configuration.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TrainThroughput {
    /// Tokens per second with `forward(train = false)` + cross-entropy + backward: the exact
    /// work `scripts/bench_model.py` does in PyTorch.
    pub tokens_per_s: f64,
    /// Tokens per second with `forward(train = true)` (health metrics and quantile-balancing
    /// histograms on) + backward + the balance-bias update: what the trainer pays.
    pub tokens_per_s_with_health: f64,
    /// Batch rows.
    pub batch: i64,
    /// Sequence length.
    pub seq: i64,
    /// Timed steps (the rates use the fastest one).
    pub steps: usize,
}

fn train_step(
    model: &mut MoePolicy,
    vs: &nn::VarStore,
    tokens_bt: &Tensor,
    health: bool,
) -> Result<(), ModelError> {
    let t = tokens_bt.size()[1];
    let (inp, tgt) = (tokens_bt.narrow(1, 0, t - 1), tokens_bt.narrow(1, 1, t - 1));
    let out = model.forward(&inp, health)?;
    let loss = out
        .logits_btv
        .reshape([-1, model.config().vocab_size])
        .cross_entropy_for_logits(&tgt.reshape([-1]))
        + &out.aux_loss;
    for v in vs.trainable_variables() {
        let mut g = v.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
    loss.backward();
    if health {
        model.update_balance(&out.balance)?;
    }
    Ok(())
}

/// Measures training tokens/s on random tokens `[batch, seq]` (seed 0) after `warmup` steps.
pub fn train_throughput(
    cfg: &ModelConfig,
    batch: i64,
    seq: i64,
    warmup: usize,
    steps: usize,
) -> Result<TrainThroughput, ModelError> {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let mut model = MoePolicy::new(&vs.root(), cfg)?;
    let tokens = Tensor::randint(cfg.vocab_size, [batch, seq + 1], (Kind::Int64, Device::Cpu));
    let mut rate = |health: bool| -> Result<f64, ModelError> {
        for _ in 0..warmup {
            train_step(&mut model, &vs, &tokens, health)?;
        }
        // The fastest step: robust to the other processes sharing these cores.
        let mut best = f64::INFINITY;
        for _ in 0..steps {
            let start = Instant::now();
            train_step(&mut model, &vs, &tokens, health)?;
            best = best.min(start.elapsed().as_secs_f64());
        }
        Ok((batch * seq) as f64 / best)
    };
    let tokens_per_s = rate(false)?;
    let tokens_per_s_with_health = rate(true)?;
    Ok(TrainThroughput {
        tokens_per_s,
        tokens_per_s_with_health,
        batch,
        seq,
        steps,
    })
}

/// Decode at a long context: cached tokens/s and recompute tokens/s.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DecodeThroughput {
    /// Context length before decoding.
    pub context: i64,
    /// Tokens/s of one-token steps against the latent cache.
    pub cached_tokens_per_s: f64,
    /// Tokens/s when every token recomputes the full forward over the context.
    pub recompute_tokens_per_s: f64,
}

/// Prefills `context` random tokens, then times `cached_steps` cached steps and
/// `recompute_steps` full forwards of length `context` (batch 1, no gradients).
pub fn decode_throughput(
    cfg: &ModelConfig,
    context: i64,
    cached_steps: usize,
    recompute_steps: usize,
) -> Result<DecodeThroughput, ModelError> {
    tch::manual_seed(0);
    let cfg = ModelConfig {
        max_position_embeddings: cfg
            .max_position_embeddings
            .max(context + cached_steps as i64 + 1),
        ..cfg.clone()
    };
    let vs = nn::VarStore::new(Device::Cpu);
    let model = MoePolicy::new(&vs.root(), &cfg)?;
    let prompt = Tensor::randint(cfg.vocab_size, [1, context], (Kind::Int64, Device::Cpu));
    let mut cache = model.new_cache(1, context + cached_steps as i64 + 1);
    let logits = model.forward_cached(&mut cache, &prompt)?;
    let mut next = logits.select(1, context - 1).argmax(-1, true);
    let start = Instant::now();
    for _ in 0..cached_steps {
        let l = model.forward_cached(&mut cache, &next)?;
        next = l.select(1, 0).argmax(-1, true);
    }
    let cached = cached_steps as f64 / start.elapsed().as_secs_f64();
    let start = Instant::now();
    tch::no_grad(|| -> Result<(), ModelError> {
        for _ in 0..recompute_steps {
            let out = model.forward(&prompt, false)?;
            let _ = out.logits_btv.select(1, context - 1).argmax(-1, true);
        }
        Ok(())
    })?;
    let recompute = recompute_steps as f64 / start.elapsed().as_secs_f64();
    Ok(DecodeThroughput {
        context,
        cached_tokens_per_s: cached,
        recompute_tokens_per_s: recompute,
    })
}

/// Sets libtorch's intra-op thread count (the CLI does not link tch itself).
pub fn set_num_threads(n: i32) {
    tch::set_num_threads(n);
}

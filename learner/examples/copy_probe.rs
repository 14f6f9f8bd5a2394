//! Can a model configuration learn to copy? Trains on `random string | the same string`
//! (loss on the copy only) and prints the copy loss every 25 steps: a model that forms an
//! induction head drops to ~0, one that cannot stays near ln(36) per token.
//!
//! ```text
//! cargo run --release -p corvid-learner --example copy_probe -- \
//!     [steps] [gate none|headwise] [cross 0|1] [kv_lora] [rope] [lr] [prefix] [shift 0|1] [digits|letters]
//! ```
//! Other model fields: `CORVID_MODEL='num_attention_heads = 8'` (TOML, as `[model.overrides]`).
//! `prefix` tokens of random filler (digits) surround the source string at a random
//! offset, so the copy needs content-based lookup (an induction head), not a fixed offset.

mod common;

use common::arg;
use corvid_learner::config::ModelSection;
use corvid_model::{AttnGate, MoePolicy};
use tch::nn::OptimizerConfig;
use tch::{nn, Device, Kind, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let steps: usize = arg(1, "400").parse()?;
    // Further model fields as TOML in CORVID_MODEL, e.g. `num_attention_heads = 8`.
    let mut cfg = ModelSection {
        overrides: toml::from_str(&std::env::var("CORVID_MODEL").unwrap_or_default())?,
        ..ModelSection::default()
    }
    .resolve()?;
    cfg.attn_gate = if arg(2, "headwise") == "none" {
        AttnGate::None
    } else {
        AttnGate::Headwise
    };
    cfg.cross_layer_residual = arg(3, "1") == "1";
    cfg.kv_lora_rank = arg(4, "32").parse()?;
    cfg.qk_rope_head_dim = arg(5, "16").parse()?;
    let lr: f64 = arg(6, "2e-3").parse()?;
    let prefix: i64 = arg(7, "0").parse()?;
    cfg.latent_token_shift = arg(8, "0") == "1";
    // `letters`: the filler uses the string's own alphabet and a `: ` marker precedes the
    // source string (as `next: <path>` among filler words in hops).
    let letters = arg(9, "digits") == "letters";
    tch::set_num_threads(1);
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = MoePolicy::new(&vs.root(), &cfg)?;
    let mut opt = nn::AdamW::default().build(&vs, lr)?;
    let (b, n) = (32i64, 10i64);
    // tokens: [filler(prefix)] s(n) '|' s(n); predict the second s from '|' on.
    for step in 1..=steps {
        let s = Tensor::randint_low(97, 123, [b, n], (Kind::Int64, Device::Cpu));
        let k = if prefix > 0 {
            i64::from(rand_below(step as u64, prefix as u64 + 1) as u32)
        } else {
            0
        };
        let (lo, hi) = if letters { (97, 123) } else { (48, 58) };
        let f1 = Tensor::randint_low(lo, hi, [b, k], (Kind::Int64, Device::Cpu));
        let f2 = Tensor::randint_low(lo, hi, [b, prefix - k], (Kind::Int64, Device::Cpu));
        let bar = Tensor::full([b, 1], 124, (Kind::Int64, Device::Cpu));
        let marker = Tensor::from_slice(&[58i64, 32])
            .view([1, 2])
            .expand([b, 2], false);
        let seq = if letters {
            Tensor::cat(&[&f1, &marker, &s, &f2, &bar, &s], 1)
        } else {
            Tensor::cat(&[&f1, &s, &f2, &bar, &s], 1)
        };
        let t = seq.size()[1];
        let inp = seq.narrow(1, 0, t - 1);
        let tgt = seq.narrow(1, 1, t - 1);
        let out = model.forward(&inp, true)?;
        // Copy targets: the last n positions of tgt.
        let logits = out.logits_btv.narrow(1, t - 1 - n, n);
        let loss = logits
            .reshape([-1, cfg.vocab_size])
            .cross_entropy_for_logits(&tgt.narrow(1, t - 1 - n, n).reshape([-1]));
        opt.zero_grad();
        (&loss + &out.aux_loss).backward();
        opt.clip_grad_norm(1.0);
        opt.step();
        if step % 25 == 0 {
            println!("step {step} copy loss {:.4}", loss.double_value(&[]));
        }
    }
    Ok(())
}

/// A deterministic draw in `0..n` for step `step`.
fn rand_below(step: u64, n: u64) -> u64 {
    let mut z = step.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) % n
}

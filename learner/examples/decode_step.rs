//! Times one batched decode step (`forward_ragged`, one new token per row) of a model preset
//! over a cache already holding `context` tokens per row, reporting the fastest wall time and
//! the process CPU time per step. Use it (with `perf record`) to see where decoding goes.
//!
//! ```text
//! cargo run --release -p corvid-learner --example decode_step -- \
//!     [preset | model.json] [threads] [batch] [context] [steps] [core]
//! ```
//! `core`: `default` (the model's: the fused CPU core on the CPU), `matmul` (the ATen matmul
//! path) or `reference` (the ATen reference of the length-masked core).
//!
//! A `.json` path is a resolved model config, such as the `model.json` that `corvid run`
//! writes into its run folder.

mod common;

use std::time::Instant;

use common::{arg, cpu_seconds};
use corvid_model::attention::DecodeCore;
use corvid_model::{ModelConfig, MoePolicy};
use tch::{nn, Device, Kind, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let name = arg(1, "tiny");
    let cfg: ModelConfig = if name.ends_with(".json") {
        serde_json::from_str(&std::fs::read_to_string(&name)?)?
    } else {
        ModelConfig::preset(&name)?
    };
    let threads: i32 = arg(2, "1").parse()?;
    let batch: i64 = arg(3, "32").parse()?;
    let context: i64 = arg(4, "512").parse()?;
    let steps: usize = arg(5, "200").parse()?;
    let core = arg(6, "default");
    tch::set_num_threads(threads);
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let mut model = MoePolicy::new(&vs.root(), &cfg)?;
    match core.as_str() {
        "default" => {}
        "matmul" => model.set_decode_core(None),
        "reference" => model.set_decode_core(Some(DecodeCore::Reference)),
        other => {
            return Err(format!("core must be default, matmul or reference, got {other}").into())
        }
    }
    let mut cache = model.new_cache(batch as usize, context + steps as i64 + 1);
    let prompt = Tensor::randint(cfg.vocab_size, [batch, context], (Kind::Int64, Device::Cpu));
    let _ = model.forward_cached(&mut cache, &prompt)?;
    let new = vec![1i64; batch as usize];
    let (mut best, cpu0, t0) = (f64::INFINITY, cpu_seconds(), Instant::now());
    for _ in 0..steps {
        let tok = Tensor::randint(cfg.vocab_size, [batch, 1], (Kind::Int64, Device::Cpu));
        let s = Instant::now();
        let logits = model.forward_ragged(&mut cache, &tok, &new)?;
        let _ = Vec::<f32>::try_from(logits.view([-1]))?;
        best = best.min(s.elapsed().as_secs_f64());
    }
    let (wall, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
    println!(
        "{} core={core} threads={threads} batch={batch} context={context}: best {:.2} ms/step, mean {:.2} ms/step wall, {:.2} ms/step cpu, {:.0} tokens/s (best)",
        arg(1, "tiny"),
        best * 1e3,
        wall / steps as f64 * 1e3,
        cpu / steps as f64 * 1e3,
        batch as f64 / best
    );
    Ok(())
}

//! Times one training step (forward + cross-entropy + backward) of a model preset, reporting
//! the fastest wall time and the fastest process CPU time (user + system, from /proc), which
//! is far less sensitive than wall time to other processes sharing the cores.
//!
//! ```text
//! cargo run --release -p corvid-learner --example model_step -- \
//!     [preset] [threads] [batch] [seq] [steps] [packed-docs] [train]
//! ```
//! `packed-docs` 0 runs `forward` (plain causal); n > 0 runs `forward_packed` with n equal
//! documents per row. `train` 1 turns on router noise, health and balance statistics, as the
//! trainer runs it.

mod common;

use std::time::Instant;

use common::{arg, cpu_seconds};
use corvid_model::{ModelConfig, MoePolicy};
use tch::{nn, Device, Kind, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cfg = ModelConfig::preset(&arg(1, "tiny"))?;
    let threads: i32 = arg(2, "1").parse()?;
    let batch: i64 = arg(3, "16").parse()?;
    let seq: i64 = arg(4, "512").parse()?;
    let steps: usize = arg(5, "4").parse()?;
    let docs: i64 = arg(6, "0").parse()?;
    let train = arg(7, "0") == "1";
    tch::set_num_threads(threads);
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = MoePolicy::new(&vs.root(), &cfg)?;
    let tokens = Tensor::randint(cfg.vocab_size, [batch, seq + 1], (Kind::Int64, Device::Cpu));
    let (inp, tgt) = (tokens.narrow(1, 0, seq), tokens.narrow(1, 1, seq));
    let doc_len = if docs > 0 {
        (seq + docs - 1) / docs
    } else {
        seq
    };
    let pos_bt = (Tensor::arange(seq, (Kind::Int64, Device::Cpu)).remainder(doc_len))
        .unsqueeze(0)
        .expand([batch, seq], true)
        .contiguous();
    let doc_bt = Tensor::arange(seq, (Kind::Int64, Device::Cpu))
        .divide_scalar_mode(doc_len, "floor")
        .unsqueeze(0)
        .expand([batch, seq], true)
        .contiguous();
    let step = || -> Result<(), Box<dyn std::error::Error>> {
        let out = if docs > 0 {
            model.forward_packed(&inp, &pos_bt, &doc_bt, train)?
        } else {
            model.forward(&inp, train)?
        };
        for v in vs.trainable_variables() {
            let mut g = v.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        let loss = out
            .logits_btv
            .reshape([-1, cfg.vocab_size])
            .cross_entropy_for_logits(&tgt.reshape([-1]))
            + out.aux_loss;
        loss.backward();
        Ok(())
    };
    step()?;
    let (mut wall, mut cpu) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..steps {
        let (t0, c0) = (Instant::now(), cpu_seconds());
        step()?;
        wall = wall.min(t0.elapsed().as_secs_f64());
        cpu = cpu.min(cpu_seconds() - c0);
    }
    let n = (batch * seq) as f64;
    println!(
        "threads {threads} [{batch},{seq}] docs {docs} train {train}: wall {:.3}s ({:.0} tok/s)  cpu {:.2}s ({:.0} tok/cpu-s)",
        wall,
        n / wall,
        cpu,
        n / cpu
    );
    Ok(())
}

//! Times one training step (forward + cross-entropy + backward) of a model preset, reporting
//! the fastest wall time and the fastest process CPU time (user + system, from /proc), which
//! is far less sensitive than wall time to other processes sharing the cores.
//!
//! ```text
//! cargo run --release -p corvid-learner --example model_step -- \
//!     [preset] [threads] [batch] [seq] [steps] [packed-docs] [train] [head]
//! ```
//! `packed-docs` 0 runs plain causal rows; n > 0 packed rows with n equal documents per row.
//! `train` 1 turns on router noise, health and balance statistics, as the trainer runs it.
//! `head` is `chunked` (the trainer's path: the trunk, the cross-entropy through
//! `corvid_model::head`, the trunk's backward; the default) or `full` (`[B, T, V]` logits, the
//! reference path).

mod common;

use std::time::Instant;

use common::{arg, cpu_seconds};
use corvid_model::{head, Checkpoint, ModelConfig, MoePolicy};
use tch::{nn, Device, Kind, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cfg = ModelConfig::preset(&arg(1, "tiny"))?;
    let threads: i32 = arg(2, "1").parse()?;
    let batch: i64 = arg(3, "16").parse()?;
    let seq: i64 = arg(4, "512").parse()?;
    let steps: usize = arg(5, "4").parse()?;
    let docs: i64 = arg(6, "0").parse()?;
    let train = arg(7, "0") == "1";
    let chunked = arg(8, "chunked") == "chunked";
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
        for v in vs.trainable_variables() {
            let mut g = v.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        let trunk = if docs > 0 {
            model.trunk_packed(&inp, &pos_bt, &doc_bt, train, Checkpoint::None)?
        } else {
            model.trunk(&inp, train, Checkpoint::None)?
        };
        if !chunked {
            let loss = model
                .logits(&trunk.hidden_btd)
                .reshape([-1, cfg.vocab_size])
                .cross_entropy_for_logits(&tgt.reshape([-1]))
                + &trunk.aux_loss;
            loss.backward();
            return Ok(());
        }
        let (n, d) = (batch * seq, cfg.hidden_size);
        let (_, grad_nd) = head::backward_chunked(
            &trunk.hidden_btd.reshape([n, d]),
            model.head_weight_vd(),
            &tgt.reshape([-1]),
            &Tensor::ones([n, 1], (Kind::Float, Device::Cpu)),
            head::chunk_rows(cfg.vocab_size, head::DEFAULT_CHUNK_BYTES),
            |_, s| Ok(-s.logp_n.sum(Kind::Float) / n as f64),
        )?;
        model.backward(trunk, &grad_nd.view([batch, seq, d]), 1.0)?;
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
        "threads {threads} [{batch},{seq}] docs {docs} train {train} chunked {chunked}: wall {:.3}s ({:.0} tok/s)  cpu {:.2}s ({:.0} tok/cpu-s)",
        wall,
        n / wall,
        cpu,
        n / cpu
    );
    Ok(())
}

//! Where does the SFT loss on hops sit? Trains the demo policy on hops demonstrations (the
//! real `SftData` stream and `SftTrainer`) and prints the held-out loss split by what the
//! assistant is writing: the first character of a path it must copy, the rest of the path,
//! the answer digits, and everything else (the call format). A policy that has learnt the
//! format but not the copy shows ~0 on `format` and ~ln(36) on the path columns.
//!
//! ```text
//! cargo run --release -p corvid-learner --example sft_probe -- \
//!     [steps] [shift 0|1] [lr] [batch_tokens] [levels e.g. 1,2] [threads] [every] [pack|bucket] [copy-warmup-steps]
//! ```
//! Other model fields: `CORVID_MODEL='kv_lora_rank = 64'` (TOML, as `[model.overrides]`).

mod common;

use std::collections::BTreeMap;
use std::time::Instant;

use common::arg;
use corvid_learner::config::ModelSection;
use corvid_learner::sft_data::SftData;
use corvid_learner::train::pack::{PackedBatch, PackedRow};
use corvid_learner::train::{SftConfig, SftLayout, SftTrainer};
use corvid_model::MoePolicy;
use corvid_tasks::Families;
use corvid_tokenizer::ByteTokenizer;
use tch::{nn, Device, Kind};

/// What an assistant target token is.
#[derive(Clone, Copy)]
enum Part {
    PathFirst,
    PathRest,
    Answer,
    Format,
}

const PARTS: [&str; 4] = ["path[0]", "path[1..]", "answer", "format"];

/// The part of every trained-on target of `row`.
fn parts(row: &PackedRow) -> Vec<Option<Part>> {
    let tok = ByteTokenizer::new();
    let mut out = vec![None; row.len()];
    let mut text: Vec<u8> = Vec::new();
    let mut doc = -2;
    for (i, slot) in out.iter_mut().enumerate() {
        if row.doc_ids[i] != doc {
            doc = row.doc_ids[i];
            text.clear();
        }
        text.extend(tok.decode_bytes(&[row.tokens[i] as u32]));
        if !row.loss_mask[i] {
            continue;
        }
        let open = |key: &str| {
            let key = key.as_bytes();
            text.windows(key.len())
                .rposition(|w| w == key)
                .map(|at| (at + key.len(), !text[at + key.len()..].contains(&b'"')))
        };
        *slot = Some(match (open("\"path\":\""), open("\"answer\":\"")) {
            (Some((at, true)), _) if at == text.len() => Part::PathFirst,
            (Some((_, true)), _) => Part::PathRest,
            (_, Some((_, true))) => Part::Answer,
            _ => Part::Format,
        });
    }
    out
}

type Error = Box<dyn std::error::Error>;

/// Per part: held-out loss (nats per token), greedy accuracy, tokens.
type PartStats = (f64, f64, usize);

/// Held-out loss (nats per token) and greedy accuracy per part.
fn split_loss(model: &MoePolicy, rows: &[PackedRow]) -> Result<Vec<PartStats>, Error> {
    let mut acc = vec![(0.0, 0.0, 0usize); PARTS.len()];
    tch::no_grad(|| -> Result<(), Error> {
        for row in rows {
            let batch = PackedBatch::new(&[row], Device::Cpu)?;
            let out = model.forward_packed(
                &batch.tokens_bt,
                &batch.positions_bt,
                &batch.doc_ids_bt,
                false,
            )?;
            let logp_tv = out.logits_btv.get(0).log_softmax(-1, Kind::Float);
            let argmax: Vec<i64> = Vec::try_from(logp_tv.argmax(-1, false))?;
            let logp: Vec<f32> = Vec::try_from(logp_tv.reshape([-1]))?;
            let v = logp.len() / row.len();
            for (i, part) in parts(row).into_iter().enumerate() {
                if let Some(p) = part {
                    let t = row.targets[i] as usize;
                    let a = &mut acc[p as usize];
                    a.0 -= f64::from(logp[i * v + t]);
                    a.1 += f64::from(u8::from(argmax[i] == t as i64));
                    a.2 += 1;
                }
            }
        }
        Ok(())
    })?;
    Ok(acc
        .into_iter()
        .map(|(l, c, n)| (l / n.max(1) as f64, c / n.max(1) as f64, n))
        .collect())
}

fn main() -> Result<(), Error> {
    let steps: u64 = arg(1, "400").parse()?;
    let shift = arg(2, "1") == "1";
    let lr: f64 = arg(3, "2e-3").parse()?;
    let batch_tokens: usize = arg(4, "4608").parse()?;
    let levels: Vec<u32> = arg(5, "1,2")
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let threads: i32 = arg(6, "2").parse()?;
    let every: u64 = arg(7, "50").parse()?;
    let layout = match arg(8, "pack").as_str() {
        "bucket" => SftLayout::Bucket,
        _ => SftLayout::Pack,
    };
    tch::set_num_threads(threads);
    tch::manual_seed(0);

    let mut cfg = SftConfig {
        steps,
        batch_tokens,
        seq_len: 768,
        layout,
        micro_batch_tokens: batch_tokens,
        levels: BTreeMap::from([("hops".to_string(), levels)]),
        heldout_per_level: 16,
        ..SftConfig::default()
    };
    cfg.optim.lr = lr;
    cfg.optim.warmup_steps = 50;
    cfg.optim.total_steps = steps;
    let mut data = SftData::new(
        &cfg,
        &Families::default(),
        corvid_episode::EpisodeFormat::default(),
    )?;
    let heldout = data.heldout_rows()?;
    let first = &heldout[0];
    let tok = ByteTokenizer::new();
    let mut shown = String::new();
    for i in 0..first.len() {
        if first.doc_ids[i] != 0 {
            break;
        }
        let t = tok.decode(&[first.tokens[i] as u32]);
        shown.push_str(&t);
    }
    println!(
        "first held-out document ({} rows held out):\n{shown}\n",
        heldout.len()
    );

    // Further model fields as TOML in CORVID_MODEL, e.g. `kv_lora_rank = 64`.
    let section = ModelSection {
        overrides: toml::from_str(&std::env::var("CORVID_MODEL").unwrap_or_default())?,
        ..ModelSection::default()
    };
    let mut model_cfg = section.resolve()?;
    model_cfg.latent_token_shift |= shift;
    println!("model: {model_cfg:?}");
    let vs = nn::VarStore::new(Device::Cpu);
    let model = MoePolicy::new(&vs.root(), &model_cfg)?;
    let warmup: usize = arg(9, "0").parse()?;
    if warmup > 0 {
        copy_warmup(&vs, &model, warmup)?;
    }
    let mut trainer = SftTrainer::new(vs, model, cfg)?;
    let start = Instant::now();
    let (mut trained, mut train_secs) = (0usize, 0.0);
    println!("step  secs  train-tok/s  loss  | held-out nats (greedy acc) per part: {PARTS:?}");
    for step in 0..steps {
        let rows = data.step_rows(step)?;
        let t0 = Instant::now();
        let s = trainer.step(&rows)?;
        train_secs += t0.elapsed().as_secs_f64();
        trained += rows
            .iter()
            .map(|r| r.doc_ids.iter().filter(|d| **d >= 0).count())
            .sum::<usize>();
        if (step + 1) % every == 0 || step + 1 == steps {
            let split = split_loss(&trainer.state().model, &heldout)?;
            let cols: Vec<String> = split
                .iter()
                .map(|(l, a, n)| format!("{l:.3} ({:.0}%, n={n})", a * 100.0))
                .collect();
            println!(
                "{:4} {:5.0} {:5.0} {:.3} | {}",
                step + 1,
                start.elapsed().as_secs_f64(),
                trained as f64 / train_secs,
                s.loss,
                cols.join("  ")
            );
        }
    }
    Ok(())
}

/// Warm-up on a synthetic copy task before SFT: 32 rows of filler words, `next: ` and an
/// 8-character path-like string, more filler, `|`, the string again; loss on the copy.
fn copy_warmup(vs: &nn::VarStore, model: &MoePolicy, steps: usize) -> Result<(), Error> {
    use tch::nn::OptimizerConfig;
    use tch::Tensor;
    let mut opt = nn::AdamW::default().build(vs, 2e-3)?;
    let alnum: Vec<i64> = (b'a'..=b'z').chain(b'0'..=b'9').map(i64::from).collect();
    let words: Vec<i64> = (b'a'..=b'z')
        .chain([b' ', b' ', b' ', b' '])
        .map(i64::from)
        .collect();
    let (b, n, filler) = (32i64, 8i64, 48i64);
    let pick = |set: &[i64], shape: [i64; 2]| {
        let idx = Tensor::randint(set.len() as i64, shape, (Kind::Int64, Device::Cpu));
        Tensor::from_slice(set)
            .index_select(0, &idx.view([-1]))
            .view(shape)
    };
    let marker: Vec<i64> = b"next: ".iter().map(|&c| i64::from(c)).collect();
    let marker = Tensor::from_slice(&marker)
        .view([1, 6])
        .expand([b, 6], false);
    let bar = Tensor::full([b, 1], i64::from(b'|'), (Kind::Int64, Device::Cpu));
    for step in 1..=steps {
        let k = (step as i64 * 7919) % (filler + 1);
        let s = pick(&alnum, [b, n]);
        let seq = Tensor::cat(
            &[
                &pick(&words, [b, k]),
                &marker,
                &s,
                &pick(&words, [b, filler - k]),
                &bar,
                &s,
            ],
            1,
        );
        let t = seq.size()[1];
        let out = model.forward(&seq.narrow(1, 0, t - 1), true)?;
        let loss = out
            .logits_btv
            .narrow(1, t - 1 - n, n)
            .reshape([-1, model.config().vocab_size])
            .cross_entropy_for_logits(&seq.narrow(1, t - n, n).reshape([-1]));
        opt.zero_grad();
        (&loss + &out.aux_loss).backward();
        opt.clip_grad_norm(1.0);
        opt.step();
        if step % 50 == 0 {
            println!(
                "copy warm-up step {step}: copy loss {:.3}",
                loss.double_value(&[])
            );
        }
    }
    Ok(())
}

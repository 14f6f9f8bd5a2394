//! Dumps the SFT demonstration stream (bucket layout: one demonstration per row) as JSONL
//! `{"tokens": [...], "mask": [...]}` (mask[i]: targets[i] = tokens[i+1] is trained on).
//!
//! ```text
//! cargo run --release -p corvid-learner --example sft_dump -- STEPS LEVELS OUT [heldout-out]
//! ```
mod common;

use std::collections::BTreeMap;
use std::io::Write;

use common::arg;
use corvid_learner::sft_data::SftData;
use corvid_learner::train::pack::PackedRow;
use corvid_learner::train::{SftConfig, SftLayout};
use corvid_tasks::Families;

type Error = Box<dyn std::error::Error>;

fn write_rows(out: &mut impl Write, rows: &[PackedRow]) -> Result<(), Error> {
    for r in rows {
        let n = r.doc_ids.iter().filter(|d| **d == 0).count();
        let line = serde_json::json!({"tokens": &r.tokens[..n], "mask": &r.loss_mask[..n]});
        writeln!(out, "{line}")?;
    }
    Ok(())
}

fn main() -> Result<(), Error> {
    let steps: u64 = arg(1, "100").parse()?;
    let levels: Vec<u32> = arg(2, "1,2")
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let cfg = SftConfig {
        steps,
        batch_tokens: 4608,
        seq_len: 768,
        layout: SftLayout::Bucket,
        micro_batch_tokens: 4608,
        levels: BTreeMap::from([("hops".to_string(), levels)]),
        heldout_per_level: 64,
        ..SftConfig::default()
    };
    let mut data = SftData::new(
        &cfg,
        &Families::default(),
        corvid_episode::EpisodeFormat::default(),
    )?;
    let mut out = std::io::BufWriter::new(std::fs::File::create(arg(3, "sft.jsonl"))?);
    for step in 0..steps {
        write_rows(&mut out, &data.step_rows(step)?)?;
    }
    let mut held = std::io::BufWriter::new(std::fs::File::create(arg(4, "heldout.jsonl"))?);
    write_rows(&mut held, &data.heldout_rows()?)?;
    Ok(())
}

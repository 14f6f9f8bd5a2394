//! SFT: packed documents see only themselves, the loss falls on a small fixed set, and a
//! resumed optimizer continues bit for bit.

use corvid_learner::train::pack::{PackedBatch, PackedRow};
use corvid_learner::train::sft::{pack, Example};
use corvid_learner::train::{OptimConfig, SftConfig, SftTrainer};
use corvid_model::{checkpoint, ModelConfig, MoePolicy};
use corvid_tokenizer::{ByteTokenizer, Special};
use tch::{nn, Device, Tensor};

fn model_cfg() -> ModelConfig {
    ModelConfig {
        num_hidden_layers: 2,
        ..ModelConfig::tiny()
    }
}

fn new_model(seed: i64) -> (nn::VarStore, MoePolicy) {
    tch::manual_seed(seed);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = MoePolicy::new(&vs.root(), &model_cfg()).unwrap();
    (vs, model)
}

/// `<|user|>question<|end|><|assistant|>answer<|end|>`, trained on the answer and its end.
fn example(q: &str, a: &str) -> Example {
    let tok = ByteTokenizer::new();
    let mut ids = vec![Special::User.id()];
    ids.extend(tok.encode_plain(q));
    ids.push(Special::End.id());
    ids.push(Special::Assistant.id());
    let prompt = ids.len();
    ids.extend(tok.encode_plain(a));
    ids.push(Special::End.id());
    let mask = (0..ids.len()).map(|i| i >= prompt).collect();
    Example { ids, mask }
}

#[test]
fn each_packed_document_has_the_logits_it_has_alone() {
    let (_vs, model) = new_model(1);
    packed_documents_match_alone(&model);
}

/// With a 3-tap latent token shift (random shift weights: they start at zero) no tap may
/// reach across a document boundary inside a packed row.
#[test]
fn a_multi_tap_token_shift_stays_inside_each_packed_document() {
    tch::manual_seed(2);
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = ModelConfig {
        latent_token_shift: true,
        latent_shift_taps: 3,
        ..model_cfg()
    };
    let model = MoePolicy::new(&vs.root(), &cfg).unwrap();
    let mut shifted = 0;
    tch::no_grad(|| {
        for (name, mut t) in vs.variables() {
            if name.contains("kv_shift_proj") {
                t.copy_(&(t.randn_like() * 0.5));
                shifted += 1;
            }
        }
    });
    assert_eq!(shifted, 2 * 3, "one projection per tap and layer");
    packed_documents_match_alone(&model);
}

fn packed_documents_match_alone(model: &MoePolicy) {
    let docs = [
        example("what is 2+3?", "5"),
        example("name a colour", "teal, obviously"),
        example("hi", "hello there"),
    ];
    let pad = Special::Pad.id();
    let packing = pack(&docs, 96, pad).unwrap();
    assert_eq!(packing.rows.len(), 1, "all three fit one row");
    assert!(packing.too_long.is_empty());
    let row = &packing.rows[0];
    let t = row.len() as i64;
    let as_t = |v: &Vec<i64>| Tensor::from_slice(v).view([1, t]);
    let packed = tch::no_grad(|| {
        model
            .forward_packed(
                &as_t(&row.tokens),
                &as_t(&row.positions),
                &as_t(&row.doc_ids),
                false,
            )
            .unwrap()
            .logits_btv
    });
    // Packing places documents longest first; find each by its doc id.
    let mut seen = 0;
    for doc in 0..3i64 {
        let cols: Vec<i64> = (0..t).filter(|&i| row.doc_ids[i as usize] == doc).collect();
        let start = cols[0];
        let n = cols.len() as i64;
        let ids: Vec<i64> = row.tokens[start as usize..(start + n) as usize].to_vec();
        let alone = tch::no_grad(|| {
            model
                .forward(&Tensor::from_slice(&ids).view([1, n]), false)
                .unwrap()
                .logits_btv
        });
        let got = packed.narrow(1, start, n);
        let diff = (&got - &alone).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "document {doc}: max |Δlogit| = {diff}");
        seen += n;
    }
    assert_eq!(
        seen as usize,
        docs.iter().map(|d| d.ids.len()).sum::<usize>()
    );
    // The mask matters: the same row run causally across documents differs.
    let plain = tch::no_grad(|| model.forward(&as_t(&row.tokens), false).unwrap().logits_btv);
    let diff = (&plain - &packed).abs().max().double_value(&[]);
    assert!(diff > 1e-3, "plain causal attention gave the packed logits");
}

#[test]
fn pack_drops_what_does_not_fit_and_masks_prompts() {
    let docs = [example("a", "b"), example(&"x".repeat(100), "y")];
    let packing = pack(&docs, 32, Special::Pad.id()).unwrap();
    assert_eq!(packing.too_long, vec![1]);
    let row = &packing.rows[0];
    // Trained targets are the answer "b" and its <|end|>.
    let trained: Vec<i64> = row
        .targets
        .iter()
        .zip(&row.loss_mask)
        .filter(|(_, m)| **m)
        .map(|(t, _)| *t)
        .collect();
    assert_eq!(trained, vec![b'b' as i64, Special::End.id() as i64]);
    let bad = Example {
        ids: vec![1, 2],
        mask: vec![true],
    };
    assert!(pack(&[bad], 8, 0).is_err());
}

fn sft_cfg(steps: u64) -> SftConfig {
    SftConfig {
        steps,
        seq_len: 128,
        batch_tokens: 512,
        micro_batch_tokens: 256,
        optim: OptimConfig {
            lr: 3e-3,
            warmup_steps: 5,
            total_steps: steps,
            ..OptimConfig::default()
        },
        ..SftConfig::default()
    }
}

fn fixed_set() -> Vec<Example> {
    (0..12)
        .map(|i| {
            let a = (i * 7 + 3) % 10;
            example(&format!("item {i}: key?"), &format!("key {a}{a} ok"))
        })
        .collect()
}

#[test]
fn loss_falls_when_overfitting_a_small_fixed_set() {
    let (vs, model) = new_model(2);
    let rows = pack(&fixed_set(), 128, Special::Pad.id()).unwrap().rows;
    assert!(
        rows.len() >= 2,
        "two micro-batches at least: {}",
        rows.len()
    );
    let mut trainer = SftTrainer::new(vs, model, sft_cfg(40)).unwrap();
    let start = trainer.eval_loss(&rows).unwrap();
    let mut last = None;
    while !trainer.done() {
        last = Some(trainer.step(&rows).unwrap());
    }
    let last = last.unwrap();
    let end = trainer.eval_loss(&rows).unwrap();
    assert_eq!(trainer.state().opt.step_count(), 40);
    assert!(
        start > 4.0,
        "an untrained byte model starts near ln 264 = 5.6: {start}"
    );
    assert!(end < 0.3 * start, "held-in loss {start} -> {end}");
    assert!(last.grad_norm.is_finite() && last.tokens > 0);
}

fn snapshot(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let mut p: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .map(|(n, t)| (n, t.copy()))
        .collect();
    p.sort_by(|a, b| a.0.cmp(&b.0));
    p
}

#[test]
fn a_resumed_optimizer_gives_bit_identical_parameters() {
    let rows = pack(&fixed_set(), 128, Special::Pad.id()).unwrap().rows;
    // Uninterrupted: 6 steps.
    let (vs, model) = new_model(3);
    let mut a = SftTrainer::new(vs, model, sft_cfg(6)).unwrap();
    for _ in 0..3 {
        a.step(&rows).unwrap();
    }
    let weights = checkpoint::weights_to_bytes(&a.state().vs).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let opt_path = dir.path().join("optimizer.safetensors");
    a.state().opt.save(&opt_path).unwrap();
    for _ in 0..3 {
        a.step(&rows).unwrap();
    }
    // Resumed: a fresh model (different init) loads the weights and the optimizer state.
    let (vs, model) = new_model(99);
    checkpoint::load_weights_from_bytes(&vs, &weights).unwrap();
    let mut b = SftTrainer::new(vs, model, sft_cfg(6)).unwrap();
    b.state_mut().opt.load(&opt_path).unwrap();
    assert_eq!(b.state().opt.step_count(), 3);
    for _ in 0..3 {
        b.step(&rows).unwrap();
    }
    let (pa, pb) = (snapshot(&a.state().vs), snapshot(&b.state().vs));
    assert_eq!(pa.len(), pb.len());
    for ((n, x), (_, y)) in pa.iter().zip(&pb) {
        assert!(x.equal(y), "{n} differs after resume");
    }
    // And the comparison can fail: without the optimizer state the result differs.
    let (vs, model) = new_model(99);
    checkpoint::load_weights_from_bytes(&vs, &weights).unwrap();
    let mut c = SftTrainer::new(vs, model, sft_cfg(6)).unwrap();
    for _ in 0..3 {
        c.step(&rows).unwrap();
    }
    let pc = snapshot(&c.state().vs);
    assert!(pa.iter().zip(&pc).any(|((_, x), (_, y))| !x.equal(y)));
}

/// The bucketed layout (one document per row, rows of unequal length padded in the batch,
/// causal forward without a mask) scores every trained-on token as the packed layout does.
#[test]
fn bucketed_rows_give_the_packed_loss_and_gradients() {
    let docs = fixed_set();
    let packed = pack(&docs, 128, Special::Pad.id()).unwrap().rows;
    let mut bucketed: Vec<PackedRow> = docs
        .iter()
        .map(|e| PackedRow::single(&e.ids, &e.mask, Special::Pad.id()))
        .collect();
    bucketed.sort_by_key(|r| std::cmp::Reverse(r.len()));
    assert!(bucketed.first().unwrap().len() > bucketed.last().unwrap().len());
    let refs: Vec<&PackedRow> = bucketed.iter().collect();
    let batch = PackedBatch::new(&refs, Device::Cpu).unwrap();
    assert!(batch.single_document, "one document per row is detected");
    assert!(
        !PackedBatch::new(&[&packed[0]], Device::Cpu)
            .unwrap()
            .single_document
    );

    // One initialisation for both (other tests draw from the global RNG concurrently).
    let weights = checkpoint::weights_to_bytes(&new_model(4).0).unwrap();
    let grads = |rows: &[PackedRow]| {
        let (vs, model) = new_model(5);
        checkpoint::load_weights_from_bytes(&vs, &weights).unwrap();
        let mut t = SftTrainer::new(vs, model, sft_cfg(1)).unwrap();
        let loss = t.eval_loss(rows).unwrap();
        let step = t.step(rows).unwrap();
        (loss, step.loss, step.grad_norm, step.tokens)
    };
    let (lp, sp, gp, np) = grads(&packed);
    let (lb, sb, gb, nb) = grads(&bucketed);
    assert_eq!(np, nb, "same trained-on tokens");
    assert!((lp - lb).abs() < 1e-5, "held-out loss {lp} vs {lb}");
    assert!((sp - sb).abs() < 1e-5, "step loss {sp} vs {sb}");
    assert!(
        (gp - gb).abs() < 1e-4 * gp.max(1.0),
        "grad norm {gp} vs {gb}"
    );
}

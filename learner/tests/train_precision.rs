//! bf16 weights with fp32 routers and fp32 master weights, forced on the CPU (the trainer
//! picks bf16 on CUDA only): SFT trains, a run checkpoint resumes bit for bit in bf16 (and
//! not without its master weights), and a fresh fp32 CPU policy loads the checkpoint.

use corvid_learner::checkpoint::{CheckpointDir, RunState, Snapshot, Stage, Totals, STATE_FORMAT};
use corvid_learner::dispenser::DispenserState;
use corvid_learner::metrics::SpikeDetector;
use corvid_learner::train::pack::PackedRow;
use corvid_learner::train::sft::{pack, Example};
use corvid_learner::train::{OptimConfig, SftConfig, SftTrainer};
use corvid_learner::trainer::build_model;
use corvid_model::precision::is_router_param;
use corvid_model::{checkpoint, ModelConfig};
use corvid_tasks::{Curriculum, CurriculumConfig, SplitMix64};
use corvid_tokenizer::{ByteTokenizer, Special};
use tch::{nn, Device, Kind, Tensor};

fn model_cfg() -> ModelConfig {
    ModelConfig {
        num_hidden_layers: 2,
        hidden_size: 64,
        num_attention_heads: 2,
        intermediate_size: 128,
        n_routed_experts: 4,
        moe_intermediate_size: 64,
        ..ModelConfig::tiny()
    }
}

fn sft_cfg() -> SftConfig {
    SftConfig {
        steps: 100,
        seq_len: 128,
        batch_tokens: 512,
        micro_batch_tokens: 256,
        optim: OptimConfig {
            lr: 3e-3,
            warmup_steps: 2,
            total_steps: 100,
            ..OptimConfig::default()
        },
        ..SftConfig::default()
    }
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

fn rows() -> Vec<PackedRow> {
    let docs: Vec<Example> = (0..6)
        .map(|i| {
            let a = (i * 7 + 3) % 10;
            example(&format!("item {i}: key?"), &format!("key {a}{a} ok"))
        })
        .collect();
    pack(&docs, 128, Special::Pad.id()).unwrap().rows
}

fn run_state() -> RunState {
    RunState {
        format: STATE_FORMAT,
        seq: 0,
        stage: Stage::Sft,
        sft_step: 0,
        sft_tokens: 0,
        sft_heldout_loss: None,
        rl_step: 0,
        policy_version: 0,
        read_cursor: 0,
        pending: Vec::new(),
        taken_groups: Vec::new(),
        rng: SplitMix64::new(1),
        dispenser: DispenserState::new(1),
        spikes: SpikeDetector::new(4.0, 10, 3),
        totals: Totals::default(),
        reference_policy: None,
        saved_unix_ms: 0,
    }
}

/// Every variable is bf16 except the routers, which are fp32.
fn assert_bf16_with_fp32_routers(vs: &nn::VarStore) {
    let mut routers = 0;
    for (name, t) in vs.variables() {
        if is_router_param(&name) {
            routers += 1;
            assert_eq!(t.kind(), Kind::Float, "{name}");
        } else {
            assert_eq!(t.kind(), Kind::BFloat16, "{name}");
        }
    }
    assert!(routers > 0, "the tiny model has MoE layers");
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

fn bf16_trainer(seed: u64) -> SftTrainer {
    let (vs, model) = build_model(&model_cfg(), Device::Cpu, Kind::BFloat16, seed).unwrap();
    SftTrainer::new(vs, model, sft_cfg()).unwrap()
}

#[test]
fn bf16_sft_checkpoints_resume_exactly_and_load_into_an_fp32_policy() {
    let rows = rows();
    let cfg = model_cfg();
    let mut t = bf16_trainer(7);
    assert_bf16_with_fp32_routers(&t.state().vs);
    let bf16_trainable = t
        .state()
        .vs
        .variables()
        .values()
        .filter(|v| v.requires_grad() && v.kind() == Kind::BFloat16)
        .count();
    assert!(bf16_trainable > 0);
    assert_eq!(t.state().opt.master_count(), bf16_trainable);

    // A few SFT steps: the loss is finite and falls.
    let start = t.eval_loss(&rows).unwrap();
    let mut losses = Vec::new();
    for _ in 0..8 {
        let s = t.step(&rows).unwrap();
        assert!(s.loss.is_finite() && s.grad_norm.is_finite(), "{s:?}");
        losses.push(s.loss);
    }
    let end = t.eval_loss(&rows).unwrap();
    assert!(
        start > 4.0,
        "an untrained byte model starts near ln 264: {start}"
    );
    assert!(
        end < start - 1.0,
        "held-in loss {start} -> {end} ({losses:?})"
    );
    assert!(losses[7] < losses[0], "{losses:?}");
    assert_bf16_with_fp32_routers(&t.state().vs);

    // The run checkpoint, written as the trainer writes it.
    let dir = tempfile::tempdir().unwrap();
    let ck = CheckpointDir::open(dir.path().join("ckpt"), 2).unwrap();
    let curriculum = Curriculum::new(CurriculumConfig::default(), &[("hops", 3)], 2).unwrap();
    let path = ck
        .save(Snapshot {
            vs: &t.state().vs,
            model_config: &cfg,
            optimizer: t.state().opt.state_tensors(),
            curriculum: &curriculum,
            state: run_state(),
            hf_origin: None,
        })
        .unwrap();
    let at_save = snapshot(&t.state().vs);
    for _ in 0..3 {
        t.step(&rows).unwrap();
    }
    let continued = snapshot(&t.state().vs);

    // Resumed in bf16 from the checkpoint (another initialisation, overwritten).
    let restored = CheckpointDir::load(&path).unwrap();
    let masters = restored
        .optimizer
        .iter()
        .filter(|(n, _)| n.starts_with("master."))
        .count();
    assert_eq!(masters, bf16_trainable, "the masters are in the checkpoint");
    let resume = |optimizer: &[(String, Tensor)]| {
        let (vs, model) = build_model(&cfg, Device::Cpu, Kind::BFloat16, 99).unwrap();
        restored.load_weights(&vs).unwrap();
        let mut r = SftTrainer::new(vs, model, sft_cfg()).unwrap();
        r.state_mut().opt.load_state(optimizer).unwrap();
        for _ in 0..3 {
            r.step(&rows).unwrap();
        }
        snapshot(&r.state().vs)
    };
    let resumed = resume(&restored.optimizer);
    for ((n, x), (_, y)) in continued.iter().zip(&resumed) {
        assert!(x.equal(y), "{n} differs after resume");
    }
    // Without the master weights (rebuilt from the rounded bf16 weights) it differs.
    let no_masters: Vec<(String, Tensor)> = restored
        .optimizer
        .iter()
        .filter(|(n, _)| !n.starts_with("master."))
        .map(|(n, x)| (n.clone(), x.shallow_clone()))
        .collect();
    let rebuilt = resume(&no_masters);
    assert!(continued
        .iter()
        .zip(&rebuilt)
        .any(|((_, x), (_, y))| !x.equal(y)));

    // A fresh fp32 policy on the CPU loads the checkpoint: every weight is the bf16 one,
    // exactly, and it scores the rows as the bf16 model does, up to bf16 activations.
    let (vs32, model32) = checkpoint::load(&path, Device::Cpu).unwrap();
    let loaded = snapshot(&vs32);
    assert_eq!(loaded.len(), at_save.len());
    for ((n, x), (_, y)) in loaded.iter().zip(&at_save) {
        assert_eq!(x.kind(), Kind::Float, "{n}");
        assert!(x.equal(&y.to_kind(Kind::Float)), "{n} differs in fp32");
    }
    let bf16_at_save = {
        let (vs, model) = build_model(&cfg, Device::Cpu, Kind::BFloat16, 5).unwrap();
        restored.load_weights(&vs).unwrap();
        SftTrainer::new(vs, model, sft_cfg())
            .unwrap()
            .eval_loss(&rows)
            .unwrap()
    };
    let fp32_loss = SftTrainer::new(vs32, model32, sft_cfg())
        .unwrap()
        .eval_loss(&rows)
        .unwrap();
    assert!(
        (fp32_loss - bf16_at_save).abs() < 0.05 * bf16_at_save,
        "fp32 {fp32_loss} vs bf16 {bf16_at_save}"
    );
}

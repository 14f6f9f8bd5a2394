//! Long trajectories in the RL trainer: an update on a single 16K-token trajectory of the
//! tiny model (checkpointed blocks, chunked logits) trains; one over `max_train_tokens` is
//! skipped and counted while the update goes on; checkpointing does not change the update.

use corvid_learner::train::config::TrainConfig;
use corvid_learner::train::{AdvantageMode, OptimConfig, RlConfig, RlTrainer};
use corvid_model::{Checkpoint, ModelConfig, MoePolicy};
use corvid_proto::{
    SamplingParams, Step, TaskRef, Termination, Trajectory, TrajectoryFooter, TrajectoryHeader,
};
use corvid_tokenizer::Special;
use tch::{nn, Device, Kind, Tensor};

fn model(context: i64, seed: i64) -> (nn::VarStore, MoePolicy) {
    tch::manual_seed(seed);
    let cfg = ModelConfig {
        max_position_embeddings: context,
        ..ModelConfig::tiny()
    };
    let vs = nn::VarStore::new(Device::Cpu);
    let model = MoePolicy::new(&vs.root(), &cfg).unwrap();
    (vs, model)
}

/// A trajectory of `len` tokens: a 64-token prompt, then generated tokens (behaviour
/// log-prob −5.5, about uniform over 264 ids) scored `reward`.
fn trajectory(id: &str, len: usize, reward: f32, seed: u64) -> Trajectory {
    let mut x = seed;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((x >> 33) % 250) as u32
    };
    let prompt: Vec<u32> = (0..64).map(|_| next()).collect();
    let mut s = Step::context(0, prompt);
    for _ in 64..len {
        s.token_ids.push(next());
        s.loss_mask.push(true);
        s.logprobs.push(-5.5);
    }
    Trajectory {
        header: TrajectoryHeader {
            trajectory_id: id.into(),
            task: TaskRef {
                family: "toy".into(),
                level: 1,
                seed: 0,
                spec_hash: "0".into(),
            },
            actor_id: "test".into(),
            policy_version: 0,
            sampling: SamplingParams::default(),
            group_id: "g".into(),
            started_unix_ms: 0,
            routes: None,
            context: None,
        },
        footer: TrajectoryFooter {
            outcome_reward: reward,
            success: reward > 0.5,
            termination: Termination::Answered,
            step_count: 1,
            token_count: len as u64,
            generated_token_count: (len - 64) as u64,
            wall_ms: 0,
            finished_unix_ms: 0,
            template_divergent: false,
        },
        steps: vec![s],
    }
}

fn config(train: TrainConfig) -> RlConfig {
    RlConfig {
        train,
        advantage: AdvantageMode::Grpo,
        micro_batch_tokens: 4096,
        optim: OptimConfig {
            lr: 1e-3,
            warmup_steps: 0,
            ..OptimConfig::default()
        },
        ..RlConfig::default()
    }
}

fn weights(vs: &nn::VarStore) -> Tensor {
    let mut v: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    Tensor::cat(&v.iter().map(|(_, t)| t.view([-1])).collect::<Vec<_>>(), 0)
}

#[test]
fn an_update_on_one_16k_token_trajectory_trains() {
    tch::set_num_threads(2);
    let (vs, m) = model(16_384, 1);
    let before = weights(&vs).copy();
    // The long trajectory succeeded, a short one of its group did not: only their
    // advantages differ from zero.
    let group = vec![
        trajectory("long", 16_384, 1.0, 7),
        trajectory("short", 200, 0.0, 8),
    ];
    let train = TrainConfig {
        checkpoint: Checkpoint::Blocks,
        ..TrainConfig::default()
    };
    let mut trainer = RlTrainer::new(vs, m, None, config(train), Special::Pad.id()).unwrap();
    let st = trainer.update(&[group], 0).unwrap();
    assert_eq!(st.optimizer_steps, 1, "{st:?}");
    assert_eq!(st.trajectories_used, 2);
    assert_eq!(st.too_long_skipped, 0);
    // Every generated token follows another token of its trajectory: each is trained on.
    assert_eq!(st.tokens, (16_384 - 64) + (200 - 64));
    assert_eq!(st.total_tokens, 16_384 + 200);
    assert!(
        st.entropy > 5.0 && st.entropy < 5.6,
        "a fresh policy is near uniform: {st:?}"
    );
    assert!(st.grad_norm.is_finite() && st.grad_norm > 0.0, "{st:?}");
    let after = weights(&trainer.state().vs);
    assert!(after.isfinite().all().int64_value(&[]) == 1);
    let moved = (&after - &before).abs().max().double_value(&[]);
    assert!(moved > 1e-5, "the update changed no weight");
}

#[test]
fn a_trajectory_over_max_train_tokens_is_skipped_and_counted_and_the_update_goes_on() {
    let (vs, m) = model(4096, 2);
    let group = vec![
        trajectory("long", 1500, 1.0, 1),
        trajectory("a", 300, 1.0, 2),
        trajectory("b", 300, 0.0, 3),
    ];
    let train = TrainConfig {
        max_train_tokens: 1024,
        ..TrainConfig::default()
    };
    let mut trainer = RlTrainer::new(vs, m, None, config(train), Special::Pad.id()).unwrap();
    let st = trainer.update(&[group], 0).unwrap();
    assert_eq!(st.too_long_skipped, 1, "{st:?}");
    assert_eq!(st.trajectories_used, 2);
    assert_eq!(st.optimizer_steps, 1);
    assert_eq!(st.total_tokens, 600);
}

#[test]
fn checkpointed_and_chunked_updates_give_the_same_gradients() {
    let group = vec![
        trajectory("a", 900, 1.0, 4),
        trajectory("b", 500, 0.0, 5),
        trajectory("c", 700, 0.5, 6),
    ];
    let grads = |train: TrainConfig| {
        let (vs, m) = model(1024, 3);
        let mut trainer = RlTrainer::new(vs, m, None, config(train), Special::Pad.id()).unwrap();
        let st = trainer
            .backward_only(std::slice::from_ref(&group), 0, &[])
            .unwrap();
        let mut g: Vec<(String, Tensor)> = trainer
            .state()
            .vs
            .variables()
            .into_iter()
            .filter(|(_, v)| v.grad().defined())
            .map(|(n, v)| (n, v.grad().copy()))
            .collect();
        g.sort_by(|a, b| a.0.cmp(&b.0));
        (st, g)
    };
    let (st_a, plain) = grads(TrainConfig::default());
    // Blocks recomputed, and logits 993 positions at a time (1 MiB at 264 ids): the ~1,900
    // generated tokens of the micro-batch take two chunks.
    let (st_b, other) = grads(TrainConfig {
        checkpoint: Checkpoint::Blocks,
        logit_chunk_mib: 1,
        ..TrainConfig::default()
    });
    assert!((st_a.policy_loss - st_b.policy_loss).abs() < 1e-6);
    assert!((st_a.entropy - st_b.entropy).abs() < 1e-5);
    assert_eq!(plain.len(), other.len());
    for ((name, a), (_, b)) in plain.iter().zip(&other) {
        let a = a.to_kind(Kind::Double);
        let b = b.to_kind(Kind::Double);
        let rel = (&a - &b).norm().double_value(&[]) / a.norm().double_value(&[]).max(1e-30);
        assert!(rel < 1e-5, "{name}: {rel:e}");
    }
}

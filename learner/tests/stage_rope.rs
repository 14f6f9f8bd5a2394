//! RoPE scaling that moves with the curriculum's context stages (`[rollout.context]
//! stage_rope`): each policy version is published under the scaling of the stage at its
//! publication (the blob names it, so actors decode it so), trained under it, recorded in the
//! metrics and the checkpoint, and put back on resume; SFT demonstrations fold at the first
//! stage's window; a config that cannot scale by stage is refused with the field named.

use std::path::Path;
use std::sync::Arc;

use corvid_learner::checkpoint::CheckpointDir;
use corvid_learner::config::{LearnerConfig, StageRope};
use corvid_learner::learner::{prepare, Shared, Trainer};
use corvid_learner::metrics::UpdateRecord;
use corvid_model::checkpoint::rope_in_bytes;
use corvid_model::RopeScaling;
use corvid_proto::{Step, Termination, TrajectoryFooter, TrajectoryHeader};
use corvid_store::Begin;

/// A tiny learner whose windows follow two context stages, 256 tokens from level 1 and 1,024
/// from level 2, with `rope` (`stage_rope = "<rope>"`); `extra` is appended.
fn config(dir: &Path, rope: &str, extra: &str) -> Result<LearnerConfig, String> {
    let text = format!(
        r#"
run_name = "stage-rope"
run_dir = "{}"
listen = "127.0.0.1:0"
seed = 5
threads = 1

[model]
preset = "tiny"
[model.overrides]
hidden_size = 32
num_hidden_layers = 2
num_attention_heads = 2
kv_lora_rank = 16
qk_nope_head_dim = 16
qk_rope_head_dim = 8
v_head_dim = 16
intermediate_size = 64
n_routed_experts = 4
num_experts_per_tok = 2
moe_intermediate_size = 16
max_position_embeddings = 1024

[tasks]
families = ["hops"]
max_levels = {{ hops = 3 }}

[curriculum]
window = 8
min_samples = 4
context_stages = [{{ min_level = 1, context_tokens = 256 }}, {{ min_level = 2, context_tokens = 1024 }}]

[rollout]
max_open_groups = 8
[rollout.sampling]
max_new_tokens = 32
[rollout.context]
window_tokens = 1024
fold = "drop_tool_output"
follow_curriculum = true
stage_rope = "{rope}"

[rl]
group_size = 2
groups_per_update = 1
staleness_bound = 100
micro_batch_tokens = 512

[schedule]
sft = false
checkpoint_every = 100
poll_ms = 10

[metrics]
prometheus = ""
{extra}
"#,
        dir.join("run").display()
    );
    LearnerConfig::from_toml(&text).map_err(|e| e.to_string())
}

fn open(cfg: LearnerConfig, resume: bool) -> (Trainer, Shared) {
    let p = prepare(cfg, resume).unwrap();
    let shared = p.shared.clone();
    let t = Trainer::new(p.cfg, p.paths, p.model_config, p.shared, p.restored).unwrap();
    (t, shared)
}

/// One group's episodes, stored as an actor would: a short turn, the second member
/// successful.
fn feed_group(shared: &Shared, tag: &str, version: u64) {
    let d = &shared.control.dispenser;
    for (i, a) in d.next("actor-1", 2).unwrap().iter().enumerate() {
        let mut s = Step::context(0, (0..12).map(|t| 40 + t).collect());
        s.token_ids.extend(60..70);
        s.loss_mask.extend([true; 10]);
        s.logprobs.extend([-5.5; 10]);
        s.policy_version = version;
        let header = TrajectoryHeader {
            trajectory_id: format!("{tag}-{i}"),
            task: a.task.clone(),
            actor_id: "actor-1".into(),
            policy_version: version,
            sampling: a.sampling,
            group_id: a.group_id.clone(),
            started_unix_ms: 1,
            routes: None,
            context: a.context.clone(),
        };
        let store: &Arc<_> = &shared.store;
        let Begin::New(mut w) = store.begin(header).unwrap() else {
            panic!("stored twice")
        };
        w.append(0, s).unwrap();
        w.finish_blocking(TrajectoryFooter {
            outcome_reward: i as f32,
            success: i == 1,
            termination: Termination::Answered,
            step_count: 1,
            token_count: 22,
            generated_token_count: 10,
            wall_ms: 1,
            finished_unix_ms: 2,
            template_divergent: false,
        })
        .unwrap();
        d.complete(&a.group_id, "actor-1", a.sampling.seed);
    }
}

/// The RoPE scaling the newest published blob names (`None` when it names none).
fn published_rope(shared: &Shared) -> Option<RopeScaling> {
    let blob = shared
        .control
        .policies
        .latest()
        .expect("a published policy");
    rope_in_bytes(&blob.bytes).unwrap()
}

#[test]
fn each_version_is_published_and_checkpointed_under_its_context_stage_s_rope() {
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "yarn", "").unwrap();
    let yarn = RopeScaling::hf_yarn(4.0, 256);
    assert_eq!(cfg.stage_rope_scaling(256), RopeScaling::None);
    assert_eq!(cfg.stage_rope_scaling(1024), yarn);
    // A stage past the run's window is the window's.
    assert_eq!(cfg.stage_rope_scaling(4096), yarn);
    // SFT is the first stage: its demonstrations fold at its window, unscaled.
    assert_eq!(cfg.sft_context().map(|c| c.window_tokens), Some(256));
    let (mut t, shared) = open(cfg, false);

    // Stage 1: the first versions run unscaled.
    feed_group(&shared, "a", 1);
    t.poll().unwrap();
    t.try_update().unwrap().expect("an update");
    assert_eq!(published_rope(&shared), None);

    // Level 2 admitted: the stage's window is 1,024 tokens. A checkpoint taken before the
    // next version keeps the published one's scaling, and a resumed learner publishes that
    // version again under it: a version never changes its scaling.
    {
        let mut c = shared.curriculum().lock().unwrap();
        while c.highest_admitted() < 2 {
            c.record("hops", 1, true).unwrap();
        }
        assert_eq!(c.context_tokens(), 1024);
    }
    let saved = t.checkpoint().unwrap();
    assert_eq!(
        CheckpointDir::load(&saved)
            .unwrap()
            .model_config
            .rope_scaling,
        RopeScaling::None
    );
    let unscaled = shared.control.policies.latest().unwrap().bytes.clone();
    drop(t);
    drop(shared);
    let (mut t, shared) = open(config(dir.path(), "yarn", "").unwrap(), true);
    assert!(t.try_update().unwrap().is_none(), "nothing new to train");
    assert_eq!(published_rope(&shared), None);
    assert!(shared.control.policies.latest().unwrap().bytes == unscaled);

    // The next version is published, and trained, under YaRN x4 over the first stage's 256.
    feed_group(&shared, "b", 2);
    t.poll().unwrap();
    let record: UpdateRecord = t.try_update().unwrap().expect("an update");
    assert_eq!(published_rope(&shared), Some(yarn));
    assert_eq!(record.curriculum.rope_factor, 4.0);
    assert_eq!(record.curriculum.context_tokens, 1024);
    feed_group(&shared, "c", 3);
    t.poll().unwrap();
    t.try_update().unwrap().expect("an update under YaRN");
    assert_eq!(published_rope(&shared), Some(yarn));

    // The checkpoint records the scaling, so evaluating it decodes as trained ...
    let saved = t.checkpoint().unwrap();
    let restored = CheckpointDir::load(&saved).unwrap();
    assert_eq!(restored.model_config.rope_scaling, yarn);
    let weights = t.weights().unwrap();
    assert_eq!(rope_in_bytes(&weights).unwrap(), Some(yarn));
    drop(t);
    drop(shared);

    // ... and a resumed learner publishes under it again, with the same weights.
    let (mut t, shared) = open(config(dir.path(), "yarn", "").unwrap(), true);
    assert!(t.try_update().unwrap().is_none(), "nothing new to train");
    assert_eq!(published_rope(&shared), Some(yarn));
    assert!(shared.control.policies.latest().unwrap().bytes == weights);
}

#[test]
fn a_run_that_cannot_scale_rope_by_stage_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    assert!(config(dir.path(), "linear", "").is_ok());
    let unfollowed = config(dir.path(), "yarn", "")
        .map(|mut c| {
            c.rollout.context.follow_curriculum = false;
            c.validate()
        })
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(
        unfollowed.contains("rollout.context.stage_rope")
            && unfollowed.contains("follow_curriculum"),
        "{unfollowed}"
    );
    let own = config(dir.path(), "yarn", "")
        .map(|mut c| {
            c.model.overrides.insert(
                "rope_scaling".into(),
                toml::Value::try_from(RopeScaling::Linear { factor: 2.0 }).unwrap(),
            );
            c.validate()
        })
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(
        own.contains("rollout.context.stage_rope") && own.contains("its own rope_scaling"),
        "{own}"
    );
    let unknown = config(dir.path(), "ntk", "").unwrap_err();
    assert!(
        unknown.contains("stage_rope") || unknown.contains("ntk"),
        "{unknown}"
    );
    assert_eq!(
        StageRope::Linear.scaling(512, 256),
        RopeScaling::Linear { factor: 2.0 }
    );
    assert_eq!(StageRope::Yarn.scaling(256, 256), RopeScaling::None);
}

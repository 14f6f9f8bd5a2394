//! Kill and resume: a learner checkpointed and restored has the same step, curriculum,
//! cursor, pending trajectories and weights, and its next update equals the one the
//! original would have made; after a simulated SIGKILL (dropped without a checkpoint) the
//! resumed learner loses no stored trajectory; and the whole process — gRPC, trainer
//! thread, stop signal — writes a checkpoint on stop and continues from it. Also: the
//! synchronous mode opens exactly one batch of groups per policy version, and an update's
//! metrics line carries the figures it promises.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corvid_learner::config::LearnerConfig;
use corvid_learner::dispenser::Assignment;
use corvid_learner::learner::{self, prepare, LearnerOptions, Shared, StopReason, Trainer};
use corvid_learner::metrics::UpdateRecord;
use corvid_proto::client::{connect, trajectory_parts};
use corvid_proto::{pb, Step, Termination, TrajectoryFooter, TrajectoryHeader};
use corvid_store::{Begin, TrajectoryStore};

/// A learner small enough to update in well under a second on one core.
fn config(dir: &Path) -> LearnerConfig {
    let text = format!(
        r#"
run_name = "resume-test"
run_dir = "{}"
listen = "127.0.0.1:0"
seed = 3
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

[rollout]
max_open_groups = 8

[rl]
group_size = 2
groups_per_update = 2
staleness_bound = 100
micro_batch_tokens = 512

[schedule]
sft = false
checkpoint_every = 100
poll_ms = 10

[metrics]
prometheus = ""
"#,
        dir.join("run").display()
    );
    LearnerConfig::from_toml(&text).unwrap()
}

/// SplitMix64, for trajectory contents that depend only on the id.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A trajectory for `a`: two turns of byte tokens (< 256, inside the vocabulary), the
/// second half of each generated, reward and success a function of the id.
fn episode(
    a: &Assignment,
    id: &str,
    version: u64,
) -> (TrajectoryHeader, Vec<Step>, TrajectoryFooter) {
    let mut state = id.bytes().fold(0u64, |h, b| mix(h ^ u64::from(b)));
    let mut steps = Vec::new();
    for turn in 0..2u32 {
        let (ctx, gen) = (12, 10);
        let mut s = Step::context(turn, Vec::new());
        s.loss_mask.clear();
        s.logprobs.clear();
        s.policy_version = version;
        for i in 0..ctx + gen {
            state = mix(state);
            s.token_ids.push((state % 256) as u32);
            let generated = i >= ctx;
            s.loss_mask.push(generated);
            s.logprobs.push(if generated { -5.5 } else { 0.0 });
        }
        s.process_reward = if state.is_multiple_of(2) { 0.1 } else { 0.0 };
        steps.push(s);
    }
    let success = mix(state).is_multiple_of(2);
    let header = TrajectoryHeader {
        trajectory_id: id.to_owned(),
        task: a.task.clone(),
        actor_id: "test".into(),
        policy_version: version,
        sampling: a.sampling,
        group_id: a.group_id.clone(),
        started_unix_ms: 1,
        routes: None,
        context: None,
    };
    let tokens: u64 = steps.iter().map(|s| s.token_ids.len() as u64).sum();
    let footer = TrajectoryFooter {
        outcome_reward: f32::from(u8::from(success)),
        success,
        termination: Termination::Answered,
        step_count: steps.len() as u64,
        token_count: tokens,
        generated_token_count: 20,
        wall_ms: 1,
        finished_unix_ms: 2,
        template_divergent: false,
    };
    (header, steps, footer)
}

fn store_one(store: &Arc<TrajectoryStore>, a: &Assignment, id: &str, version: u64) {
    let (h, steps, f) = episode(a, id, version);
    let Begin::New(mut w) = store.begin(h).unwrap() else {
        panic!("{id} stored twice")
    };
    for (seq, s) in steps.into_iter().enumerate() {
        w.append(seq as u64, s).unwrap();
    }
    w.finish_blocking(f).unwrap();
}

/// Opens `groups` groups from the dispenser and stores all their episodes, as actors would.
fn feed(shared: &Shared, groups: usize, version: u64, tag: &str) -> Vec<String> {
    let d = &shared.control.dispenser;
    let g = d.config().group_size as usize;
    let assignments = d.next("actor-1", (groups * g) as u32).unwrap();
    assert_eq!(assignments.len(), groups * g);
    let mut ids = Vec::new();
    for (i, a) in assignments.iter().enumerate() {
        let id = format!("{tag}-{i}");
        store_one(&shared.store, a, &id, version);
        d.complete(&a.group_id, "actor-1", a.sampling.seed);
        ids.push(id);
    }
    ids
}

fn open(dir: &Path, resume: bool) -> (Trainer, Shared) {
    open_with(config(dir), resume)
}

fn open_with(cfg: LearnerConfig, resume: bool) -> (Trainer, Shared) {
    let p = prepare(cfg, resume).unwrap();
    let shared = p.shared.clone();
    let t = Trainer::new(p.cfg, p.paths, p.model_config, p.shared, p.restored).unwrap();
    (t, shared)
}

fn metrics_steps(dir: &Path) -> Vec<u64> {
    std::fs::read_to_string(dir.join("run/metrics/metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<UpdateRecord>(l).unwrap().step)
        .collect()
}

#[test]
fn a_restored_learner_has_the_same_state_and_makes_the_same_next_update() {
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let (mut a, shared) = open(dir.path(), false);
    feed(&shared, 4, 1, "first");
    a.poll().unwrap();
    assert!(a.try_update().unwrap().is_some());
    assert!(a.try_update().unwrap().is_some());
    assert!(
        a.try_update().unwrap().is_none(),
        "only two updates' worth was fed"
    );
    // Two more groups, and one episode of a fifth that stays pending across the restart.
    feed(&shared, 2, 3, "second");
    let extra = shared.control.dispenser.next("actor-1", 1).unwrap();
    store_one(&shared.store, &extra[0], "lonely", 3);
    a.poll().unwrap();
    let first = &std::fs::read_to_string(dir.path().join("run/metrics/metrics.jsonl")).unwrap();
    let rec: UpdateRecord = serde_json::from_str(first.lines().next().unwrap()).unwrap();
    assert_eq!((rec.step, rec.policy_version), (1, 2));
    assert_eq!(rec.moe.len(), 2, "MoE health of both layers");
    assert!(rec
        .moe
        .iter()
        .all(|h| h.load.len() == 4 && (h.load.iter().sum::<f64>() - 1.0).abs() < 1e-6));
    assert_eq!(
        rec.rollout.success_by_task.keys().collect::<Vec<_>>(),
        ["hops/1"]
    );
    assert_eq!(rec.rollout.episodes, 4);
    assert_eq!(rec.rollout.success_by_task["hops/1"].episodes, 4);
    assert!(rec.rollout.episodes_trained <= 4);
    assert!(rec.loss.policy.is_finite() && rec.loss.grad_norm > 0.0 && rec.loss.lr > 0.0);
    assert!(rec.loss.entropy > 0.0 && rec.loss.iw_mean > 0.0);
    assert!(rec.rollout.tokens > 0 && rec.rollout.tokens_per_s > 0.0);
    let before = a.state();
    assert_eq!(before.rl_step, 2);
    assert_eq!(before.policy_version, 3);
    assert_eq!(before.pending.len(), 5);
    let weights = a.weights().unwrap();
    let curriculum = a.curriculum_json();
    a.checkpoint().unwrap();

    // The original goes on for one update.
    let next_a = a.try_update().unwrap().expect("a third update");
    let weights_after_a = a.weights().unwrap();
    assert_ne!(weights_after_a, weights, "the update changed the weights");
    drop(a);
    drop(shared);

    // The restored learner starts where the checkpoint was taken ...
    let (mut b, _shared) = open(dir.path(), true);
    let after = b.state();
    assert_eq!(after.rl_step, before.rl_step);
    assert_eq!(after.policy_version, before.policy_version);
    assert_eq!(after.read_cursor, before.read_cursor);
    assert_eq!(after.pending, before.pending);
    assert_eq!(after.rng, before.rng);
    assert_eq!(after.dispenser, before.dispenser);
    assert_eq!(after.spikes, before.spikes);
    assert_eq!(b.curriculum_json(), curriculum);
    assert!(b.weights().unwrap() == weights, "restored weights differ");
    assert_eq!(
        metrics_steps(dir.path()),
        vec![1, 2],
        "lines after the checkpoint are cut"
    );

    // ... and makes exactly the update the original made.
    b.poll().unwrap();
    let next_b = b
        .try_update()
        .unwrap()
        .expect("the resumed learner trains on");
    assert_eq!(next_b.step, 3);
    assert_eq!(next_b.loss, next_a.loss);
    assert!(
        b.weights().unwrap() == weights_after_a,
        "resumed update differs"
    );
    assert_eq!(metrics_steps(dir.path()), vec![1, 2, 3]);
}

#[test]
fn after_a_kill_without_checkpoint_no_stored_trajectory_is_lost() {
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let (mut a, shared) = open(dir.path(), false);
    let mut all: BTreeSet<String> = feed(&shared, 2, 1, "a").into_iter().collect();
    a.poll().unwrap();
    assert!(a.try_update().unwrap().is_some());
    a.checkpoint().unwrap();
    let trained_before: BTreeSet<String> = all.clone();
    // After the checkpoint: trained on but not checkpointed, read but pending, and stored
    // but never read. Then the process dies.
    all.extend(feed(&shared, 2, 2, "b"));
    a.poll().unwrap();
    assert!(a.try_update().unwrap().is_some());
    all.extend(feed(&shared, 1, 3, "c"));
    let extra = shared.control.dispenser.next("actor-1", 1).unwrap();
    store_one(&shared.store, &extra[0], "d-0", 3);
    all.insert("d-0".into());
    drop(a); // SIGKILL: no checkpoint, nothing flushed by the trainer
    drop(shared);

    let (mut b, shared) = open(dir.path(), true);
    assert_eq!(b.state().rl_step, 1);
    b.poll().unwrap();
    let pending: BTreeSet<String> = b.state().pending.into_iter().collect();
    assert!(
        pending.is_disjoint(&trained_before),
        "nothing trained before the checkpoint is trained again"
    );
    let covered: BTreeSet<String> = pending.union(&trained_before).cloned().collect();
    assert_eq!(
        covered, all,
        "every stored trajectory is trained or pending"
    );
    assert_eq!(shared.store.stats().unwrap().finished as usize, all.len());
    // It trains on: the two groups of "b", then "c" with the new group's partner.
    assert!(b.try_update().unwrap().is_some());
    assert_eq!(b.state().rl_step, 2);
}

#[test]
fn a_run_has_a_checkpoint_before_actors_can_fetch_its_first_policy() {
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let (mut a, shared) = open_with(cfg.clone(), false);
    assert!(shared.control.policies.latest().is_none());
    assert!(!learner::has_checkpoint(&cfg).unwrap());
    // Entering RL publishes version 1; actors fetch it and roll out at once.
    assert!(a.try_update().unwrap().is_none());
    assert_eq!(shared.control.policies.latest_version(), 1);
    assert!(
        learner::has_checkpoint(&cfg).unwrap(),
        "a published policy without a checkpoint: a kill now leaves a run that cannot resume"
    );
    // Killed with an episode of that policy stored: the restarted learner resumes
    // (`--resume-if-any`) and keeps it.
    let work = shared.control.dispenser.next("actor-1", 1).unwrap();
    store_one(&shared.store, &work[0], "first", 1);
    drop(a);
    drop(shared);
    assert!(learner::has_checkpoint(&cfg).unwrap());
    let (mut b, _shared) = open(dir.path(), true);
    b.poll().unwrap();
    assert_eq!(b.state().pending, vec!["first".to_owned()]);
}

/// The episodes of `assignments` as (group, task seed, sampler seed).
fn episodes_of(assignments: &[Assignment]) -> BTreeSet<(String, u64, u64)> {
    assignments
        .iter()
        .map(|a| (a.group_id.clone(), a.task.seed, a.sampling.seed))
        .collect()
}

#[test]
fn a_learner_killed_after_handing_out_groups_its_checkpoint_never_saw_hands_out_no_episode_twice() {
    let dir = tempfile::tempdir().unwrap();
    let (mut a, shared) = open(dir.path(), false);
    let d = &shared.control.dispenser;
    // One episode of group X is out at the checkpoint, its partner not yet.
    let x_first = d.next("actor-1", 1).unwrap();
    a.checkpoint().unwrap();
    // After it: X's partner and two new groups go out. X completes and one new group
    // delivers one episode; the rest are still running on actor-1 when the learner dies.
    let after = d.next("actor-1", 5).unwrap();
    let x = &x_first[0].group_id;
    assert_eq!(&after[0].group_id, x);
    for (i, e) in [&x_first[0], &after[0], &after[1]].into_iter().enumerate() {
        store_one(&shared.store, e, &format!("before-kill-{i}"), 1);
        d.complete(&e.group_id, "actor-1", e.sampling.seed);
    }
    let handed_out: BTreeSet<_> = episodes_of(&x_first)
        .union(&episodes_of(&after))
        .cloned()
        .collect();
    drop(a); // SIGKILL: the checkpoint knows one open group with one episode out
    drop(shared);

    let (_b, shared) = open(dir.path(), true);
    let d = &shared.control.dispenser;
    assert!(
        !d.is_open(x),
        "X's episodes were all stored after the checkpoint: it is complete, not waiting out its timeout"
    );
    // actor-2 asks for work: nothing it gets was handed out before the kill, by group id
    // or by draw.
    let fresh = d.next("actor-2", 8).unwrap();
    assert_eq!(fresh.len(), 8);
    let fresh = episodes_of(&fresh);
    let before_ids: BTreeSet<&String> = handed_out.iter().map(|e| &e.0).collect();
    let before_draws: BTreeSet<(u64, u64)> = handed_out.iter().map(|e| (e.1, e.2)).collect();
    for e in &fresh {
        assert!(!before_ids.contains(&e.0), "group {} handed out twice", e.0);
        assert!(!before_draws.contains(&(e.1, e.2)), "draw {e:?} repeated");
    }
}

#[test]
fn a_run_folder_is_never_silently_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let err = prepare(config(dir.path()), true).unwrap_err().to_string();
    assert!(err.contains("no checkpoint"), "{err}");
    // Trajectories but no checkpoint (a run killed before its first one): refused too.
    let p = prepare(config(dir.path()), false).unwrap();
    let a = p.shared.control.dispenser.next("actor-1", 1).unwrap();
    store_one(&p.shared.store, &a[0], "orphan", 1);
    drop(p);
    let err = prepare(config(dir.path()), false).unwrap_err().to_string();
    assert!(err.contains("no run checkpoint"), "{err}");
}

#[test]
fn a_resume_with_other_task_levels_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (mut a, _shared) = open(dir.path(), false);
    a.checkpoint().unwrap();
    drop(a);
    drop(_shared);
    let text = std::fs::read_to_string(dir.path().join("run/config.toml")).unwrap();
    let mut cfg = config(dir.path());
    cfg.tasks.max_levels.insert("hops".into(), 5);
    let err = prepare(cfg, true).unwrap_err().to_string();
    assert!(
        err.contains("hops up to level 3") && err.contains("levels 1..=5"),
        "{err}"
    );
    assert!(err.contains("config.toml"), "{err}");
    // The run folder is untouched and resumes with its own config.
    assert_eq!(
        std::fs::read_to_string(dir.path().join("run/config.toml")).unwrap(),
        text
    );
    assert!(prepare(config(dir.path()), true).is_ok());
}

#[test]
fn a_resume_with_another_model_is_refused_naming_what_differs() {
    let dir = tempfile::tempdir().unwrap();
    let (mut a, shared) = open(dir.path(), false);
    a.checkpoint().unwrap();
    drop((a, shared));
    let text = std::fs::read_to_string(dir.path().join("run/config.toml"))
        .unwrap()
        .replace("num_hidden_layers = 2", "num_hidden_layers = 3");
    let cfg = LearnerConfig::from_toml(&text).unwrap();
    let err = prepare(cfg, true).unwrap_err().to_string();
    assert!(
        err.contains("different model config")
            && err.contains("num_hidden_layers: checkpoint 2, config 3"),
        "{err}"
    );
}

/// The config that `dir/run` was started with, with `seed` and, when given, `[model] init`.
fn config_with_init(dir: &Path, seed: u64, init: Option<&Path>) -> LearnerConfig {
    let mut text = std::fs::read_to_string(dir.join("run/config.toml"))
        .unwrap()
        .replace("seed = 3", &format!("seed = {seed}"));
    if let Some(init) = init {
        text = text.replace(
            "[model]\n",
            &format!("[model]\ninit = \"{}\"\n", init.display()),
        );
    }
    LearnerConfig::from_toml(&text).unwrap()
}

#[test]
fn a_fresh_run_with_model_init_starts_from_that_policy_and_keeps_it_as_reference() {
    // The policy to start from: a run with seed 3, its starting weights in ref/.
    let src = tempfile::tempdir().unwrap();
    let (a, shared) = open(src.path(), false);
    let want = a.weights().unwrap();
    drop((a, shared));
    let policy = src.path().join("run/ref");
    assert!(policy.join("model.safetensors").exists());

    // Seed 4 alone draws other weights, so equality below comes from the init.
    let other = tempfile::tempdir().unwrap();
    let mut cfg = config_with_init(src.path(), 4, None);
    cfg.run_dir = Some(other.path().join("run"));
    let (b, shared) = open_with(cfg, false);
    assert_ne!(b.weights().unwrap(), want);
    drop((b, shared));

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config_with_init(src.path(), 4, Some(&policy));
    cfg.run_dir = Some(dir.path().join("run"));
    let (c, shared) = open_with(cfg, false);
    assert_eq!(c.weights().unwrap(), want);
    let reference = std::fs::read(dir.path().join("run/ref/model.safetensors")).unwrap();
    assert_eq!(
        reference,
        std::fs::read(policy.join("model.safetensors")).unwrap()
    );
    drop((c, shared));

    // A policy of another shape is refused, naming the field.
    let bad = tempfile::tempdir().unwrap();
    let mut cfg = config_with_init(src.path(), 4, Some(&policy));
    cfg.run_dir = Some(bad.path().join("run"));
    cfg.model
        .overrides
        .insert("num_hidden_layers".into(), 3.into());
    let p = prepare(cfg, false).unwrap();
    let err = Trainer::new(p.cfg, p.paths, p.model_config, p.shared, p.restored)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model.init") && err.contains("num_hidden_layers: checkpoint 2, config 3"),
        "{err}"
    );
}

#[test]
fn a_resume_takes_the_curriculum_settings_from_the_config_and_the_progress_from_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (mut a, shared) = open(dir.path(), false);
    for _ in 0..4 {
        shared
            .curriculum()
            .lock()
            .unwrap()
            .record("hops", 1, true)
            .unwrap();
    }
    assert_eq!(
        shared
            .curriculum()
            .lock()
            .unwrap()
            .frontier("hops")
            .unwrap(),
        2
    );
    a.checkpoint().unwrap();
    drop(a);
    drop(shared);
    let mut cfg = config(dir.path());
    cfg.curriculum.frontier_share = 0.9;
    let p = prepare(cfg, true).unwrap();
    let c = p.shared.curriculum().lock().unwrap();
    assert_eq!(c.config().frontier_share, 0.9, "the config file's share");
    assert_eq!(c.config().window, 8);
    assert_eq!(c.frontier("hops").unwrap(), 2, "the checkpoint's frontier");
}

/// Opens `groups` groups and stores every episode as refused, as an actor without the run's
/// task pack reports them: a header and an infra_error footer, no steps.
fn feed_refused(shared: &Shared, groups: usize, tag: &str) {
    let d = &shared.control.dispenser;
    let g = d.config().group_size as usize;
    for (i, a) in d
        .next("actor-1", (groups * g) as u32)
        .unwrap()
        .iter()
        .enumerate()
    {
        let (header, _, mut footer) = episode(a, &format!("{tag}-{i}"), 1);
        footer.termination = Termination::InfraError;
        footer.success = false;
        footer.outcome_reward = 0.0;
        footer.step_count = 0;
        footer.token_count = 0;
        footer.generated_token_count = 0;
        let Begin::New(w) = shared.store.begin(header).unwrap() else {
            panic!("stored twice")
        };
        w.finish_blocking(footer).unwrap();
        d.complete(&a.group_id, "actor-1", a.sampling.seed);
    }
}

/// `batches_skipped` of the record the Prometheus endpoint serves (no metrics line is
/// written for a skipped batch).
fn shown_batches_skipped(t: &Trainer) -> Option<u64> {
    let latest = t.latest_record();
    let shown = latest
        .read()
        .unwrap()
        .as_ref()
        .map(|r| r.service.batches_skipped);
    shown
}

#[test]
fn a_batch_that_actors_could_not_run_is_consumed_without_an_update() {
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let (mut t, shared) = open(dir.path(), false);
    feed_refused(&shared, 2, "refused");
    t.poll().unwrap();
    assert!(t.try_update().unwrap().is_none(), "nothing to learn from");
    assert!(
        !dir.path().join("run/metrics/metrics.jsonl").exists()
            || metrics_steps(dir.path()).is_empty(),
        "no update was recorded"
    );
    // The refused batch is consumed: the next update trains on the next groups only, and it
    // is update 1 at policy version 2.
    feed(&shared, 2, 1, "ok");
    t.poll().unwrap();
    let rec = t.try_update().unwrap().expect("an update");
    assert_eq!((rec.step, rec.policy_version), (1, 2));
    assert_eq!(
        rec.rollout.episodes, 4,
        "the refused episodes are not in it"
    );
    assert_eq!(rec.service.batches_skipped, 1);
    assert!(t.try_update().unwrap().is_none());
    // Actors that never run a task stop the learner instead of leaving it waiting forever.
    let limit = corvid_learner::trainer::MAX_UNSCORED_BATCHES_IN_A_ROW as usize;
    for b in 0..limit {
        feed_refused(&shared, 2, &format!("again{b}"));
        t.poll().unwrap();
        let r = t.try_update();
        if b + 1 < limit {
            assert!(r.unwrap().is_none(), "batch {b}");
            // No line is written for a skipped batch, but the endpoint's record counts it.
            assert_eq!(shown_batches_skipped(&t), Some(2 + b as u64), "batch {b}");
        } else {
            let err = r.unwrap_err().to_string();
            assert!(
                err.contains("batches in a row had no scored episode")
                    && err.contains("--task-pack"),
                "{err}"
            );
        }
    }
}

#[test]
fn a_batch_staler_than_the_bound_is_consumed_without_an_update() {
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.rl.staleness_bound = 0;
    let (mut t, shared) = open_with(cfg, false);
    feed(&shared, 2, 1, "fresh");
    t.poll().unwrap();
    let rec = t.try_update().unwrap().expect("an update");
    assert_eq!((rec.step, rec.policy_version), (1, 2));
    // Episodes of version 1 are now one version behind: past a bound of 0.
    feed(&shared, 2, 1, "old");
    t.poll().unwrap();
    assert!(
        t.try_update().unwrap().is_none(),
        "no update from stale episodes"
    );
    assert_eq!(metrics_steps(dir.path()), [1], "no line of zeros for it");
    assert_eq!(
        shown_batches_skipped(&t),
        Some(1),
        "the endpoint's record counts it"
    );
    feed(&shared, 2, 2, "new");
    t.poll().unwrap();
    let rec = t.try_update().unwrap().expect("an update");
    assert_eq!((rec.step, rec.policy_version), (2, 3));
    assert_eq!(rec.rollout.episodes, 4, "only the fresh batch");
    assert_eq!(t.state().totals.stale_skipped, 4);
}

#[test]
fn completed_groups_waiting_for_the_trainer_hold_new_groups_back() {
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let (mut t, shared) = open(dir.path(), false);
    let d = Arc::clone(&shared.control.dispenser);
    // max_open_groups = 8: six completed groups read by the trainer leave room for two.
    feed(&shared, 6, 1, "a");
    t.poll().unwrap();
    assert_eq!(d.waiting(), 6);
    assert_eq!(d.next("actor-2", 100).unwrap().len(), 2 * 2);
    assert!(d.next("actor-2", 1).unwrap().is_empty());
    // An update takes two of them: two more groups may open.
    t.try_update().unwrap().expect("an update");
    assert_eq!(d.waiting(), 4);
    assert_eq!(d.next("actor-2", 100).unwrap().len(), 2 * 2);
}

#[test]
fn sync_mode_opens_one_batch_of_groups_per_version() {
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.rl.sync = true;
    let (mut t, shared) = open_with(cfg, false);
    let d = Arc::clone(&shared.control.dispenser);
    assert!(
        d.next("actor-1", 100).unwrap().is_empty(),
        "nothing before the first version"
    );
    assert!(t.try_update().unwrap().is_none());
    // Version 1 is out: exactly groups_per_update (2) groups of G (2).
    let batch = d.next("actor-1", 100).unwrap();
    assert_eq!(batch.len(), 4);
    assert!(
        d.next("actor-1", 100).unwrap().is_empty(),
        "the next batch waits for the update"
    );
    for (i, a) in batch.iter().enumerate() {
        store_one(&shared.store, a, &format!("s{i}"), 1);
        d.complete(&a.group_id, "actor-1", a.sampling.seed);
    }
    t.poll().unwrap();
    let rec = t.try_update().unwrap().expect("the batch is complete");
    assert_eq!(rec.rollout.staleness_max, 0);
    assert_eq!(
        d.next("actor-1", 100).unwrap().len(),
        4,
        "one new batch for version 2"
    );
}

#[test]
fn sync_mode_grants_a_new_batch_after_a_skipped_one() {
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.rl.sync = true;
    cfg.rl.staleness_bound = 0;
    let (mut t, shared) = open_with(cfg, false);
    let d = Arc::clone(&shared.control.dispenser);
    assert!(t.try_update().unwrap().is_none());
    feed(&shared, 2, 1, "fresh");
    t.poll().unwrap();
    let rec = t.try_update().unwrap().expect("an update");
    assert_eq!(rec.policy_version, 2);
    // Version 2's batch comes back from an actor still on version 1: past a bound of 0.
    feed(&shared, 2, 1, "late");
    t.poll().unwrap();
    assert!(t.try_update().unwrap().is_none(), "skipped");
    assert_eq!(
        d.next("actor-1", 100).unwrap().len(),
        4,
        "the skipped batch is replaced; before, no version came to grant it and the run stalled"
    );
}

/// The lines of the test learner's `metrics/sft.jsonl`.
fn sft_log(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("run/metrics/sft.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The test learner with a three-step SFT stage on hops level 1 demonstrations.
fn sft_config(dir: &Path) -> LearnerConfig {
    let mut cfg = config(dir);
    cfg.schedule.sft = true;
    cfg.sft.steps = 3;
    cfg.sft.batch_tokens = 1024;
    cfg.sft.seq_len = 512;
    cfg.sft.micro_batch_tokens = 1024;
    cfg.sft.levels = [("hops".to_string(), vec![1])].into();
    cfg.sft.heldout_per_level = 2;
    cfg.sft.eval_every = 2;
    cfg.validate().unwrap();
    cfg
}

#[test]
fn sft_resumed_mid_stage_continues_exactly_then_hands_over_to_rl() {
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let (mut a, _shared) = open_with(sft_config(dir.path()), false);
    let mut run = a.sft_run().unwrap().expect("SFT is due");
    assert!(a.sft_step(&mut run).unwrap());
    assert!(a.sft_step(&mut run).unwrap());
    let before = a.weights().unwrap();
    a.checkpoint().unwrap();
    assert!(a.sft_step(&mut run).unwrap());
    let third = a.weights().unwrap();
    assert_ne!(third, before);
    drop(run);
    drop(a);
    drop(_shared);

    let (mut b, shared) = open_with(sft_config(dir.path()), true);
    assert_eq!(b.state().stage, corvid_learner::checkpoint::Stage::Sft);
    assert_eq!(b.state().sft_step, 2);
    assert!(b.weights().unwrap() == before);
    let mut run = b.sft_run().unwrap().expect("SFT is still due");
    assert!(b.sft_step(&mut run).unwrap());
    assert!(
        b.weights().unwrap() == third,
        "the resumed SFT step differs"
    );
    assert!(
        !b.sft_step(&mut run).unwrap(),
        "three steps are the whole stage"
    );
    let lines = sft_log(dir.path());
    let steps: Vec<u64> = lines.iter().map(|l| l["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, vec![1, 2, 3]);
    assert!(lines[1]["heldout_loss"].as_f64().unwrap() > 0.0);

    b.finish_sft(&mut run).unwrap();
    assert_eq!(b.state().stage, corvid_learner::checkpoint::Stage::Rl);
    assert!(dir.path().join("run/ref/model.safetensors").exists());
    assert!(b.try_update().unwrap().is_none(), "no trajectories yet");
    assert_eq!(shared.control.policies.latest_version(), 1);
}

/// The held-out losses `sft.jsonl` logged, by step.
fn logged_heldout(dir: &Path) -> Vec<(u64, f64)> {
    sft_log(dir)
        .iter()
        .filter_map(|l| Some((l["step"].as_u64()?, l["heldout_loss"].as_f64()?)))
        .collect()
}

#[test]
fn sft_stops_at_the_heldout_loss_target_and_a_resumed_run_stays_stopped() {
    tch::set_num_threads(1);
    // Six steps at most, held-out losses at steps 2, 4 and 6. Each run is compared with
    // itself only: libtorch's RNG is one per process, and other tests seed it in parallel.
    let six_steps = |dir: &Path, target: f64| {
        let mut cfg = sft_config(dir);
        cfg.sft.steps = 6;
        cfg.sft.heldout_loss_target = Some(target);
        cfg.validate().unwrap();
        cfg
    };
    let steps_run = |t: &mut Trainer| {
        let mut run = t.sft_run().unwrap().unwrap();
        let mut steps = 0;
        while t.sft_step(&mut run).unwrap() {
            steps += 1;
        }
        (run, steps)
    };

    // A target no from-scratch policy reaches: the step cap ends SFT.
    let capped = tempfile::tempdir().unwrap();
    let (mut a, _shared) = open_with(six_steps(capped.path(), 1e-9), false);
    assert_eq!(steps_run(&mut a).1, 6);
    let losses = logged_heldout(capped.path());
    assert_eq!(losses.iter().map(|l| l.0).collect::<Vec<_>>(), [2, 4, 6]);

    // A target every loss meets: SFT stops at the first held-out evaluation, step 2, and
    // a run resumed from a checkpoint there takes no further step.
    let dir = tempfile::tempdir().unwrap();
    let (mut b, _shared) = open_with(six_steps(dir.path(), 1e9), false);
    let (run, steps) = steps_run(&mut b);
    assert_eq!(steps, 2);
    let logged = logged_heldout(dir.path());
    assert_eq!(logged.len(), 1);
    assert_eq!(logged[0].0, 2);
    assert_eq!(b.state().sft_heldout_loss, Some(logged[0].1));
    b.checkpoint().unwrap();
    let stopped = b.weights().unwrap();
    drop((run, b, _shared));

    let (mut c, _shared) = open_with(six_steps(dir.path(), 1e9), true);
    assert_eq!(c.state().stage, corvid_learner::checkpoint::Stage::Sft);
    let (mut run, steps) = steps_run(&mut c);
    assert_eq!(steps, 0, "the resumed run took a step");
    assert_eq!(c.state().sft_step, 2);
    assert!(c.weights().unwrap() == stopped);
    c.finish_sft(&mut run).unwrap();
    assert_eq!(c.state().stage, corvid_learner::checkpoint::Stage::Rl);
    assert_eq!(c.state().sft_heldout_loss, Some(logged[0].1));
}

#[tokio::test]
async fn a_taken_grpc_or_prometheus_port_is_refused_before_the_run_folder_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut cfg = config(dir.path());
    cfg.listen = held.local_addr().unwrap().to_string();
    let err = learner::run(cfg, LearnerOptions { resume: false }, async {})
        .await
        .expect_err("the port is taken");
    assert!(
        err.to_string().contains("binding the gRPC address"),
        "{err}"
    );
    assert!(
        !dir.path().join("run").exists(),
        "the run folder was made for a learner that could not serve"
    );
    // The same for a Prometheus address another learner holds.
    let mut cfg = config(dir.path());
    cfg.metrics.prometheus = held.local_addr().unwrap().to_string();
    let err = learner::run(cfg, LearnerOptions { resume: false }, async {})
        .await
        .expect_err("the metrics port is taken");
    assert!(
        err.to_string().contains("binding the Prometheus address"),
        "{err}"
    );
    assert!(!dir.path().join("run").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_learner_process_checkpoints_on_stop_and_resumes() {
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    // A listener on a known free port: bind :0, read the port, release it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cfg = config(&root);
    cfg.listen = format!("127.0.0.1:{port}");

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(learner::run(
        cfg.clone(),
        LearnerOptions { resume: false },
        async {
            let _ = stopped.await;
        },
    ));
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    // Wait for the server and the first policy version (the token file appears first).
    let mut client = loop {
        assert!(Instant::now() < deadline, "learner did not come up");
        if let Ok(token) = std::fs::read_to_string(root.join("run/token")) {
            if let Ok(mut c) = connect(&url, token.trim()).await {
                if c.policy_info(pb::PolicyInfoRequest::default())
                    .await
                    .is_ok()
                {
                    break c;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let reg = client
        .register(pb::RegisterRequest {
            actor_name: "t".into(),
            hostname: "h".into(),
            concurrency: 4,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reg.policy_version, 1);
    // Two updates' worth of groups, through NextTasks and SubmitTrajectory.
    for round in 0..2 {
        let got = client
            .next_tasks(pb::NextTasksRequest {
                actor_id: reg.actor_id.clone(),
                max_tasks: 4,
            })
            .await
            .unwrap()
            .into_inner()
            .assignments;
        assert_eq!(got.len(), 4);
        for (i, a) in got.into_iter().enumerate() {
            let a = Assignment {
                task: a.task.unwrap().try_into().unwrap(),
                group_id: a.group_id,
                group_size: a.group_size,
                max_turns: a.max_turns,
                context_budget: a.context_budget,
                sampling: a.sampling.unwrap().try_into().unwrap(),
                context: None,
            };
            let (h, steps, f) = episode(&a, &format!("r{round}-{i}"), 1 + round);
            client
                .submit_trajectory(trajectory_parts(h, steps, f))
                .await
                .unwrap();
        }
        // Wait for the update to be published.
        loop {
            assert!(Instant::now() < deadline, "no update after round {round}");
            let v = client
                .policy_info(pb::PolicyInfoRequest::default())
                .await
                .unwrap()
                .into_inner()
                .version;
            if v == 2 + round {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    stop.send(()).unwrap();
    let summary = run.await.unwrap().unwrap();
    assert_eq!(summary.stopped_by, StopReason::Signal);
    assert_eq!((summary.rl_step, summary.policy_version), (2, 3));
    let ck = summary.checkpoint.expect("a checkpoint on stop");
    assert!(ck.join("state.json").exists());
    assert!(root.join("run/ref/model.safetensors").exists());

    // A fresh start over the run is refused; --resume continues it to an update budget.
    let err = prepare(cfg.clone(), false).unwrap_err().to_string();
    assert!(err.contains("--resume"), "{err}");
    cfg.schedule.max_updates = 2;
    let summary = learner::run(cfg, LearnerOptions { resume: true }, std::future::pending())
        .await
        .unwrap();
    assert_eq!(summary.stopped_by, StopReason::MaxUpdates);
    assert_eq!((summary.rl_step, summary.policy_version), (2, 3));
}

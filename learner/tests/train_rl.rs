//! RL updates: a contrived one-step task, the staleness bound, unscored terminations, and
//! the advantage broadcast by hand.

use corvid_learner::train::batch::{select, tokens_from_turns, turn_advantages};
use corvid_learner::train::{AdvantageMode, OptimConfig, RlConfig, RlTrainer};
use corvid_model::{checkpoint, ModelConfig, MoePolicy};
use corvid_proto::{
    SamplingParams, Step, TaskRef, Termination, Trajectory, TrajectoryFooter, TrajectoryHeader,
};
use corvid_tokenizer::{ByteTokenizer, Special};
use tch::{nn, Device, Kind, Tensor};

fn small_model(seed: i64) -> (nn::VarStore, MoePolicy) {
    tch::manual_seed(seed);
    let cfg = ModelConfig {
        num_hidden_layers: 2,
        ..ModelConfig::tiny()
    };
    let vs = nn::VarStore::new(Device::Cpu);
    let model = MoePolicy::new(&vs.root(), &cfg).unwrap();
    (vs, model)
}

fn header(id: &str, group: &str, version: u64) -> TrajectoryHeader {
    TrajectoryHeader {
        trajectory_id: id.into(),
        task: TaskRef {
            family: "toy".into(),
            level: 1,
            seed: 0,
            spec_hash: "0".into(),
        },
        actor_id: "test".into(),
        policy_version: version,
        sampling: SamplingParams::default(),
        group_id: group.into(),
        started_unix_ms: 0,
        routes: None,
        context: None,
    }
}

fn footer(reward: f32, termination: Termination) -> TrajectoryFooter {
    TrajectoryFooter {
        outcome_reward: reward,
        success: reward > 0.5,
        termination,
        step_count: 1,
        token_count: 0,
        generated_token_count: 1,
        wall_ms: 0,
        finished_unix_ms: 0,
        template_divergent: false,
    }
}

fn prompt() -> Vec<u32> {
    let tok = ByteTokenizer::new();
    let mut p = vec![Special::User.id()];
    p.extend(tok.encode_plain("pick"));
    p.push(Special::Assistant.id());
    p
}

/// `log π(action | prompt)` for each action, at temperature 1.
fn action_logprobs(model: &MoePolicy, actions: &[u32]) -> Vec<f64> {
    let p: Vec<i64> = prompt().iter().map(|&x| x as i64).collect();
    let n = p.len() as i64;
    tch::no_grad(|| {
        let out = model
            .forward(&Tensor::from_slice(&p).view([1, n]), false)
            .unwrap();
        let logp = out
            .logits_btv
            .select(1, n - 1)
            .log_softmax(-1, Kind::Float)
            .squeeze_dim(0);
        actions
            .iter()
            .map(|&a| logp.double_value(&[a as i64]))
            .collect()
    })
}

/// A one-step episode: the prompt, then one generated action token.
fn one_step(
    id: &str,
    group: &str,
    action: u32,
    logp: f64,
    reward: f32,
    version: u64,
    termination: Termination,
) -> Trajectory {
    let mut s = Step::context(0, prompt());
    s.token_ids.push(action);
    s.loss_mask.push(true);
    s.logprobs.push(logp as f32);
    s.policy_version = version;
    Trajectory {
        header: header(id, group, version),
        footer: footer(reward, termination),
        steps: vec![s],
    }
}

/// The gradients held by `vs`, by parameter name (parameters without one left out).
fn sorted_grads(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let mut g: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .filter(|(_, v)| v.grad().defined())
        .map(|(n, v)| (n, v.grad().copy()))
        .collect();
    g.sort_by(|x, y| x.0.cmp(&y.0));
    g
}

fn rl_config(advantage: AdvantageMode) -> RlConfig {
    RlConfig {
        advantage,
        optim: OptimConfig {
            lr: 1e-2,
            warmup_steps: 0,
            weight_decay: 0.0,
            ..OptimConfig::default()
        },
        ..RlConfig::default()
    }
}

fn contrived_update_moves_the_right_way(advantage: AdvantageMode) {
    let tok = ByteTokenizer::new();
    let (a, b) = (tok.encode_plain("A")[0], tok.encode_plain("B")[0]);
    let (vs, model) = small_model(11);
    let before = action_logprobs(&model, &[a, b]);
    let group = vec![
        one_step("a1", "g", a, before[0], 1.0, 0, Termination::Answered),
        one_step("b1", "g", b, before[1], 0.0, 0, Termination::Answered),
        one_step("a2", "g", a, before[0], 1.0, 0, Termination::Answered),
        one_step("b2", "g", b, before[1], 0.0, 0, Termination::Answered),
    ];
    let mut trainer =
        RlTrainer::new(vs, model, None, rl_config(advantage), Special::Pad.id()).unwrap();
    let st = trainer.update(&[group], 0).unwrap();
    let after = action_logprobs(&trainer.state().model, &[a, b]);
    assert_eq!(st.optimizer_steps, 1);
    assert_eq!(st.tokens, 4);
    assert_eq!(st.trajectories_used, 4);
    assert!((st.mean_reward - 0.5).abs() < 1e-12 && (st.success_rate - 0.5).abs() < 1e-12);
    // On-policy: every importance weight is 1 and nothing is clipped; one minibatch, so
    // π_prox is π_θ and approx_kl is 0.
    assert!((st.is_weight_mean - 1.0).abs() < 1e-5, "{st:?}");
    assert!(st.approx_kl.abs() < 1e-9, "{st:?}");
    assert_eq!(st.is_truncated_frac, 0.0);
    // The actor's log-probs are the learner's: no mismatch (but f32 rounding).
    let m = &st.mismatch;
    assert!(m.k3_kl < 1e-9 && m.logp_abs_diff_max < 1e-5, "{m:?}");
    assert!((m.token_mult_prob_error - 1.0).abs() < 1e-5, "{m:?}");
    assert_eq!(m.ratio_above_2_frac, 0.0);
    assert!(
        after[0] > before[0] + 1e-3,
        "log p(A) did not rise: {before:?} -> {after:?}"
    );
    assert!(
        after[1] < before[1] - 1e-3,
        "log p(B) did not fall: {before:?} -> {after:?}"
    );
}

#[test]
fn mismatch_compares_the_learner_before_the_update_with_the_actor() {
    let tok = ByteTokenizer::new();
    let (a, b) = (tok.encode_plain("A")[0], tok.encode_plain("B")[0]);
    let (vs, model) = small_model(12);
    let before = action_logprobs(&model, &[a, b]);
    // Two tokens as the learner scores them, generated a version before the learner's; two
    // where the actor, at the learner's version, gave a third of the learner's probability
    // (Δ = ln 3, π_old/μ = 3).
    let ln3 = 3f64.ln();
    let group = vec![
        one_step("a1", "g", a, before[0], 1.0, 6, Termination::Answered),
        one_step("b1", "g", b, before[1], 0.0, 6, Termination::Answered),
        one_step("a2", "g", a, before[0] - ln3, 1.0, 7, Termination::Answered),
        one_step("b2", "g", b, before[1] - ln3, 0.0, 7, Termination::Answered),
    ];
    let cfg = RlConfig {
        minibatches: 2,
        ..rl_config(AdvantageMode::Grpo)
    };
    let mut trainer = RlTrainer::new(vs, model, None, cfg, Special::Pad.id()).unwrap();
    let st = trainer.update(&[group], 7).unwrap();
    assert_eq!(st.tokens, 4);
    let m = &st.mismatch;
    // Lag 0: the two tokens of version 7 alone.
    assert_eq!(m.lag0_tokens, 2, "{m:?}");
    let lag0 = m.k3_kl_lag0.expect("lag-0 tokens were trained on");
    assert!((lag0 - (3.0 - 1.0 - ln3)).abs() < 1e-4, "{m:?}");
    let near = |x: f64, want: f64| (x - want).abs() < 1e-4;
    assert!(near(m.ratio_above_2_frac, 0.5), "{m:?}");
    assert!(near(m.logp_abs_diff_mean, ln3 / 2.0), "{m:?}");
    assert!(near(m.logp_abs_diff_max, ln3), "{m:?}");
    assert!(
        near(m.token_mult_prob_error, (1.0 + 1.0 + 3.0 + 3.0) / 4.0),
        "{m:?}"
    );
    assert!(near(m.k3_kl, 2.0 * (3.0 - 1.0 - ln3) / 4.0), "{m:?}");
}

#[test]
fn one_update_raises_the_rewarded_action_step_level() {
    contrived_update_moves_the_right_way(AdvantageMode::Step);
}

#[test]
fn one_update_raises_the_rewarded_action_grpo() {
    contrived_update_moves_the_right_way(AdvantageMode::Grpo);
}

/// Router noise is SFT's: RL scores every policy without it, so an on-policy update still
/// sees importance weights of exactly 1 (with noise in the training forward they were not).
#[test]
fn rl_scores_without_router_noise() {
    tch::manual_seed(5);
    let cfg = ModelConfig {
        num_hidden_layers: 2,
        router_noise_std: 1.0,
        ..ModelConfig::tiny()
    };
    let vs = nn::VarStore::new(Device::Cpu);
    let model = MoePolicy::new(&vs.root(), &cfg).unwrap();
    let tok = ByteTokenizer::new();
    let (a, b) = (tok.encode_plain("A")[0], tok.encode_plain("B")[0]);
    let mut trainer = RlTrainer::new(
        vs,
        model,
        None,
        rl_config(AdvantageMode::Grpo),
        Special::Pad.id(),
    )
    .unwrap();
    let before = action_logprobs(&trainer.state().model, &[a, b]);
    let group = vec![
        one_step("a1", "g", a, before[0], 1.0, 0, Termination::Answered),
        one_step("b1", "g", b, before[1], 0.0, 0, Termination::Answered),
    ];
    let st = trainer.update(&[group], 0).unwrap();
    assert!((st.is_weight_mean - 1.0).abs() < 1e-5, "{st:?}");
    assert!((st.is_weight_max - 1.0).abs() < 1e-5, "{st:?}");
}

/// The routers' balance biases, by variable name.
fn router_biases(vs: &nn::VarStore) -> Vec<(String, Vec<f32>)> {
    params(vs)
        .into_iter()
        .filter(|(n, _)| n.contains("e_score_correction_bias"))
        .map(|(n, t)| (n, Vec::<f32>::try_from(&t).unwrap()))
        .collect()
}

/// `update_balance_bias = false` freezes the routers' balance bias through an RL update (the
/// demo's setting: re-estimated from small batches of sampled tokens, the quantile bias
/// reroutes tokens outside the policy gradient); `true` re-estimates it.
#[test]
fn rl_updates_the_router_bias_only_when_asked() {
    let tok = ByteTokenizer::new();
    let (a, b) = (tok.encode_plain("A")[0], tok.encode_plain("B")[0]);
    for update_bias in [false, true] {
        let (vs, model) = small_model(11);
        let before_logp = action_logprobs(&model, &[a, b]);
        let group = vec![
            one_step("a1", "g", a, before_logp[0], 1.0, 0, Termination::Answered),
            one_step("b1", "g", b, before_logp[1], 0.0, 0, Termination::Answered),
        ];
        let before = router_biases(&vs);
        assert_eq!(before.len(), 2, "one router per MoE layer");
        let cfg = RlConfig {
            update_balance_bias: update_bias,
            ..rl_config(AdvantageMode::Grpo)
        };
        let mut trainer = RlTrainer::new(vs, model, None, cfg, Special::Pad.id()).unwrap();
        let st = trainer.update(&[group], 0).unwrap();
        assert_eq!(st.optimizer_steps, 1);
        let after = router_biases(&trainer.state().vs);
        if update_bias {
            assert_ne!(after, before, "the quantile bias was not re-estimated");
        } else {
            assert_eq!(after, before, "a frozen bias moved");
        }
    }
}

fn params(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let mut p: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .map(|(n, t)| (n, t.copy()))
        .collect();
    p.sort_by(|x, y| x.0.cmp(&y.0));
    p
}

#[test]
fn trajectories_older_than_the_bound_are_not_trained_on_and_are_counted() {
    let tok = ByteTokenizer::new();
    let (a, b) = (tok.encode_plain("A")[0], tok.encode_plain("B")[0]);
    let (vs, model) = small_model(5);
    let lp = action_logprobs(&model, &[a, b]);
    let cfg = RlConfig {
        staleness_bound: 2,
        ..rl_config(AdvantageMode::Step)
    };
    let mut trainer = RlTrainer::new(vs, model, None, cfg, Special::Pad.id()).unwrap();
    let before = params(&trainer.state().vs);
    // Current version 10, bound 2: version 7 (lag 3) is stale, 8 (lag 2) is not.
    let stale_only = vec![
        one_step("s1", "old", a, lp[0], 1.0, 7, Termination::Answered),
        one_step("s2", "old", b, lp[1], 0.0, 7, Termination::Answered),
    ];
    let st = trainer
        .update(std::slice::from_ref(&stale_only), 10)
        .unwrap();
    assert_eq!(st.stale_skipped, 2);
    assert_eq!(st.trajectories_used, 0);
    assert_eq!(st.optimizer_steps, 0);
    for ((n, x), (_, y)) in before.iter().zip(params(&trainer.state().vs)) {
        assert!(
            x.equal(&y),
            "{n} changed although every trajectory was stale"
        );
    }
    // A mixed update: the stale group is skipped, the fresh one (lag 2 and 0) is used, and
    // an infra_error episode is excluded, not scored as zero.
    let fresh = vec![
        one_step("f1", "new", a, lp[0], 1.0, 8, Termination::Answered),
        one_step("f2", "new", b, lp[1], 0.0, 10, Termination::Answered),
        one_step("f3", "new", b, lp[1], 0.0, 10, Termination::InfraError),
    ];
    let st = trainer.update(&[stale_only, fresh], 10).unwrap();
    assert_eq!(st.stale_skipped, 2);
    assert_eq!(st.unscored_excluded, 1);
    assert_eq!(st.trajectories_used, 2);
    assert_eq!(st.groups_used, 1);
    assert_eq!(st.max_lag, 2);
    assert_eq!(st.optimizer_steps, 1);
    assert_ne!(
        st.mean_reward,
        1.0 / 3.0,
        "the crashed episode entered the reward mean"
    );
    assert!((st.mean_reward - 0.5).abs() < 1e-12);
}

/// A two-turn episode whose steps are `context, generated` per turn with the given sizes.
fn two_turn(
    id: &str,
    p: [f32; 2],
    outcome: f32,
    sizes: [(usize, usize); 2],
    termination: Termination,
) -> Trajectory {
    let steps = (0..2)
        .map(|t| {
            let (c, g) = sizes[t];
            let mut s = Step::context(t as u32, vec![65; c]);
            s.token_ids.extend(vec![66; g]);
            s.loss_mask.extend(vec![true; g]);
            s.logprobs.extend(vec![-1.0; g]);
            s.process_reward = p[t];
            s
        })
        .collect();
    Trajectory {
        header: header(id, "g", 0),
        footer: footer(outcome, termination),
        steps,
    }
}

#[test]
fn a_turn_process_reward_is_weighted_then_clipped_by_hand() {
    // Episode 1: p = (3.0, 0) (many rules fired at once), R = 0; episode 2: p = (0, 0), R = 1.
    // Weight 0.5, clip 1: p = (1.0, 0) and (0, 0), where the unclipped 1.5 would make the
    // reading turn worth more than the answer.
    let e1 = two_turn(
        "e1",
        [3.0, 0.0],
        0.0,
        [(3, 1), (2, 1)],
        Termination::MaxTurns,
    );
    let e2 = two_turn(
        "e2",
        [0.0, 0.0],
        1.0,
        [(3, 1), (2, 1)],
        Termination::Answered,
    );
    let group = [&e1, &e2];
    // Step level, γ = 1: G1 = (1, 0), G2 = (1, 1); turn means (1, 0.5).
    let step = RlConfig {
        normalize_step_advantages: false,
        process_weight: 0.5,
        process_clip: 1.0,
        ..RlConfig::default()
    };
    let a = turn_advantages(&group, &step).unwrap();
    let close = |x: &[f64], y: &[f64]| x.iter().zip(y).all(|(a, b)| (a - b).abs() < 1e-9);
    assert!(close(a[0].as_ref().unwrap(), &[0.0, -0.5]), "{a:?}");
    assert!(close(a[1].as_ref().unwrap(), &[0.0, 0.5]), "{a:?}");
    // Trajectory level (Dr.GRPO): R_total = (1, 1), so neither episode is preferred.
    let traj = RlConfig {
        advantage: AdvantageMode::DrGrpo,
        ..step
    };
    let a = turn_advantages(&group, &traj).unwrap();
    assert!(close(a[0].as_ref().unwrap(), &[0.0, 0.0]), "{a:?}");
    assert!(close(a[1].as_ref().unwrap(), &[0.0, 0.0]), "{a:?}");
}

#[test]
fn step_advantages_broadcast_to_tokens_as_computed_by_hand() {
    // Episode 1: p = (0.1, 0), R = 1 → returns-to-go (γ = 1) G = (1.1, 1.0).
    // Episode 2: p = (0, 0.2), R = 0 → G = (0.2, 0.2).
    // Baseline per turn index: turn 0 mean 0.65, turn 1 mean 0.6.
    // Unnormalised: A1 = (0.45, 0.4), A2 = (−0.45, −0.4).
    let e1 = two_turn(
        "e1",
        [0.1, 0.0],
        1.0,
        [(3, 2), (2, 3)],
        Termination::Answered,
    );
    let e2 = two_turn(
        "e2",
        [0.0, 0.2],
        0.0,
        [(3, 1), (2, 2)],
        Termination::MaxTurns,
    );
    let crashed = two_turn(
        "e3",
        [0.0, 0.0],
        0.0,
        [(3, 1), (2, 1)],
        Termination::InfraError,
    );
    let cfg = RlConfig {
        normalize_step_advantages: false,
        ..RlConfig::default()
    };
    let group = [&e1, &e2, &crashed];
    let turns = turn_advantages(&group, &cfg).unwrap();
    assert!(
        turns[2].is_none(),
        "an infra_error episode gets no advantage"
    );
    let t1 = tokens_from_turns(&e1, turns[0].as_ref().unwrap()).unwrap();
    let t2 = tokens_from_turns(&e2, turns[1].as_ref().unwrap()).unwrap();
    let want1 = [0.0, 0.0, 0.0, 0.45, 0.45, 0.0, 0.0, 0.4, 0.4, 0.4];
    let want2 = [0.0, 0.0, 0.0, -0.45, 0.0, 0.0, -0.4, -0.4];
    let close = |a: &[f64], b: &[f64]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6)
    };
    assert!(close(&t1, &want1), "{t1:?}");
    assert!(close(&t2, &want2), "{t2:?}");

    // Normalised: each bucket has two values ±d, unbiased std = d·√2, so A = ±1/√2.
    let cfg_n = RlConfig {
        normalize_step_advantages: true,
        adv_eps: 0.0,
        ..RlConfig::default()
    };
    let turns = turn_advantages(&group, &cfg_n).unwrap();
    let s = std::f64::consts::FRAC_1_SQRT_2;
    let a1 = turns[0].as_ref().unwrap();
    assert!(
        (a1[0] - s).abs() < 1e-6 && (a1[1] - s).abs() < 1e-6,
        "{a1:?}"
    );

    // Trajectory-level GRPO: R = outcome + Σp = (1.1, 0.2) → A = ±1/√2 on every token.
    let cfg_g = RlConfig {
        advantage: AdvantageMode::Grpo,
        adv_eps: 0.0,
        ..RlConfig::default()
    };
    let groups = vec![vec![e1.clone(), e2.clone(), crashed.clone()]];
    let sel = select(&groups, 0, &cfg_g).unwrap();
    assert_eq!(sel.unscored_excluded, 1);
    assert_eq!(sel.trajectories.len(), 2);
    let g1 = &sel.trajectories[0].token_advantages;
    let gen1: Vec<f64> = g1.iter().copied().filter(|a| *a != 0.0).collect();
    assert_eq!(gen1.len(), 5);
    assert!(gen1.iter().all(|a| (a - s).abs() < 1e-6), "{g1:?}");
}

#[test]
fn a_group_with_equal_rewards_is_dropped_and_counted() {
    let e1 = two_turn(
        "e1",
        [0.0, 0.0],
        1.0,
        [(3, 2), (2, 3)],
        Termination::Answered,
    );
    let e2 = two_turn(
        "e2",
        [0.0, 0.0],
        1.0,
        [(3, 1), (2, 2)],
        Termination::Answered,
    );
    let groups = vec![vec![e1, e2]];
    let sel = select(&groups, 0, &RlConfig::default()).unwrap();
    assert_eq!(sel.uninformative_groups, 1);
    assert!(sel.trajectories.is_empty());
    assert_eq!(sel.scored, 2);
    let keep = RlConfig {
        drop_uninformative_groups: false,
        ..RlConfig::default()
    };
    assert_eq!(select(&groups, 0, &keep).unwrap().trajectories.len(), 2);
}

#[test]
fn the_kl_term_needs_a_reference_and_is_zero_against_itself() {
    let (vs, model) = small_model(3);
    let cfg = RlConfig {
        kl_coef: 0.1,
        ..rl_config(AdvantageMode::Step)
    };
    assert!(RlTrainer::new(vs, model, None, cfg.clone(), Special::Pad.id()).is_err());
    // Reference = an exact copy (through the checkpoint bytes; the global seed is shared
    // with tests running in parallel): KL is 0 before the step.
    let (vs, model) = small_model(3);
    let (rvs, rmodel) = small_model(4);
    let bytes = checkpoint::weights_to_bytes(&vs).unwrap();
    checkpoint::load_weights_from_bytes(&rvs, &bytes).unwrap();
    let tok = ByteTokenizer::new();
    let (a, b) = (tok.encode_plain("A")[0], tok.encode_plain("B")[0]);
    let lp = action_logprobs(&model, &[a, b]);
    let mut trainer =
        RlTrainer::new(vs, model, Some((rvs, rmodel)), cfg, Special::Pad.id()).unwrap();
    let group = vec![
        one_step("a", "g", a, lp[0], 1.0, 0, Termination::Answered),
        one_step("b", "g", b, lp[1], 0.0, 0, Termination::Answered),
    ];
    let st = trainer.update(std::slice::from_ref(&group), 0).unwrap();
    assert!(st.kl.abs() < 1e-6, "{st:?}");
    // After one step the policy moved away from the reference: KL > 0.
    let st = trainer.update(&[group], 1).unwrap();
    assert!(st.kl > 1e-7, "{st:?}");
}

#[test]
fn two_minibatches_take_two_steps_and_clip_against_the_policy_before_the_update() {
    let tok = ByteTokenizer::new();
    let (a, b) = (tok.encode_plain("A")[0], tok.encode_plain("B")[0]);
    let (vs, model) = small_model(13);
    let before = action_logprobs(&model, &[a, b]);
    let group = vec![
        one_step("a1", "g", a, before[0], 1.0, 0, Termination::Answered),
        one_step("b1", "g", b, before[1], 0.0, 0, Termination::Answered),
        one_step("a2", "g", a, before[0], 1.0, 0, Termination::Answered),
        one_step("b2", "g", b, before[1], 0.0, 0, Termination::Answered),
    ];
    let cfg = RlConfig {
        minibatches: 2,
        ..rl_config(AdvantageMode::Step)
    };
    let mut trainer = RlTrainer::new(vs, model, None, cfg, Special::Pad.id()).unwrap();
    let st = trainer.update(&[group], 0).unwrap();
    assert_eq!(st.optimizer_steps, 2);
    // π_prox is the policy before the update, equal to the behaviour policy here: w = 1.
    assert!((st.is_weight_mean - 1.0).abs() < 1e-5, "{st:?}");
    // The second minibatch (a2, b2: half the tokens) sees the policy moved by the first
    // step: A's ratio went above 1 + clip_high, B's below 1 − clip_low, both clipped.
    assert_eq!(
        (st.clip_frac_low, st.clip_frac_high),
        (0.25, 0.25),
        "{st:?}"
    );
    // approx_kl = mean (r − 1) − log r: 0 on the first minibatch's tokens, and on the
    // second's at least what the clip bounds give (A: r > 1.28, B: r < 0.8).
    let k3 = |r: f64| (r - 1.0) - r.ln();
    assert!(st.approx_kl > (k3(1.28) + k3(0.8)) / 4.0, "{st:?}");
    let after = action_logprobs(&trainer.state().model, &[a, b]);
    assert!(
        after[0] > before[0] && after[1] < before[1],
        "{before:?} -> {after:?}"
    );
}

/// Rows are one trajectory each (unequal lengths, padded within a micro-batch); splitting
/// the same update into one-row micro-batches or one big micro-batch gives the same loss
/// statistics and the same gradients.
#[test]
fn micro_batching_trajectories_of_unequal_length_does_not_change_the_gradient() {
    let group = vec![
        two_turn(
            "l1",
            [0.1, 0.0],
            1.0,
            [(12, 5), (7, 3)],
            Termination::Answered,
        ),
        two_turn(
            "l2",
            [0.0, 0.0],
            0.0,
            [(4, 2), (3, 1)],
            Termination::Answered,
        ),
        two_turn(
            "l3",
            [0.1, 0.1],
            1.0,
            [(20, 9), (15, 6)],
            Termination::Answered,
        ),
        two_turn(
            "l4",
            [0.0, 0.1],
            0.0,
            [(9, 1), (2, 2)],
            Termination::Answered,
        ),
    ];
    let weights = checkpoint::weights_to_bytes(&small_model(17).0).unwrap();
    let grads_with = |micro_batch_tokens: usize| {
        let (vs, model) = small_model(18);
        checkpoint::load_weights_from_bytes(&vs, &weights).unwrap();
        let cfg = RlConfig {
            micro_batch_tokens,
            ..rl_config(AdvantageMode::Step)
        };
        let mut trainer = RlTrainer::new(vs, model, None, cfg, Special::Pad.id()).unwrap();
        let st = trainer
            .backward_only(std::slice::from_ref(&group), 0, &[])
            .unwrap();
        (st, sorted_grads(&trainer.state().vs))
    };
    let (one, g_one) = grads_with(1); // every row its own micro-batch
    let (all, g_all) = grads_with(1 << 20); // one micro-batch, rows padded to 58 tokens
    assert_eq!(one.tokens, all.tokens);
    assert!(
        (one.policy_loss - all.policy_loss).abs() < 1e-6,
        "{one:?} vs {all:?}"
    );
    let mut compared = 0;
    assert_eq!(g_one.len(), g_all.len());
    for ((name, a), (_, b)) in g_one.iter().zip(&g_all) {
        let scale = a.abs().max().double_value(&[]).max(1e-8);
        let diff = (a - b).abs().max().double_value(&[]);
        assert!(
            diff <= 1e-4 * scale + 1e-7,
            "{name}: max |Δgrad| {diff} (scale {scale})"
        );
        compared += 1;
    }
    assert!(compared > 10, "{compared} gradients compared");
}

/// PPO-ptx: demonstrations add `ptx_coef ×` the gradient of their mean cross-entropy over
/// the trained-on tokens to the RL gradient, and nothing when `ptx_coef = 0`.
#[test]
fn ptx_term_adds_the_demonstrations_cross_entropy_gradient() {
    use corvid_learner::train::pack::{PackedBatch, PackedRow};
    use corvid_learner::train::SftTrainer;

    let tok = ByteTokenizer::new();
    let (a, b) = (tok.encode_plain("A")[0], tok.encode_plain("B")[0]);
    let group = vec![
        one_step("a1", "g", a, -1.0, 1.0, 0, Termination::Answered),
        one_step("b1", "g", b, -1.0, 0.0, 0, Termination::Answered),
    ];
    // Two demonstrations of unequal length; only the assistant part is trained on.
    let demo = |text: &str, answer: &str| {
        let mut ids = prompt();
        ids.extend(tok.encode_plain(text));
        let context = ids.len();
        ids.extend(tok.encode_plain(answer));
        let mask: Vec<bool> = (0..ids.len()).map(|i| i >= context).collect();
        PackedRow::single(&ids, &mask, Special::Pad.id())
    };
    let demos = vec![demo(" one", "value 41"), demo(" two two", "next c8/bb2")];
    let weights = checkpoint::weights_to_bytes(&small_model(21).0).unwrap();
    let loaded = || {
        let (vs, model) = small_model(22);
        checkpoint::load_weights_from_bytes(&vs, &weights).unwrap();
        (vs, model)
    };
    let rl_grads = |ptx_coef: f64, demos: &[PackedRow]| {
        let (vs, model) = loaded();
        let cfg = RlConfig {
            ptx_coef,
            ..rl_config(AdvantageMode::Grpo)
        };
        let mut trainer = RlTrainer::new(vs, model, None, cfg, Special::Pad.id()).unwrap();
        tch::manual_seed(5);
        let st = trainer
            .backward_only(std::slice::from_ref(&group), 0, demos)
            .unwrap();
        (st, sorted_grads(&trainer.state().vs))
    };
    let (plain, g_plain) = rl_grads(0.0, &[]);
    let (off, g_off) = rl_grads(0.0, &demos);
    let (mixed, g_mixed) = rl_grads(2.5, &demos);

    // The cross-entropy gradient by hand: one forward over both rows, mean over their
    // assistant tokens.
    let (vs, model) = loaded();
    let refs: Vec<&PackedRow> = demos.iter().collect();
    let batch = PackedBatch::new(&refs, Device::Cpu).unwrap();
    tch::manual_seed(5);
    // Full logits (the reference path), not the trainer's chunked head.
    let out = model
        .forward_packed(
            &batch.tokens_bt,
            &batch.positions_bt,
            &batch.doc_ids_bt,
            true,
        )
        .unwrap();
    let v = out.logits_btv.size()[2];
    let logp = out
        .logits_btv
        .view([-1, v])
        .index_select(0, &batch.idx_n)
        .log_softmax(-1, Kind::Float)
        .gather(-1, &batch.targets_n.unsqueeze(-1), false);
    let ce = -logp.sum(Kind::Float) / batch.n_trained as f64;
    ce.backward();
    let g_ce = sorted_grads(&vs);

    assert_eq!(off.ptx_tokens, 0, "ptx_coef = 0 ignores the demonstrations");
    assert_eq!(mixed.ptx_tokens, batch.n_trained);
    assert!(
        (mixed.ptx_loss - ce.double_value(&[])).abs() < 1e-5,
        "{mixed:?}"
    );
    assert_eq!(plain.tokens, mixed.tokens);
    let grad = |gs: &[(String, Tensor)], name: &str| {
        gs.iter()
            .find(|(n, _)| n == name)
            .map(|(_, g)| g.shallow_clone())
    };
    let mut compared = 0;
    for (name, gp) in &g_plain {
        let go = grad(&g_off, name).unwrap();
        assert!((gp - &go).abs().max().double_value(&[]) == 0.0, "{name}");
        let expected = match grad(&g_ce, name) {
            Some(gc) => gp + gc * 2.5,
            None => gp.shallow_clone(),
        };
        let gm = grad(&g_mixed, name).unwrap();
        let scale = expected.abs().max().double_value(&[]).max(1e-8);
        let diff = (&gm - &expected).abs().max().double_value(&[]);
        assert!(
            diff <= 1e-4 * scale + 1e-7,
            "{name}: max |Δgrad| {diff} (scale {scale})"
        );
        compared += 1;
    }
    assert!(compared > 10, "{compared} gradients compared");

    // And it trains: steps with the term lower the demonstrations' cross-entropy.
    let (vs, model) = loaded();
    let cfg = RlConfig {
        ptx_coef: 1.0,
        ..rl_config(AdvantageMode::Grpo)
    };
    let mut trainer = RlTrainer::new(vs, model, None, cfg, Special::Pad.id()).unwrap();
    let sft_loss = |t: &RlTrainer| {
        let (mut vs, model) = loaded();
        vs.copy(&t.state().vs).unwrap();
        let sft = SftTrainer::new(vs, model, Default::default()).unwrap();
        sft.eval_loss(&demos).unwrap()
    };
    let before = sft_loss(&trainer);
    for _ in 0..5 {
        trainer
            .update_mixed(std::slice::from_ref(&group), 0, &demos)
            .unwrap();
    }
    let after = sft_loss(&trainer);
    assert!(
        after < before - 0.5,
        "demonstration loss {before} -> {after}"
    );
}

//! The rollout engine on a tiny random policy and real sandboxed tasks: trajectories are
//! valid, every recorded log-prob is what a full forward over the stored tokens gives, an
//! oracle driven through the engine passes its checker, and a weight swap happens only
//! between turns with exact log-probs on both sides of it. A tool timeout or shutdown
//! grace too long for a deadline cannot make the engine panic.

mod common;

use std::time::Duration;

use common::*;
use corvid_actor::{
    run_episodes, CollectSink, EngineConfig, EpisodeSpec, PolicyUpdate, RolloutEngine,
    ScriptedTokens,
};
use corvid_episode::EpisodeFormat;
use corvid_proto::Termination;

fn cfg(concurrency: usize) -> EngineConfig {
    EngineConfig {
        max_concurrency: concurrency,
        tool_timeout: Duration::from_secs(30),
        ..EngineConfig::default()
    }
}

#[test]
fn random_policy_trajectories_are_valid_and_their_logprobs_exact() {
    let mut policy = random_policy(1);
    let env = env();
    let specs: Vec<EpisodeSpec> = (0..6)
        .map(|i| {
            let mut s = EpisodeSpec::new(
                format!("ep-{i}"),
                task("hops", 1, 10 + i / 3),
                sampling(24, 100 + i),
            );
            s.max_turns = 3;
            s
        })
        .collect();
    let (trajs, stats) = run_episodes(&mut policy, &env, specs, cfg(4), None).unwrap();
    assert_eq!(trajs.len(), 6);
    assert_eq!(stats.episodes, 6);
    assert!(stats.decode_steps > 0);
    // Batched: more rows than steps on average.
    assert!(stats.decode_rows > stats.decode_steps, "{stats:?}");
    let format = EpisodeFormat::default();
    for t in &trajs {
        assert_valid(t);
        assert_eq!(t.header.policy_version, 1);
        assert_eq!(
            t.footer.termination,
            Termination::MaxTurns,
            "{:?}",
            t.footer
        );
        assert_eq!(t.steps.len(), 3);
        // Turns after the first open with the tool message for the previous turn.
        for s in &t.steps[1..] {
            let ctx: Vec<u32> = s
                .token_ids
                .iter()
                .zip(&s.loss_mask)
                .filter(|(_, m)| !**m)
                .map(|(t, _)| *t)
                .collect();
            let text = format.decode(&ctx);
            assert!(text.contains("<|tool|>"), "{text}");
        }
        let err = max_logprob_error(policy.model(), t, 1.0);
        assert!(
            err < 1e-4,
            "{}: log-prob error {err}",
            t.header.trajectory_id
        );
    }
}

#[test]
fn an_oracle_driven_through_the_engine_answers_and_passes() {
    let mut policy = random_policy(1);
    let env = env();
    let task = task("hops", 2, 5);
    let format = EpisodeFormat::default();
    let turns: Vec<Vec<u32>> = task
        .oracle
        .steps
        .iter()
        .cloned()
        .chain(std::iter::once(task.oracle.answer_step()))
        .map(|s| format.call_ids(&s.name, &s.arguments))
        .collect::<Result<_, _>>()
        .unwrap();
    let longest = turns.iter().map(Vec::len).max().unwrap() as u32;
    let mut spec = EpisodeSpec::new("oracle-1", task.clone(), sampling(longest + 4, 1));
    spec.max_turns = turns.len() as u32 + 2;
    let chooser = ScriptedTokens::new().with_episode("oracle-1", turns.clone());
    let (trajs, _) = run_episodes(
        &mut policy,
        &env,
        vec![spec],
        cfg(2),
        Some(Box::new(chooser)),
    )
    .unwrap();
    let t = &trajs[0];
    assert_valid(t);
    assert_eq!(t.footer.termination, Termination::Answered);
    assert!(t.footer.success);
    assert_eq!(t.footer.outcome_reward, 1.0);
    assert_eq!(t.steps.len(), turns.len());
    for (s, want) in t.steps.iter().zip(&turns) {
        let generated: Vec<u32> = s
            .token_ids
            .iter()
            .zip(&s.loss_mask)
            .filter(|(_, m)| **m)
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(&generated, want);
        assert!(s.tool_result.unwrap().status.is_success());
    }
    assert!(
        t.steps.iter().any(|s| s.process_reward > 0.0),
        "needed reads are rewarded"
    );
    assert!(max_logprob_error(policy.model(), t, 1.0) < 1e-4);
}

#[test]
fn weights_swap_between_turns_and_logprobs_stay_exact() {
    let v2 = random_policy(2);
    let v2_bytes = v2.to_bytes().unwrap();
    let mut v1 = random_policy(1);
    let v1_model_bytes = v1.to_bytes().unwrap();
    assert_ne!(v1_model_bytes, v2_bytes);
    let env = env();
    let mut engine = RolloutEngine::new(&mut v1, env.clone(), cfg(4));
    let handle = engine.handle();
    let update = PolicyUpdate {
        version: 2,
        bytes: std::sync::Arc::new(v2_bytes),
    };
    engine = engine.with_chooser(Box::new(SwapAfter::new(30, handle.clone(), update)));
    for i in 0..4 {
        let mut s = EpisodeSpec::new(format!("swap-{i}"), task("hops", 1, 3), sampling(16, i));
        s.max_turns = 4;
        handle.start_episode(s).unwrap();
    }
    handle.close().unwrap();
    let mut sink = CollectSink::default();
    let stats = engine.run(&mut sink).unwrap();
    assert_eq!(engine.policy_version(), 2);
    drop(engine);
    assert_eq!(stats.weight_swaps, 1);
    assert!(stats.reprefill_tokens > 0, "stale caches were recomputed");
    // Rebuilt from its bytes: libtorch's generator is shared with the tests running beside
    // this one, so drawing v1 again could give other weights.
    let v1 = policy_from_bytes(&v1_model_bytes, 1);
    let mut saw_both = false;
    for t in &sink.finished {
        assert_valid(t);
        let versions: std::collections::BTreeSet<u64> = t
            .steps
            .iter()
            .filter(|s| s.generated_count() > 0)
            .map(|s| s.policy_version)
            .collect();
        saw_both |= versions.len() == 2;
        let err =
            max_logprob_error_by_version(&|v| if v == 1 { v1.model() } else { v2.model() }, t, 1.0);
        assert!(
            err < 1e-4,
            "{}: log-prob error {err}",
            t.header.trajectory_id
        );
    }
    assert!(saw_both, "some episode ran turns under both versions");
}

#[test]
fn an_episode_whose_prompt_does_not_fit_ends_context_full() {
    let mut policy = random_policy(1);
    let env = env();
    let mut spec = EpisodeSpec::new("tight", task("hops", 1, 1), sampling(32, 1));
    spec.context_budget = 40;
    let (trajs, _) = run_episodes(&mut policy, &env, vec![spec], cfg(1), None).unwrap();
    let t = &trajs[0];
    assert_eq!(t.footer.termination, Termination::ContextFull);
    assert!(t.steps.is_empty());
    assert!(!t.footer.success);
}

#[test]
fn a_turn_cut_by_the_context_budget_uses_the_room_left_and_ends_context_full() {
    let mut policy = random_policy(1);
    let env = env();
    let task = task("hops", 1, 2);
    let format = EpisodeFormat::default();
    let prompt = format
        .prompt_ids(&format.conversation(&env, &task))
        .unwrap()
        .len();
    let mut spec = EpisodeSpec::new("cut", task, sampling(48, 1));
    spec.context_budget = (prompt + 30) as u32;
    // A turn that never stops on its own: 100 plain bytes.
    let chooser = ScriptedTokens::new().with_episode("cut", vec![vec![u32::from(b'a'); 100]]);
    let (trajs, _) = run_episodes(
        &mut policy,
        &env,
        vec![spec],
        cfg(1),
        Some(Box::new(chooser)),
    )
    .unwrap();
    let t = &trajs[0];
    assert_valid(t);
    assert_eq!(t.footer.termination, Termination::ContextFull);
    assert_eq!(t.steps.len(), 1);
    assert_eq!(
        t.steps[0].generated_count(),
        30,
        "generation used exactly the room left"
    );
    assert_eq!(t.footer.token_count as usize, prompt + 30);
    assert!(t.steps[0].tool_call.is_none() && t.steps[0].tool_result.is_none());
}

#[test]
fn timeouts_too_long_for_a_deadline_do_not_panic_the_engine() {
    let mut policy = random_policy(1);
    let env = env();
    let spec = |i: u64| {
        let mut s = EpisodeSpec::new(format!("ep-{i}"), task("hops", 1, 10), sampling(8, i));
        s.max_turns = 2;
        s
    };
    let forever = EngineConfig {
        max_concurrency: 2,
        tool_timeout: Duration::MAX,
        ..EngineConfig::default()
    };
    let (trajs, _) = run_episodes(
        &mut policy,
        &env,
        vec![spec(0), spec(1)],
        forever.clone(),
        None,
    )
    .expect("the engine ran");
    assert_eq!(trajs.len(), 2);
    for t in &trajs {
        assert_valid(t);
        assert_eq!(
            t.footer.termination,
            Termination::MaxTurns,
            "{:?}",
            t.footer
        );
    }
    // A shutdown whose grace never ends: the engine still runs every admitted episode out.
    let mut engine = RolloutEngine::new(&mut policy, env.clone(), forever);
    let h = engine.handle();
    h.start_episode(spec(2)).unwrap();
    h.shutdown(Duration::MAX).unwrap();
    let stats = engine
        .run(&mut CollectSink::default())
        .expect("the engine ran");
    assert_eq!(stats.episodes + stats.unstarted, 1, "{stats:?}");
}

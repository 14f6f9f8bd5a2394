//! Routing recorded by the engine: with `record_routes`, every step carries one row of expert
//! ids per token (the first step one fewer), each the choice the policy made for the input
//! before that token, the same a full forward over the stored tokens makes; across a weight
//! swap every row is still there (the re-prefill records only the positions not yet routed).
//! Without it nothing is recorded, and a step's token limit shrinks with the route bytes.

mod common;

use std::time::Duration;

use common::*;
use corvid_actor::{
    run_episodes, tokens_per_step, CollectSink, EngineConfig, EpisodeSpec, PolicyUpdate,
    RolloutEngine, STEP_TOKEN_BYTES,
};
use corvid_model::{Checkpoint, MoePolicy, RouteOpts};
use corvid_proto::{RouteShape, Step, Trajectory};
use tch::Tensor;

fn cfg(record_routes: bool) -> EngineConfig {
    EngineConfig {
        max_concurrency: 3,
        tool_timeout: Duration::from_secs(30),
        record_routes,
        ..EngineConfig::default()
    }
}

fn specs(prefix: &str, n: u64) -> Vec<EpisodeSpec> {
    (0..n)
        .map(|i| {
            let mut s = EpisodeSpec::new(
                format!("{prefix}-{i}"),
                task("hops", 1, 20 + i),
                sampling(20, 300 + i),
            );
            s.max_turns = 3;
            s
        })
        .collect()
}

/// Every step's route bytes have the shape the header declares.
fn assert_routes_complete(t: &Trajectory, shape: RouteShape) {
    assert_eq!(t.header.routes, Some(shape));
    let mut rules = corvid_proto::StepRules::new(Some(shape), None);
    for (seq, s) in t.steps.iter().enumerate() {
        rules
            .check(seq as u64, s)
            .unwrap_or_else(|e| panic!("{}: {e}", t.header.trajectory_id));
    }
}

/// The recorded routes as a table `[1, T, L, k]`, `-1` for the last token.
fn route_table(t: &Trajectory, shape: RouteShape) -> Tensor {
    route_table_of(t, shape, |_| true)
}

/// [`route_table`] with only the rows of the steps `keep` accepts (`-1` for the others).
fn route_table_of(t: &Trajectory, shape: RouteShape, keep: impl Fn(&Step) -> bool) -> Tensor {
    let mut ids: Vec<i64> = Vec::new();
    for s in &t.steps {
        let step_ids = shape.unpack(&s.routes);
        match keep(s) {
            true => ids.extend(step_ids.into_iter().map(i64::from)),
            false => ids.extend(std::iter::repeat_n(-1, step_ids.len())),
        }
    }
    ids.extend(std::iter::repeat_n(-1, shape.ids_per_token()));
    Tensor::from_slice(&ids).view([
        1,
        t.len() as i64,
        i64::from(shape.moe_layers),
        i64::from(shape.experts_per_token),
    ])
}

/// Fraction of (token, layer) pairs whose recorded set equals `model`'s own choice over the
/// stored tokens, and the tokens compared per layer.
fn agreement(model: &MoePolicy, t: &Trajectory, shape: RouteShape) -> (f64, i64) {
    agreement_with(model, t, &route_table(t, shape))
}

/// [`agreement`] against the table `given`.
fn agreement_with(model: &MoePolicy, t: &Trajectory, given: &Tensor) -> (f64, i64) {
    let ids: Vec<i64> = t.token_ids().into_iter().map(i64::from).collect();
    let tokens = Tensor::from_slice(&ids).view([1, -1]);
    let given = given.shallow_clone();
    let trunk = tch::no_grad(|| {
        model
            .trunk_routed(
                &tokens,
                None,
                false,
                Checkpoint::None,
                RouteOpts::compare(&given),
            )
            .unwrap()
    });
    let equal: i64 = trunk.agreement.iter().map(|a| a.equal).sum();
    let total: i64 = trunk.agreement.iter().map(|a| a.tokens).sum();
    (equal as f64 / total as f64, trunk.agreement[0].tokens)
}

fn shape_of(model: &MoePolicy) -> RouteShape {
    let c = model.config();
    RouteShape::of_moe(c.n_moe_layers(), c.num_experts_per_tok, c.n_routed_experts)
        .expect("the test model is MoE")
}

#[test]
fn recorded_routes_are_the_policys_own_choice_for_every_input() {
    let mut policy = random_policy(1);
    let shape = shape_of(policy.model());
    let (trajs, _) = run_episodes(&mut policy, &env(), specs("r", 4), cfg(true), None).unwrap();
    assert_eq!(trajs.len(), 4);
    for t in &trajs {
        assert_valid(t);
        assert_routes_complete(t, shape);
        let (agree, tokens) = agreement(policy.model(), t, shape);
        assert_eq!(
            tokens as usize,
            t.len() - 1,
            "every input but the last has a row"
        );
        // The cached path and the full forward round differently; a near-tie may flip.
        assert!(
            agree >= 0.99,
            "{}: agreement {agree}",
            t.header.trajectory_id
        );
        let max = t.route_ids().unwrap().into_iter().max().unwrap();
        assert!(u32::from(max) < shape.routed_experts);
    }

    let (plain, _) = run_episodes(&mut policy, &env(), specs("p", 1), cfg(false), None).unwrap();
    assert!(plain[0].header.routes.is_none());
    assert!(plain[0].steps.iter().all(|s| s.routes.is_empty()));
}

#[test]
fn routes_stay_complete_across_a_weight_swap() {
    let v2 = random_policy(2);
    let mut v1 = random_policy(1);
    let v1_bytes = v1.to_bytes().unwrap();
    let shape = shape_of(v1.model());
    let mut engine = RolloutEngine::new(&mut v1, env(), cfg(true));
    let handle = engine.handle();
    let update = PolicyUpdate {
        version: 2,
        bytes: std::sync::Arc::new(v2.to_bytes().unwrap()),
    };
    engine = engine.with_chooser(Box::new(SwapAfter::new(30, handle.clone(), update)));
    for s in specs("swap", 3) {
        handle.start_episode(s).unwrap();
    }
    handle.close().unwrap();
    let mut sink = CollectSink::default();
    let stats = engine.run(&mut sink).unwrap();
    drop(engine);
    assert_eq!(stats.weight_swaps, 1);
    // Rebuilt from its bytes: libtorch's generator is shared with the tests running beside
    // this one, so drawing v1 again could give other weights.
    let v1 = policy_from_bytes(&v1_bytes, 1);
    let mut straddled = 0;
    for t in &sink.finished {
        assert_valid(t);
        assert_routes_complete(t, shape);
        // A step's rows were run while it was produced, under the version of its generated
        // tokens; the re-prefill after the swap recorded only the positions not routed
        // before, so the rows of turns before it stay v1's.
        let version = |s: &Step| s.policy_version;
        let versions: std::collections::BTreeSet<u64> = t.steps.iter().map(version).collect();
        straddled += usize::from(versions.len() == 2);
        for (v, model) in [(1, v1.model()), (2, v2.model())] {
            if !versions.contains(&v) {
                continue;
            }
            let given = route_table_of(t, shape, |s| version(s) == v);
            let (agree, _) = agreement_with(model, t, &given);
            assert!(
                agree >= 0.99,
                "{}: v{v} rows agree {agree}",
                t.header.trajectory_id
            );
        }
    }
    assert!(straddled > 0, "some episode ran turns under both versions");
}

#[test]
fn a_steps_token_limit_shrinks_with_its_route_bytes() {
    assert_eq!(tokens_per_step(0), 209_715);
    // A DeepSeek-V3 shape: 58 MoE layers × 8 experts of 256, one byte per id.
    let per = tokens_per_step(58 * 8);
    assert_eq!(per, 4424);
    // The largest such step (5-byte token ids) stays within the budget.
    let step = corvid_proto::Step {
        routes: vec![255; per * 58 * 8],
        ..corvid_proto::Step::generated(1, vec![u32::MAX; per], vec![-1e30; per], u64::MAX)
    };
    use prost::Message;
    let bytes = corvid_proto::pb::Step::from(step).encoded_len();
    assert!(bytes <= STEP_TOKEN_BYTES + 64, "{bytes}");
}

//! Routing replay between a real actor engine and the RL trainer:
//! - an actor decoding in bf16 (routers fp32) against an fp32 learner with the same weights
//!   routes some tokens differently (agreement below 1); replaying its routes (R3) lowers the
//!   train–rollout mismatch, and the router still gets a gradient;
//! - with identical numerics (an fp32 actor) agreement is 1 up to near-ties and the mismatch
//!   is rounding only;
//! - R2 (the π_prox pass records the learner's own choice and the update replays it) gives
//!   the gradients of no replay when the weights have not moved.

#[path = "../../actor/tests/common/mod.rs"]
mod actor_common;

use std::collections::BTreeMap;
use std::time::Duration;

use actor_common::{env, random_policy, sampling, task, test_model_config};
use corvid_actor::{run_episodes, EngineConfig, EpisodeSpec, LoadedPolicy};
use corvid_episode::EpisodeFormat;
use corvid_learner::train::{AdvantageMode, Group, RlConfig, RlTrainer, RouterReplay, UpdateStats};
use corvid_model::checkpoint::load_weights_from_bytes;
use corvid_model::MoePolicy;
use corvid_proto::Trajectory;
use tch::{nn, Device, Kind, Tensor};

/// Two groups of four episodes of `actor`, recording routes.
fn rollouts(actor: &mut LoadedPolicy) -> Vec<Group> {
    let specs: Vec<EpisodeSpec> = (0..8)
        .map(|i| {
            let mut s = EpisodeSpec::new(
                format!("rr-{i}"),
                task("hops", 1, 40 + i / 4),
                sampling(20, 500 + i),
            );
            s.max_turns = 3;
            s
        })
        .collect();
    let cfg = EngineConfig {
        max_concurrency: 4,
        tool_timeout: Duration::from_secs(30),
        record_routes: true,
        ..EngineConfig::default()
    };
    let (trajs, _) = run_episodes(actor, &env(), specs, cfg, None).unwrap();
    let mut groups: BTreeMap<String, Vec<Trajectory>> = BTreeMap::new();
    for t in trajs {
        assert!(t.header.routes.is_some(), "the actor recorded routes");
        groups.entry(t.header.group_id.clone()).or_default().push(t);
    }
    groups.into_values().collect()
}

/// A trainer over the fp32 weights `bytes`, replaying routes as `mode` says.
fn trainer(bytes: &[u8], mode: RouterReplay, minibatches: usize) -> RlTrainer {
    tch::set_num_threads(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = MoePolicy::new(&vs.root(), &test_model_config()).unwrap();
    load_weights_from_bytes(&vs, bytes).unwrap();
    let cfg = RlConfig {
        advantage: AdvantageMode::Grpo,
        drop_uninformative_groups: false,
        // The random policy never succeeds, so every advantage is 0: the entropy bonus is
        // what carries a gradient to the routers.
        entropy_coef: 0.01,
        router_replay: mode,
        minibatches,
        ..RlConfig::default()
    };
    RlTrainer::new(vs, model, None, cfg, EpisodeFormat::default().pad_id()).unwrap()
}

/// The loss's gradients (without any step), and the update's statistics.
fn gradients(
    bytes: &[u8],
    groups: &[Group],
    mode: RouterReplay,
    minibatches: usize,
) -> (BTreeMap<String, Tensor>, UpdateStats) {
    let mut t = trainer(bytes, mode, minibatches);
    let st = t.backward_only(groups, 1, &[]).unwrap();
    let grads = t
        .state()
        .vs
        .variables()
        .into_iter()
        .filter(|(_, v)| v.grad().defined())
        .map(|(n, v)| (n, v.grad().copy()))
        .collect();
    (grads, st)
}

fn router_grad_norm(grads: &BTreeMap<String, Tensor>) -> f64 {
    grads
        .iter()
        .filter(|(n, _)| n.ends_with("gate.weight"))
        .map(|(_, g)| g.norm().double_value(&[]))
        .sum()
}

#[test]
fn a_bf16_actor_routes_otherwise_and_replay_lowers_the_mismatch() {
    let fp32 = random_policy(1);
    let bytes = fp32.to_bytes().unwrap();
    let mut bf16 =
        LoadedPolicy::random_in(&test_model_config(), Device::Cpu, Kind::BFloat16).unwrap();
    bf16.load(&bytes, 1).unwrap();
    let groups = rollouts(&mut bf16);

    let (g_off, off) = gradients(&bytes, &groups, RouterReplay::Off, 1);
    let (g_r3, r3) = gradients(&bytes, &groups, RouterReplay::Rollout, 1);
    let (a_off, a_r3) = (&off.mismatch, &r3.mismatch);
    eprintln!("bf16 actor, fp32 learner: off {a_off:?}\nR3 {a_r3:?}");
    assert_eq!(a_off.without_routes, 0);
    let agreement = a_off.routing_agreement.expect("routes were compared");
    assert!(agreement < 1.0, "bf16 and fp32 routed every token alike");
    assert!(agreement > 0.9, "agreement {agreement}");
    assert!(a_off.routing_overlap.unwrap() >= agreement);
    assert_eq!(
        a_off.routing_layers.len() as i64,
        test_model_config().n_moe_layers()
    );
    // The first MoE layer sees the same inputs replay or not, so its own choice agrees as
    // much; later layers see hidden states routed by the actor's choice under replay.
    assert_eq!(a_r3.routing_layers[0], a_off.routing_layers[0]);
    assert!(
        a_r3.k3_kl < a_off.k3_kl && a_r3.logp_abs_diff_mean < a_off.logp_abs_diff_mean,
        "replay did not lower the mismatch: {} -> {} (k3), {} -> {} (|Δ|)",
        a_off.k3_kl,
        a_r3.k3_kl,
        a_off.logp_abs_diff_mean,
        a_r3.logp_abs_diff_mean
    );
    assert!(
        router_grad_norm(&g_r3) > 0.0,
        "replay cut the router's gradient"
    );
    assert!(router_grad_norm(&g_off) > 0.0);
}

#[test]
fn identical_numerics_agree_and_r2_replays_the_learners_own_choice() {
    let mut fp32 = random_policy(1);
    let bytes = fp32.to_bytes().unwrap();
    let groups = rollouts(&mut fp32);
    let (g_off, off) = gradients(&bytes, &groups, RouterReplay::Off, 2);
    let m = &off.mismatch;
    assert!(m.routing_agreement.unwrap() >= 0.99, "{m:?}");
    assert!(m.logp_abs_diff_max < 1e-3, "{m:?}");
    // R2 records in the π_prox pass and replays in the update: with unmoved weights the
    // update's own choice is the recorded one, so nothing changes.
    let (g_r2, r2) = gradients(&bytes, &groups, RouterReplay::Old, 2);
    assert_eq!(r2.mismatch.routing_agreement, m.routing_agreement);
    assert_eq!(g_off.len(), g_r2.len());
    for (name, g) in &g_off {
        let d = (g - &g_r2[name]).abs().max().double_value(&[]);
        let scale = g.abs().max().double_value(&[]).max(1e-12);
        assert!(
            d <= 1e-5 * scale,
            "{name}: R2 changed the gradient by {d:e}"
        );
    }
}

//! Routing replay against the actor's recorded routes:
//! - the ids the cached (actor) path records are the trunk's own choice;
//! - an actor whose selection differs (its balance bias moved, as after a bias update the
//!   learner made and the actor has not loaded) gives other log-probs than the learner's own
//!   routing; replaying its routes reproduces them (≤ 1e-6), for a DeepSeek-style MLA model
//!   (sigmoid, group-limited selection) and a Qwen3-MoE-style GQA one (softmax);
//! - under replay the router's gradient is non-zero and equals that of its dense scores
//!   gathered at the replayed ids;
//! - a checkpointed trunk replaying routes gives the plain trunk's gradients;
//! - malformed route tables (shape, dtype, ids out of range, a row naming an expert twice or
//!   mixing `-1` with ids) are refused, saying what is wrong.

use corvid_model::head::score_full;
use corvid_model::router::Router;
use corvid_model::{
    Attention, AttnGate, Checkpoint, ModelConfig, MoePolicy, RouteAgreement, RouteOpts, ScoreFunc,
};
use tch::{nn, Device, Kind, Tensor};

fn deepseek_cfg() -> ModelConfig {
    ModelConfig {
        vocab_size: 96,
        hidden_size: 32,
        num_hidden_layers: 3,
        num_attention_heads: 2,
        kv_lora_rank: 16,
        qk_nope_head_dim: 8,
        qk_rope_head_dim: 8,
        v_head_dim: 8,
        n_routed_experts: 8,
        num_experts_per_tok: 2,
        n_group: 2,
        topk_group: 1,
        moe_intermediate_size: 16,
        intermediate_size: 32,
        max_position_embeddings: 128,
        first_k_dense_replace: 1,
        ..ModelConfig::tiny()
    }
}

fn qwen3_moe_cfg() -> ModelConfig {
    ModelConfig {
        num_attention_heads: 4,
        attention: Attention::Gqa {
            num_key_value_heads: 2,
            head_dim: 8,
            qk_norm: true,
        },
        attn_gate: AttnGate::None,
        cross_layer_residual: false,
        cla_factor: 1,
        latent_token_shift: false,
        scoring_func: ScoreFunc::Softmax,
        n_group: 1,
        topk_group: 1,
        first_k_dense_replace: 0,
        tie_word_embeddings: false,
        ..deepseek_cfg()
    }
}

fn build(cfg: &ModelConfig, seed: i64) -> (nn::VarStore, MoePolicy) {
    tch::manual_seed(seed);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = MoePolicy::new(&vs.root(), cfg).unwrap();
    (vs, model)
}

/// Sets every router's selection bias to `scale ×` a fixed random draw.
fn move_bias(vs: &nn::VarStore, seed: i64, scale: f64) {
    tch::manual_seed(seed);
    tch::no_grad(|| {
        let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, mut t) in vars {
            if name.contains("e_score_correction_bias") {
                let r = t.randn_like() * scale;
                t.copy_(&r);
            }
        }
    });
}

/// What the actor's engine does: prefill `prompt`, then greedy decode steps, recording
/// routes and the log-prob of every token it appends after the prompt. Returns the
/// sequence `[1, T]`, the routes of its first `T − 1` tokens `[1, T − 1, L, k]` (the last
/// is never an input), and `log p(token j | < j)` for `j ≥ prompt`.
fn actor_rollout(model: &MoePolicy, prompt: &[i64], new: usize) -> (Tensor, Tensor, Vec<f64>) {
    let mut cache = model.new_cache(1, 64);
    let mut ids = prompt.to_vec();
    let mut routes = Vec::new();
    let mut logps = Vec::new();
    let mut pending = Tensor::from_slice(prompt).view([1, -1]);
    for _ in 0..new {
        let n = pending.size()[1];
        let (logits_bv, r) = model
            .forward_ragged_last_routed(&mut cache, &pending, &[n])
            .unwrap();
        routes.push(r);
        let logp_v = logits_bv.log_softmax(-1, Kind::Double).squeeze_dim(0);
        let next = logp_v.argmax(0, false).int64_value(&[]);
        logps.push(logp_v.double_value(&[next]));
        ids.push(next);
        pending = Tensor::from_slice(&[next]).view([1, 1]);
    }
    let tokens = Tensor::from_slice(&ids).view([1, -1]);
    (tokens, Tensor::cat(&routes, 1), logps)
}

/// The learner's log-probs of the generated tokens, routing as `routes` says.
fn learner_logps(model: &MoePolicy, tokens: &Tensor, prompt: usize, routes: RouteOpts) -> Vec<f64> {
    let t = tokens.size()[1];
    let trunk = tch::no_grad(|| {
        model
            .trunk_routed(tokens, None, false, Checkpoint::None, routes)
            .unwrap()
    });
    let hidden = trunk.hidden_btd.squeeze_dim(0).narrow(0, 0, t - 1);
    let targets = tokens.squeeze_dim(0).narrow(0, 1, t - 1);
    let ones = Tensor::ones([t - 1, 1], (Kind::Float, Device::Cpu));
    let s = score_full(&hidden, model.head_weight_vd(), &targets, &ones).unwrap();
    Vec::<f64>::try_from(s.logp_n.to_kind(Kind::Double))
        .unwrap()
        .split_off(prompt - 1)
}

/// A route table for the whole sequence: the recorded ids, and `-1` for the last token.
fn with_last_unrouted(routes_btlk: &Tensor) -> Tensor {
    let (b, _, l, k) = routes_btlk.size4().unwrap();
    let none = Tensor::full([b, 1, l, k], -1, (Kind::Int64, Device::Cpu));
    Tensor::cat(&[routes_btlk.shallow_clone(), none], 1)
}

/// Per MoE layer, how `model`'s own routing of `tokens` agrees with `given`.
fn agreement_of(model: &MoePolicy, tokens: &Tensor, given: &Tensor) -> Vec<RouteAgreement> {
    let routes = RouteOpts::compare(given);
    tch::no_grad(|| model.trunk_routed(tokens, None, false, Checkpoint::None, routes))
        .unwrap()
        .agreement
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn replay_reproduces_the_actor(cfg: &ModelConfig, what: &str) {
    tch::set_num_threads(1);
    let (vs, learner) = build(cfg, 7);
    let prompt: Vec<i64> = (0..12).map(|i| (i * 7 + 3) % cfg.vocab_size).collect();

    // Same weights, same numerics: the recorded routes are the trunk's own choice.
    let (tokens, routes, actor_logp) = actor_rollout(&learner, &prompt, 10);
    let given = with_last_unrouted(&routes);
    let agreement = agreement_of(&learner, &tokens, &given);
    assert_eq!(agreement.len() as i64, cfg.n_moe_layers());
    for a in &agreement {
        assert_eq!(
            a.tokens,
            tokens.size()[1] - 1,
            "{what}: the last token has no route"
        );
        assert_eq!(
            a.agreement(),
            1.0,
            "{what}: layer {} disagrees with itself",
            a.layer
        );
    }
    let own = learner_logps(&learner, &tokens, prompt.len(), RouteOpts::default());
    assert!(
        max_diff(&own, &actor_logp) < 1e-5,
        "{what}: cached and full paths differ"
    );

    // The actor selects with another balance bias: its routes differ from the learner's.
    let (mut avs, mut actor) = build(cfg, 7);
    // The learner's weights, copied: tests beside this one draw from libtorch's global
    // generator, so the same seed need not give the same draws.
    avs.copy(&vs).unwrap();
    move_bias(&avs, 11, 1.0);
    actor.set_decode_core(learner.decode_core());
    let (tokens, routes, actor_logp) = actor_rollout(&actor, &prompt, 10);
    let given = with_last_unrouted(&routes);
    let own = learner_logps(&learner, &tokens, prompt.len(), RouteOpts::default());
    let replayed = learner_logps(&learner, &tokens, prompt.len(), RouteOpts::replay(&given));
    let (off, on) = (
        max_diff(&own, &actor_logp),
        max_diff(&replayed, &actor_logp),
    );
    eprintln!("{what}: |Δ log p| without replay {off:.3e}, with {on:.3e}");
    assert!(
        off > 100.0 * on.max(1e-6),
        "{what}: the moved bias changed no log-prob ({off:e})"
    );
    assert!(on <= 1e-6, "{what}: replay leaves |Δ log p| = {on:e}");
    let agreement = agreement_of(&learner, &tokens, &given);
    let worst = agreement.iter().map(|a| a.agreement()).fold(1.0, f64::min);
    assert!(worst < 1.0, "{what}: the moved bias changed no selection");
    drop(vs);
}

#[test]
fn replay_reproduces_the_actor_log_probs_deepseek_style() {
    replay_reproduces_the_actor(&deepseek_cfg(), "MLA, sigmoid, group-limited");
}

#[test]
fn replay_reproduces_the_actor_log_probs_qwen3_moe_style() {
    replay_reproduces_the_actor(&qwen3_moe_cfg(), "GQA, softmax");
}

#[test]
fn replayed_router_gradient_is_that_of_the_gathered_dense_scores() {
    for cfg in [deepseek_cfg(), qwen3_moe_cfg()] {
        tch::manual_seed(3);
        let vs = nn::VarStore::new(Device::Cpu);
        let router = Router::new(vs.root() / "gate", &cfg);
        let (t, e, k) = (20, cfg.n_routed_experts, cfg.num_experts_per_tok);
        let x = Tensor::randn([t, cfg.hidden_size], (Kind::Float, Device::Cpu));
        // Replayed ids: distinct experts per token, unrelated to the router's choice; the
        // last four tokens have none and keep their own.
        let perm = Tensor::randn([t, e], (Kind::Float, Device::Cpu)).argsort(-1, false);
        let replay = perm.narrow(1, 0, k);
        let _ = replay.narrow(0, t - 4, 4).fill_(-1);
        let c_tk = Tensor::randn([t, k], (Kind::Float, Device::Cpu));

        let r = router.forward_select(&x, false, None, Some(&replay));
        let used = r.idx_tk.shallow_clone();
        assert!(used.narrow(0, 0, t - 4).equal(&replay.narrow(0, 0, t - 4)));
        assert!(used
            .narrow(0, t - 4, 4)
            .equal(&r.own_idx_tk.narrow(0, t - 4, 4)));
        (&r.weights_tk * &c_tk).sum(Kind::Float).backward();
        let w = vs.variables()["gate.weight"].shallow_clone();
        let got = w.grad().copy();
        assert!(got.abs().max().double_value(&[]) > 0.0);

        // Reference: the dense scores, gathered at the ids used, renormalised and scaled.
        let _ = w.grad().zero_();
        let logits = x.matmul(&w.tr());
        let scores = match cfg.scoring_func {
            ScoreFunc::Softmax => logits.softmax(-1, Kind::Float),
            ScoreFunc::Sigmoid => logits.sigmoid(),
        };
        let mut g = scores.gather(1, &used, false);
        if cfg.norm_topk_prob {
            g = &g / (g.sum_dim_intlist(-1, true, None) + 1e-20);
        }
        ((g * cfg.routed_scaling_factor) * &c_tk)
            .sum(Kind::Float)
            .backward();
        let want = w.grad();
        let err = (&got - &want).abs().max().double_value(&[]);
        assert!(err < 1e-6, "router gradient differs by {err:e}");
    }
}

#[test]
fn checkpointed_replay_gives_the_plain_gradients() {
    for cfg in [deepseek_cfg(), qwen3_moe_cfg()] {
        let (vs, mut model) = build(&cfg, 5);
        model.set_recompute_slice_tokens(7);
        let (b, t) = (2, 24);
        let tokens = Tensor::randint(cfg.vocab_size, [b, t], (Kind::Int64, Device::Cpu));
        let (l, k, e) = (
            cfg.n_moe_layers(),
            cfg.num_experts_per_tok,
            cfg.n_routed_experts,
        );
        let given = Tensor::randn([b, t, l, e], (Kind::Float, Device::Cpu))
            .argsort(-1, false)
            .narrow(3, 0, k)
            .contiguous();
        let _ = given.narrow(1, t - 3, 3).fill_(-1);
        let grad_h = Tensor::randn([b, t, cfg.hidden_size], (Kind::Float, Device::Cpu));
        let run = |checkpoint| {
            for (_, v) in vs.variables() {
                let mut g = v.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            }
            let trunk = model
                .trunk_routed(&tokens, None, true, checkpoint, RouteOpts::replay(&given))
                .unwrap();
            let agreement = trunk.agreement.clone();
            model.backward(trunk, &grad_h, 1.0).unwrap();
            let mut grads: Vec<(String, Tensor)> = vs
                .variables()
                .into_iter()
                .filter(|(_, v)| v.grad().defined())
                .map(|(n, v)| (n, v.grad().copy()))
                .collect();
            grads.sort_by(|a, b| a.0.cmp(&b.0));
            (grads, agreement)
        };
        let (plain, a_plain) = run(Checkpoint::None);
        let (ckpt, a_ckpt) = run(Checkpoint::Blocks);
        assert_eq!(a_plain, a_ckpt);
        assert_eq!(plain.len(), ckpt.len());
        for ((name, p), (_, c)) in plain.iter().zip(&ckpt) {
            let scale = p.norm().double_value(&[]).max(1e-12);
            let r = (p - c).norm().double_value(&[]) / scale;
            assert!(r < 1e-5, "gradient of {name} differs by {r:e} relative");
        }
        let router = plain
            .iter()
            .find(|(n, _)| n.ends_with("gate.weight"))
            .expect("a router");
        assert!(router.1.abs().max().double_value(&[]) > 0.0);
    }
}

#[test]
fn malformed_route_tables_are_refused() {
    let cfg = deepseek_cfg();
    let (_vs, model) = build(&cfg, 1);
    let tokens = Tensor::randint(cfg.vocab_size, [1, 8], (Kind::Int64, Device::Cpu));
    let (l, k) = (cfg.n_moe_layers(), cfg.num_experts_per_tok);
    let cases = [
        (
            Tensor::zeros([1, 7, l, k], (Kind::Int64, Device::Cpu)),
            "routes must be",
        ),
        (
            Tensor::zeros([1, 8, l + 1, k], (Kind::Int64, Device::Cpu)),
            "routes must be",
        ),
        (
            Tensor::zeros([1, 8, l, k], (Kind::Float, Device::Cpu)),
            "routes must be",
        ),
        (
            Tensor::zeros([1, 8, l, k], (Kind::Int64, Device::Cpu)),
            "names the same expert twice",
        ),
        (
            // A row of one expert and one -1.
            Tensor::cat(
                &[
                    Tensor::zeros([1, 8, l, 1], (Kind::Int64, Device::Cpu)),
                    Tensor::full([1, 8, l, 1], -1, (Kind::Int64, Device::Cpu)),
                ],
                3,
            ),
            "mixes -1 with expert ids",
        ),
        (
            Tensor::full(
                [1, 8, l, k],
                cfg.n_routed_experts,
                (Kind::Int64, Device::Cpu),
            ),
            "route ids span",
        ),
        (
            Tensor::full([1, 8, l, k], -2, (Kind::Int64, Device::Cpu)),
            "route ids span",
        ),
    ];
    for (given, want) in cases {
        let err = model
            .trunk_routed(
                &tokens,
                None,
                false,
                Checkpoint::None,
                RouteOpts::replay(&given),
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{err}");
    }
}

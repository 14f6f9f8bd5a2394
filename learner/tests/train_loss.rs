//! The RL loss terms on hand-computed examples, and masking through the whole trainer.

use corvid_learner::train::loss::{
    clip_masks, clipped_surrogate, importance_ratio, k3_kl, token_sum_over,
    truncated_importance_weight,
};
use corvid_learner::train::{RlConfig, RlTrainer};
use corvid_model::{ModelConfig, MoePolicy};
use corvid_proto::{
    SamplingParams, Step, TaskRef, Termination, Trajectory, TrajectoryFooter, TrajectoryHeader,
};
use corvid_tokenizer::{ByteTokenizer, Special};
use tch::{nn, Device, Kind, Tensor};

fn t(x: &[f64]) -> Tensor {
    Tensor::from_slice(x)
}
fn v(x: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(x.to_kind(Kind::Double)).unwrap()
}
fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol)
}

/// Loss and d loss / d logp_new for per-token ratios `r` (logp_prox = 0, logp_new = ln r).
fn surrogate_and_grad(r: &[f64], a: &[f64], lo: f64, hi: f64) -> (Vec<f64>, Vec<f64>) {
    let logp_new = t(&r.iter().map(|x| x.ln()).collect::<Vec<_>>()).set_requires_grad(true);
    let ratio = importance_ratio(
        &logp_new,
        &Tensor::zeros([r.len() as i64], (Kind::Double, Device::Cpu)),
    );
    let l = clipped_surrogate(&ratio, &t(a), lo, hi);
    l.sum(Kind::Double).backward();
    (v(&l), v(&logp_new.grad()))
}

#[test]
fn surrogate_clips_positive_advantages_above_one_plus_clip_high() {
    // A = +1. r = 1.5 > 1.28: L = −min(1.5, 1.28) = −1.28, no gradient.
    //         r = 1.1 inside:  L = −1.1, dL/dlogp = −r·A = −1.1.
    //         r = 0.5 < 0.8:   L = −min(0.5, 0.8) = −0.5 (a positive advantage is never
    //                          clipped from below), dL/dlogp = −0.5.
    let (l, g) = surrogate_and_grad(&[1.5, 1.1, 0.5], &[1.0, 1.0, 1.0], 0.2, 0.28);
    assert!(close(&l, &[-1.28, -1.1, -0.5], 1e-12), "{l:?}");
    assert!(close(&g, &[0.0, -1.1, -0.5], 1e-12), "{g:?}");
}

#[test]
fn surrogate_clips_negative_advantages_below_one_minus_clip_low() {
    // A = −2. r = 0.5 < 0.8:  L = −min(−1.0, −1.6) = 1.6, no gradient.
    //         r = 0.9 inside: L = 1.8, dL/dlogp = −r·A = 1.8.
    //         r = 1.5 > 1.28: L = −min(−3.0, −2.56) = 3.0 (pessimistic: not clipped),
    //                         dL/dlogp = 3.0.
    let (l, g) = surrogate_and_grad(&[0.5, 0.9, 1.5], &[-2.0, -2.0, -2.0], 0.2, 0.28);
    assert!(close(&l, &[1.6, 1.8, 3.0], 1e-12), "{l:?}");
    assert!(close(&g, &[0.0, 1.8, 3.0], 1e-12), "{g:?}");
}

#[test]
fn clip_is_asymmetric_and_the_masks_count_the_right_side() {
    // r = 1.25 is inside [0.8, 1.28] with clip-higher but would be clipped at ε = 0.2.
    let r = t(&[1.25, 1.3, 0.7, 0.7, 1.3]);
    let a = t(&[1.0, 1.0, -1.0, 1.0, -1.0]);
    let l = v(&clipped_surrogate(&r, &a, 0.2, 0.28));
    let sym = v(&clipped_surrogate(&r, &a, 0.2, 0.2));
    assert!((l[0] + 1.25).abs() < 1e-12 && (sym[0] + 1.2).abs() < 1e-12);
    let (low, high) = clip_masks(&r, &a, 0.2, 0.28);
    let low = Vec::<bool>::try_from(&low).unwrap();
    let high = Vec::<bool>::try_from(&high).unwrap();
    assert_eq!(low, vec![false, false, true, false, false]);
    assert_eq!(high, vec![false, true, false, false, false]);
}

#[test]
fn truncated_importance_weight_caps_and_flags() {
    // π_prox/μ = 3 → capped at 2; 0.5 and 1 pass unchanged.
    let prox = t(&[3f64.ln(), 0.5f64.ln(), -1.0]);
    let beh = t(&[0.0, 0.0, -1.0]);
    let (w, cut) = truncated_importance_weight(&prox, &beh, 2.0);
    assert!(close(&v(&w), &[2.0, 0.5, 1.0], 1e-12), "{:?}", v(&w));
    assert_eq!(
        Vec::<bool>::try_from(&cut).unwrap(),
        vec![true, false, false]
    );
    // The weight carries no gradient.
    let prox = prox.set_requires_grad(true);
    let (w, _) = truncated_importance_weight(&prox, &beh, 2.0);
    assert!(!w.requires_grad());
}

#[test]
fn k3_kl_matches_the_formula_by_hand() {
    // π_θ = 0.5, π_ref = 0.25: x = ln 0.5, k3 = 0.5 − ln 0.5 − 1 = ln 2 − 0.5.
    let k = v(&k3_kl(&t(&[0.5f64.ln(), -1.0]), &t(&[0.25f64.ln(), -1.0])));
    assert!((k[0] - (2f64.ln() - 0.5)).abs() < 1e-12, "{k:?}");
    assert_eq!(k[1], 0.0);
    // Gradient flows through log π_θ: d k3 / d logp = 1 − exp(x) = 0.5.
    let lp = t(&[0.5f64.ln()]).set_requires_grad(true);
    k3_kl(&lp, &t(&[0.25f64.ln()])).sum(Kind::Double).backward();
    assert!((v(&lp.grad())[0] - 0.5).abs() < 1e-12);
}

#[test]
fn entropy_and_token_mean_by_hand() {
    // Logits log p through an identity head: softmax gives p back.
    let logp = t(&[0.5f64.ln(), 0.5f64.ln(), 0.25f64.ln(), 0.75f64.ln()]).view([2, 2]);
    let eye = Tensor::eye(2, (Kind::Double, tch::Device::Cpu));
    let targets = Tensor::from_slice(&[0i64, 1]);
    let ones = Tensor::ones([2, 1], (Kind::Float, tch::Device::Cpu));
    let scores = corvid_model::head::score_full(&logp, &eye, &targets, &ones).unwrap();
    let h = v(&scores.entropy_n.to_kind(Kind::Double));
    assert!(close(
        &v(&scores.logp_n.to_kind(Kind::Double)),
        &[0.5f64.ln(), 0.75f64.ln()],
        1e-6
    ));
    let h1 = -(0.25 * 0.25f64.ln() + 0.75 * 0.75f64.ln());
    assert!(close(&h, &[2f64.ln(), h1], 1e-7), "{h:?}");
    let m = token_sum_over(&t(&[1.0, 2.0, 3.0]), 4.0).double_value(&[]);
    assert!((m - 1.5).abs() < 1e-6);
}

// ---------------------------------------------------------------- masking, end to end

fn header(id: &str) -> TrajectoryHeader {
    TrajectoryHeader {
        trajectory_id: id.into(),
        task: TaskRef {
            family: "hops".into(),
            level: 1,
            seed: 1,
            spec_hash: "x".into(),
        },
        actor_id: "a".into(),
        policy_version: 0,
        sampling: SamplingParams::default(),
        group_id: "g".into(),
        started_unix_ms: 0,
        routes: None,
        context: None,
    }
}

fn footer(reward: f32) -> TrajectoryFooter {
    TrajectoryFooter {
        outcome_reward: reward,
        success: reward > 0.5,
        termination: Termination::Answered,
        step_count: 0,
        token_count: 0,
        generated_token_count: 0,
        wall_ms: 0,
        finished_unix_ms: 0,
        template_divergent: false,
    }
}

/// Two-turn episode: prompt, generated, tool output, generated.
fn episode(id: &str, reward: f32, gen: [&str; 2], tool: &str, noise: f32) -> Trajectory {
    let tok = ByteTokenizer::new();
    let mut prompt = vec![Special::User.id()];
    prompt.extend(tok.encode_plain("find it"));
    prompt.push(Special::Assistant.id());
    let g0 = tok.encode_plain(gen[0]);
    let g1 = tok.encode_plain(gen[1]);
    let mut ctx1 = vec![Special::Tool.id()];
    ctx1.extend(tok.encode_plain(tool));
    ctx1.push(Special::Assistant.id());
    let mut s0 = Step::context(0, prompt);
    let n0 = g0.len();
    s0.token_ids.extend(&g0);
    s0.loss_mask.extend(vec![true; n0]);
    s0.logprobs.extend(vec![-1.5; n0]);
    let mut s1 = Step::context(1, ctx1);
    let n1 = g1.len();
    s1.token_ids.extend(&g1);
    s1.loss_mask.extend(vec![true; n1]);
    s1.logprobs.extend(vec![-2.0; n1]);
    s1.process_reward = 0.1;
    // `noise` goes into the log-probs of the masked (context) tokens only.
    for s in [&mut s0, &mut s1] {
        for (lp, m) in s.logprobs.iter_mut().zip(&s.loss_mask) {
            if !m {
                *lp = noise;
            }
        }
    }
    Trajectory {
        header: header(id),
        footer: footer(reward),
        steps: vec![s0, s1],
    }
}

fn grads(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let mut g: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .filter(|(_, t)| t.requires_grad() && t.grad().defined())
        .map(|(n, t)| (n, t.grad().copy()))
        .collect();
    g.sort_by(|a, b| a.0.cmp(&b.0));
    g
}

#[test]
fn masked_tokens_contribute_nothing_to_loss_or_gradient() {
    tch::manual_seed(7);
    let cfg = ModelConfig {
        num_hidden_layers: 2,
        ..ModelConfig::tiny()
    };
    let vs = nn::VarStore::new(Device::Cpu);
    let model = MoePolicy::new(&vs.root(), &cfg).unwrap();
    let rl = RlConfig {
        kl_coef: 0.0,
        entropy_coef: 0.01,
        ..RlConfig::default()
    };
    let mut trainer = RlTrainer::new(vs, model, None, rl, Special::Pad.id()).unwrap();
    let group = |noise: f32| {
        vec![
            episode("a", 1.0, ["read(x)", "answer 7"], "x: 7", noise),
            episode("b", 0.0, ["read(y)", "answer 3"], "no such file", noise),
        ]
    };
    let s0 = trainer.backward_only(&[group(0.0)], 0, &[]).unwrap();
    let g0 = grads(&trainer.state().vs);
    let s1 = trainer.backward_only(&[group(-7.25)], 0, &[]).unwrap();
    let g1 = grads(&trainer.state().vs);
    assert!(s0.tokens > 0 && s0.grad_norm > 0.0, "{s0:?}");
    assert_eq!(s0.policy_loss.to_bits(), s1.policy_loss.to_bits());
    assert_eq!(s0.is_weight_mean.to_bits(), s1.is_weight_mean.to_bits());
    assert_eq!(g0.len(), g1.len());
    for ((n, a), (_, b)) in g0.iter().zip(&g1) {
        assert!(a.equal(b), "gradient of {n} changed with masked log-probs");
    }
    // Only generated tokens are counted: 7 + 8 per episode, minus none (the first token
    // of each episode is a prompt token).
    assert_eq!(s0.tokens, 2 * (7 + 8));
    // The behaviour log-probs of generated tokens do matter (through w): a sanity check
    // that the comparison above can fail.
    let mut changed = group(0.0);
    let step = &mut changed[0].steps[1];
    for (lp, m) in step.logprobs.iter_mut().zip(&step.loss_mask) {
        if *m {
            *lp = -0.1;
        }
    }
    let s2 = trainer.backward_only(&[changed], 0, &[]).unwrap();
    assert_ne!(s0.is_weight_mean.to_bits(), s2.is_weight_mean.to_bits());
}

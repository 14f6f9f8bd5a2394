//! Shared helpers for the actor's integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use corvid_actor::{
    ActorError, Choice, ChoiceContext, EngineHandle, LoadedPolicy, NucleusSampler, PolicyUpdate,
    TokenChooser,
};
use corvid_model::{ModelConfig, MoePolicy};
use corvid_proto::{SamplingParams, Termination, Trajectory};
use corvid_sandbox::Sandbox;
use corvid_tasks::{TaskEnv, TaskInstance};
use tch::{Device, Kind, Tensor};

/// The tiny preset shrunk to two layers, so a test's forwards take milliseconds.
pub fn test_model_config() -> ModelConfig {
    ModelConfig {
        num_hidden_layers: 2,
        ..ModelConfig::tiny()
    }
}

/// A random policy of the test config labelled `version` (its weights depend on `version`).
pub fn random_policy(version: u64) -> LoadedPolicy {
    tch::set_num_threads(1);
    tch::manual_seed(7 + version as i64);
    let mut p = LoadedPolicy::random(&test_model_config(), Device::Cpu).unwrap();
    p.set_version(version);
    p
}

/// A policy of the test config holding the weights `bytes`, labelled `version`.
pub fn policy_from_bytes(bytes: &[u8], version: u64) -> LoadedPolicy {
    LoadedPolicy::from_bytes(&test_model_config(), Device::Cpu, bytes, version).unwrap()
}

/// The environment every test uses.
pub fn env() -> TaskEnv {
    TaskEnv::new(Sandbox::builder().search_tool(true).build().unwrap())
}

/// A built-in task instance.
pub fn task(family: &str, level: u32, seed: u64) -> Arc<TaskInstance> {
    Arc::new(
        corvid_tasks::builtin_family(family)
            .unwrap()
            .instance(level, seed)
            .unwrap(),
    )
}

/// Sampling at temperature 1 without nucleus (log-probs comparable with a full forward).
pub fn sampling(max_new_tokens: u32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        max_new_tokens,
        seed,
    }
}

/// Checks the invariants a learner relies on: every step validates, steps are in turn
/// order, the footer's totals match the steps, and a scored outcome is 0 or 1.
pub fn assert_valid(t: &Trajectory) {
    let mut tokens = 0;
    let mut generated = 0;
    let mut last_turn = 0;
    for (i, s) in t.steps.iter().enumerate() {
        s.validate().unwrap();
        assert!(s.turn >= last_turn, "step {i}: turn went backwards");
        last_turn = s.turn;
        tokens += s.token_ids.len() as u64;
        generated += s.generated_count() as u64;
        if s.generated_count() > 0 {
            assert!(
                s.policy_version >= t.header.policy_version,
                "step {i}: version below the header's"
            );
        } else {
            assert_eq!(s.policy_version, 0, "step {i} generated nothing");
        }
    }
    assert_eq!(t.footer.step_count, t.steps.len() as u64);
    assert_eq!(t.footer.token_count, tokens);
    assert_eq!(t.footer.generated_token_count, generated);
    assert!(t.footer.outcome_reward == 0.0 || t.footer.outcome_reward == 1.0);
    if t.footer.termination == Termination::InfraError {
        assert!(!t.footer.success);
    }
}

/// Recomputes every generated token's log-prob with a full (uncached) forward over its whole
/// context segment (the whole sequence for an episode that never folded) at `temperature`
/// and returns the largest difference from the recorded one: 0 up to rounding exactly when
/// each segment's ids are what the policy saw.
pub fn max_logprob_error(model: &MoePolicy, t: &Trajectory, temperature: f64) -> f64 {
    max_logprob_error_by_version(&|_| model, t, temperature)
}

/// As [`max_logprob_error`], each generated token scored by the model of the version
/// recorded with its step (a segment is causal, so one forward per version covers every
/// prefix).
pub fn max_logprob_error_by_version<'m>(
    model_of: &dyn Fn(u64) -> &'m MoePolicy,
    t: &Trajectory,
    temperature: f64,
) -> f64 {
    let mut worst = 0.0f64;
    for seg in t.segments() {
        let steps = &t.steps[seg];
        let ids: Vec<i64> = steps
            .iter()
            .flat_map(|s| s.token_ids.iter().map(|&id| i64::from(id)))
            .collect();
        let recorded: Vec<(bool, f32, u64)> = steps
            .iter()
            .flat_map(|s| {
                s.loss_mask
                    .iter()
                    .zip(&s.logprobs)
                    .map(|(m, l)| (*m, *l, s.policy_version))
            })
            .collect();
        assert!(
            recorded.first().is_none_or(|r| !r.0),
            "a segment starts with context"
        );
        let n = ids.len() as i64;
        let tokens = Tensor::from_slice(&ids).view([1, n]);
        let mut by_version: std::collections::HashMap<u64, Vec<f32>> = Default::default();
        for (i, &(m, rec, v)) in recorded.iter().enumerate().skip(1) {
            if !m {
                continue;
            }
            let lp = by_version.entry(v).or_insert_with(|| {
                let model = model_of(v);
                let out = tch::no_grad(|| model.forward(&tokens, false).unwrap());
                let logits = out.logits_btv.narrow(1, 0, n - 1);
                let targets = tokens.narrow(1, 1, n - 1);
                let lp = MoePolicy::token_logprobs(&logits, &targets, temperature)
                    .unwrap()
                    .to_kind(Kind::Float)
                    .view([-1]);
                Vec::<f32>::try_from(lp).unwrap()
            });
            worst = worst.max((f64::from(lp[i - 1]) - f64::from(rec)).abs());
        }
    }
    worst
}

/// Samples normally and hands the engine a new policy after `after` tokens.
pub struct SwapAfter {
    after: usize,
    seen: usize,
    handle: EngineHandle,
    update: Option<PolicyUpdate>,
}

impl SwapAfter {
    /// Hands `update` to the engine behind `handle` once `after` tokens were drawn.
    pub fn new(after: usize, handle: EngineHandle, update: PolicyUpdate) -> Self {
        Self {
            after,
            seen: 0,
            handle,
            update: Some(update),
        }
    }
}

impl TokenChooser for SwapAfter {
    fn choose(&mut self, ctx: ChoiceContext<'_>, logits_v: &[f32]) -> Result<Choice, ActorError> {
        self.seen += 1;
        if self.seen == self.after {
            if let Some(u) = self.update.take() {
                self.handle.update_policy(u)?;
            }
        }
        NucleusSampler.choose(ctx, logits_v)
    }
}

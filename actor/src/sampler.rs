//! Choosing each generated token from the model's logits.
//!
//! The engine hands every decoding sequence's next-token logits to a [`TokenChooser`]. The
//! default, [`NucleusSampler`], samples with the episode's temperature and top-p from the
//! episode's own RNG (seeded by `SamplingParams::seed`), so an episode's draws do not depend
//! on which other episodes share its batch. [`ScriptedTokens`] forces given token sequences
//! instead (teacher forcing) while still recording their log-probs under the model: tests
//! use it to drive the real engine through every tool failure class, and benchmarks to run
//! oracle episodes.
//!
//! The recorded log-prob is that of the distribution actually sampled from:
//! `log softmax(logits / T)` restricted to the nucleus and renormalised. With `top_p = 1` it
//! is exactly what `MoePolicy::token_logprobs` recomputes at temperature `T`. Greedy
//! (`T = 0`) records `log softmax(logits)` of the argmax.

use std::collections::HashMap;

use corvid_proto::SamplingParams;
use corvid_tasks::SplitMix64;

use crate::error::ActorError;

/// A chosen token and its behaviour log-prob.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    /// Token id.
    pub token: u32,
    /// Log-prob under the distribution the token was drawn from.
    pub logprob: f32,
}

/// What the chooser knows about the sequence it picks for.
#[derive(Debug)]
pub struct ChoiceContext<'a> {
    /// The episode's trajectory id.
    pub trajectory_id: &'a str,
    /// Turn index (0-based).
    pub turn: u32,
    /// Tokens generated so far in this turn.
    pub generated: &'a [u32],
    /// The episode's sampling parameters.
    pub sampling: &'a SamplingParams,
    /// The episode's RNG (seeded from `sampling.seed`).
    pub rng: &'a mut SplitMix64,
}

/// Picks the next token of one sequence from its logits `[V]`.
pub trait TokenChooser: Send {
    /// The next token and its log-prob.
    fn choose(&mut self, ctx: ChoiceContext<'_>, logits_v: &[f32]) -> Result<Choice, ActorError>;
}

/// `log softmax(logits / t)` in f64 (`t = 1` for greedy).
pub fn log_softmax(logits_v: &[f32], temperature: f32) -> Vec<f64> {
    let t = if temperature > 0.0 {
        f64::from(temperature)
    } else {
        1.0
    };
    let z: Vec<f64> = logits_v.iter().map(|&l| f64::from(l) / t).collect();
    let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + z.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
    z.into_iter().map(|v| v - lse).collect()
}

/// Temperature and top-p sampling from the episode's RNG.
#[derive(Debug, Clone, Copy, Default)]
pub struct NucleusSampler;

impl TokenChooser for NucleusSampler {
    fn choose(&mut self, ctx: ChoiceContext<'_>, logits_v: &[f32]) -> Result<Choice, ActorError> {
        let p = ctx.sampling;
        if logits_v.is_empty() {
            return Err(ActorError::invalid("logits", "empty vocabulary"));
        }
        if logits_v.iter().any(|l| l.is_nan()) {
            return Err(ActorError::invalid("logits", "NaN in the model's output"));
        }
        let logp = log_softmax(logits_v, p.temperature);
        if p.temperature <= 0.0 {
            let (tok, lp) =
                logp.iter()
                    .enumerate()
                    .fold((0, f64::NEG_INFINITY), |best, (i, &v)| {
                        if v > best.1 {
                            (i, v)
                        } else {
                            best
                        }
                    });
            return Ok(Choice {
                token: tok as u32,
                logprob: lp as f32,
            });
        }
        if p.top_p < 1.0 {
            // Keep the most likely tokens until the mass before the next one reaches top_p
            // (the first always stays), then renormalise over them.
            let mut order: Vec<usize> = (0..logp.len()).collect();
            order.sort_by(|&a, &b| logp[b].total_cmp(&logp[a]));
            let mut kept = Vec::new();
            let mut mass = 0.0;
            for &i in &order {
                if mass >= f64::from(p.top_p) {
                    break;
                }
                mass += logp[i].exp();
                kept.push(i);
            }
            let lse = mass.ln();
            let u = ctx.rng.next_f64() * mass;
            let mut acc = 0.0;
            let mut pick = *kept.last().unwrap_or(&order[0]);
            for &i in &kept {
                acc += logp[i].exp();
                if u < acc {
                    pick = i;
                    break;
                }
            }
            return Ok(Choice {
                token: pick as u32,
                logprob: (logp[pick] - lse) as f32,
            });
        }
        let u = ctx.rng.next_f64();
        let mut acc = 0.0;
        let mut pick = None;
        let mut last_nonzero = 0;
        for (i, &lp) in logp.iter().enumerate() {
            let pr = lp.exp();
            if pr > 0.0 {
                last_nonzero = i;
            }
            acc += pr;
            if u < acc {
                pick = Some(i);
                break;
            }
        }
        // Rounding can leave the total a hair under u: take the last possible token.
        let tok = pick.unwrap_or(last_nonzero);
        Ok(Choice {
            token: tok as u32,
            logprob: logp[tok] as f32,
        })
    }
}

/// Forces scripted turns: for a trajectory id, turn `t` generates exactly `turns[t]`. Each
/// forced token's log-prob is read from the model's logits at the episode's temperature, as
/// for a sampled token. Episodes or turns without a script fall back to `fallback`.
pub struct ScriptedTokens {
    scripts: HashMap<String, Vec<Vec<u32>>>,
    fallback: Box<dyn TokenChooser>,
}

impl std::fmt::Debug for ScriptedTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedTokens")
            .field("episodes", &self.scripts.len())
            .finish_non_exhaustive()
    }
}

impl ScriptedTokens {
    /// No scripts yet; unscripted turns are sampled by [`NucleusSampler`].
    pub fn new() -> Self {
        Self {
            scripts: HashMap::new(),
            fallback: Box::new(NucleusSampler),
        }
    }

    /// Scripts the turns of `trajectory_id`.
    pub fn with_episode(mut self, trajectory_id: impl Into<String>, turns: Vec<Vec<u32>>) -> Self {
        self.scripts.insert(trajectory_id.into(), turns);
        self
    }

    /// Replaces the chooser used where no script applies.
    pub fn with_fallback(mut self, fallback: Box<dyn TokenChooser>) -> Self {
        self.fallback = fallback;
        self
    }
}

impl Default for ScriptedTokens {
    fn default() -> Self {
        Self::new()
    }
}

impl TokenChooser for ScriptedTokens {
    fn choose(&mut self, ctx: ChoiceContext<'_>, logits_v: &[f32]) -> Result<Choice, ActorError> {
        let forced = self
            .scripts
            .get(ctx.trajectory_id)
            .and_then(|turns| turns.get(ctx.turn as usize))
            .and_then(|turn| turn.get(ctx.generated.len()).copied());
        let Some(token) = forced else {
            return self.fallback.choose(ctx, logits_v);
        };
        let logp = log_softmax(logits_v, ctx.sampling.temperature);
        let lp = logp.get(token as usize).ok_or_else(|| {
            ActorError::invalid(
                "scripted token",
                format!("{token} is outside the vocabulary of {}", logp.len()),
            )
        })?;
        Ok(Choice {
            token,
            logprob: *lp as f32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx<'a>(p: &'a SamplingParams, rng: &'a mut SplitMix64) -> ChoiceContext<'a> {
        ChoiceContext {
            trajectory_id: "t",
            turn: 0,
            generated: &[],
            sampling: p,
            rng,
        }
    }

    #[test]
    fn sampled_frequencies_and_logprobs_follow_the_tempered_distribution() {
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        let p = SamplingParams {
            temperature: 0.5,
            top_p: 1.0,
            ..SamplingParams::default()
        };
        let want = log_softmax(&logits, 0.5);
        let mut rng = SplitMix64::new(3);
        let mut counts = [0usize; 4];
        for _ in 0..20_000 {
            let c = NucleusSampler.choose(ctx(&p, &mut rng), &logits).unwrap();
            assert!((f64::from(c.logprob) - want[c.token as usize]).abs() < 1e-6);
            counts[c.token as usize] += 1;
        }
        for (i, &n) in counts.iter().enumerate() {
            let freq = n as f64 / 20_000.0;
            assert!((freq - want[i].exp()).abs() < 0.015, "{i}: {freq}");
        }
    }

    #[test]
    fn nucleus_drops_the_tail_and_renormalises() {
        // Probabilities about 0.64, 0.24, 0.09, 0.03: top_p 0.8 keeps the first two.
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.8,
            ..SamplingParams::default()
        };
        let full = log_softmax(&logits, 1.0);
        let kept = (full[0].exp() + full[1].exp()).ln();
        let mut rng = SplitMix64::new(9);
        for _ in 0..2_000 {
            let c = NucleusSampler.choose(ctx(&p, &mut rng), &logits).unwrap();
            assert!(c.token < 2, "token {} is outside the nucleus", c.token);
            let want = full[c.token as usize] - kept;
            assert!((f64::from(c.logprob) - want).abs() < 1e-6);
        }
    }

    #[test]
    fn greedy_takes_the_argmax_with_its_untempered_logprob() {
        let logits = [0.1f32, 3.0, 2.9];
        let p = SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        };
        let mut rng = SplitMix64::new(1);
        let c = NucleusSampler.choose(ctx(&p, &mut rng), &logits).unwrap();
        assert_eq!(c.token, 1);
        assert!((f64::from(c.logprob) - log_softmax(&logits, 1.0)[1]).abs() < 1e-6);
    }

    #[test]
    fn scripts_force_tokens_and_fall_back_after_them() {
        let logits = [0.0f32, 5.0, 0.0];
        let p = SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        };
        let mut s = ScriptedTokens::new().with_episode("t", vec![vec![2]]);
        let mut rng = SplitMix64::new(1);
        let c = s.choose(ctx(&p, &mut rng), &logits).unwrap();
        assert_eq!(c.token, 2);
        assert!((f64::from(c.logprob) - log_softmax(&logits, 1.0)[2]).abs() < 1e-6);
        let after = ChoiceContext {
            generated: &[2],
            ..ctx(&p, &mut rng)
        };
        assert_eq!(s.choose(after, &logits).unwrap().token, 1);
    }
}

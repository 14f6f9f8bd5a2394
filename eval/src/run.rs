//! Running a checked [`Plan`]: level by level, the episodes each level needs are planned, the
//! ones the store already holds are reused (see `reuse`), the rest are decoded and
//! stored, and the level's figures are computed from all of them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use corvid_actor::{EngineConfig, EpisodeSpec, LoadedPolicy};
use corvid_episode::EpisodeFormat;
use corvid_proto::{SamplingParams, Trajectory};
use corvid_store::{TrajectoryRecord, TrajectoryStore};
use corvid_tasks::{TaskEnv, TaskFamily};

use crate::metrics::{level_result, EvalResult, FamilyResult, InstanceFacts, LevelResult};
use crate::plan::{EvalOptions, Plan};
use crate::policy::EvalPolicy;
use crate::reuse::{reusable, stored_trajectory, LevelIds};
use crate::sink::EvalSink;

impl Plan {
    /// Runs the evaluation into `store` with tasks in `env`, and returns its result.
    ///
    /// Each level's episodes are stored under `<label>.<family>.L<level>.s<seed>.k<i>`; those
    /// the store already holds under the label and level are reused when they are exactly
    /// this evaluation's and refused otherwise, before anything runs at that level.
    pub fn run(self, env: &TaskEnv, store: &Arc<TrajectoryStore>) -> Result<EvalResult> {
        let started = Instant::now();
        let actor_id = self.policy.actor_id();
        let Plan {
            opts,
            family,
            policy,
            label,
            sampling,
            format,
        } = self;
        let EvalPolicy {
            loaded: mut policy,
            source: checkpoint,
            ..
        } = policy;
        let levels_run = Levels {
            opts: &opts,
            family: family.as_ref(),
            label: &label,
            sampling,
            actor_id,
            format,
            env,
            store,
        };
        let (lo, hi) = opts.levels;
        let mut levels = Vec::new();
        let mut generated = 0u64;
        for level in lo..=hi {
            let (result, tokens) = levels_run.level(&mut policy, level)?;
            generated += tokens;
            levels.push(result);
        }
        store.flush_sync().context("flushing the eval store")?;
        let wall_s = started.elapsed().as_secs_f64();
        Ok(EvalResult {
            stage: opts.stage.clone(),
            checkpoint,
            policy_version: policy.version(),
            episodes_per_level: opts.episodes,
            k: opts.k,
            temperature: opts.temperature,
            seed: opts.seed,
            store: store.path().display().to_string(),
            label,
            families: vec![FamilyResult::new(family.name(), levels)],
            wall_s,
            generated_tokens_per_s: generated as f64 / wall_s.max(1e-9),
        })
    }
}

/// What every level of one evaluation shares.
struct Levels<'a> {
    opts: &'a EvalOptions,
    family: &'a dyn TaskFamily,
    label: &'a str,
    sampling: SamplingParams,
    actor_id: String,
    format: EpisodeFormat,
    env: &'a TaskEnv,
    store: &'a Arc<TrajectoryStore>,
}

/// One level's episodes, before any is run.
struct LevelEpisodes {
    /// `k` samples of each instance, in instance order.
    specs: Vec<EpisodeSpec>,
    /// What the figures need from each instance, by its seed.
    instances: HashMap<u64, InstanceFacts>,
}

impl Levels<'_> {
    /// Evaluates `level`: its figures and the tokens generated for it.
    fn level(&self, policy: &mut LoadedPolicy, level: u32) -> Result<(LevelResult, u64)> {
        let ids = LevelIds {
            label: self.label,
            family: self.family.name(),
            level,
        };
        let LevelEpisodes {
            mut specs,
            instances,
        } = self.episodes(&ids)?;
        let reuse = reusable(self.store, &ids, &specs, policy.version())?;
        self.skip_reused(&mut specs, &reuse, level);
        let (mut trajectories, generated) = self.decode(policy, specs, level)?;
        for r in reuse {
            trajectories.push(stored_trajectory(self.store, r)?);
        }
        trajectories.sort_by(|a, b| a.header.trajectory_id.cmp(&b.header.trajectory_id));
        let r = level_result(&self.format, level, &trajectories, &instances, self.opts.k)?;
        if self.opts.progress {
            eprintln!(
                "{} level {level}: success {} over {} episodes ({:.1} turns, {:.0} tokens on average)",
                self.family.name(),
                r.success_rate
                    .map(|s| format!("{:.1}%", 100.0 * s))
                    .unwrap_or_else(|| "n/a".into()),
                r.episodes,
                r.mean_turns,
                r.mean_tokens
            );
        }
        Ok((r, generated))
    }

    /// The level's `episodes × k` episodes: instance `seed, seed+1, …`, sample `j` of each
    /// seeded `seed ^ (j << 32)`.
    fn episodes(&self, ids: &LevelIds<'_>) -> Result<LevelEpisodes> {
        let opts = self.opts;
        let mut specs = Vec::new();
        let mut instances = HashMap::new();
        for i in 0..opts.episodes as u64 {
            let seed = opts.seed.wrapping_add(i);
            let task = Arc::new(self.family.instance(ids.level, seed)?);
            instances.insert(
                seed,
                InstanceFacts {
                    oracle_calls: task.oracle_calls() as u32,
                    layout: self.family.fact_layout(&task),
                },
            );
            for j in 0..opts.k {
                let mut spec = EpisodeSpec::new(
                    ids.sample(seed, j),
                    task.clone(),
                    SamplingParams {
                        seed: seed ^ ((j as u64) << 32),
                        ..self.sampling
                    },
                );
                spec.actor_id = self.actor_id.clone();
                spec.group_id = ids.group(seed);
                spec.context.clone_from(&self.opts.context);
                specs.push(spec);
            }
        }
        Ok(LevelEpisodes { specs, instances })
    }

    /// Drops from `specs` the episodes `reuse` already holds, saying so on stderr.
    fn skip_reused(&self, specs: &mut Vec<EpisodeSpec>, reuse: &[TrajectoryRecord], level: u32) {
        if reuse.is_empty() {
            return;
        }
        let reused: HashSet<&str> = reuse
            .iter()
            .map(|r| r.header.trajectory_id.as_str())
            .collect();
        specs.retain(|s| !reused.contains(s.trajectory_id.as_str()));
        let (label, actor_id) = (self.label, &self.actor_id);
        eprintln!(
            "note: {} of the {} episodes of {} level {level} are already stored under label \
             {label:?} by these weights ({actor_id}) with the same policy version, sampling and \
             tasks; reusing them{}",
            reuse.len(),
            reuse.len() + specs.len(),
            self.family.name(),
            if specs.is_empty() {
                String::new()
            } else {
                format!(" and running the other {}", specs.len())
            }
        );
    }

    /// Decodes `specs`, storing each episode as it grows: the finished trajectories and the
    /// tokens generated.
    fn decode(
        &self,
        policy: &mut LoadedPolicy,
        specs: Vec<EpisodeSpec>,
        level: u32,
    ) -> Result<(Vec<Trajectory>, u64)> {
        if specs.is_empty() {
            return Ok((Vec::new(), 0));
        }
        let cfg = EngineConfig {
            max_concurrency: self.opts.concurrency.max(1),
            format: self.format.clone(),
            ..EngineConfig::default()
        };
        let mut sink = EvalSink::new(self.store.clone());
        let stats = corvid_actor::run_episodes_into(policy, self.env, specs, cfg, None, &mut sink)
            .with_context(|| format!("evaluating level {level}"))?;
        let collected = sink.into_collected();
        if let Some(e) = collected.error {
            return Err(e);
        }
        if collected.duplicates > 0 {
            bail!(
                "{} episodes of level {level} were stored under label {:?} by another \
                 evaluation while this one ran; choose another --label",
                collected.duplicates,
                self.label
            );
        }
        Ok((collected.finished, stats.generated_tokens))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use corvid_store::Filter;

    use crate::testing::{checkpoint_at, evaluate, options, random_checkpoint, random_l1};
    use crate::EvalOptions;

    use super::*;

    #[test]
    fn a_random_policy_is_evaluated_and_every_episode_is_stored() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = dir.path().join("store");
        let opts = EvalOptions {
            levels: (1, 2),
            episodes: 2,
            k: 2,
            temperature: 1.0,
            max_new_tokens: 12,
            label: Some("t".into()),
            ..random_l1()
        };
        let r = evaluate(opts, &store).expect("evaluates");
        assert_eq!(r.families.len(), 1);
        let levels = &r.families[0].levels;
        assert_eq!(
            levels.iter().map(|l| l.level).collect::<Vec<_>>(),
            vec![1, 2]
        );
        for l in levels {
            assert_eq!(l.episodes, 4, "2 instances x k=2");
            assert_eq!(l.terminations.values().sum::<usize>(), 4);
            // A random byte policy does not solve a multi-hop task.
            assert_eq!(l.success_rate, Some(0.0));
            assert!(l.mean_tokens > 0.0);
        }
        assert_eq!(
            levels[0].multi_step_completion, None,
            "one call: not multi-step"
        );
        let json = serde_json::to_value(&r).expect("json");
        assert!(json["families"][0]["levels"][0]["pass_at_k"].is_number());
        assert_eq!(r.store, store.display().to_string());
        // Every episode is in the store, replayable.
        let s = TrajectoryStore::open(&store).expect("store reopens");
        let stats = s.stats().expect("stats");
        assert_eq!(stats.finished, 8, "{stats:?}");
        assert!(s
            .get("t.hops.L1.s4611686018427387904.k1")
            .expect("get")
            .is_some());
    }

    #[test]
    fn a_label_is_reused_only_for_the_same_evaluation() {
        let dir = tempfile::tempdir().expect("tmp");
        let a = random_checkpoint(&dir.path().join("a"));
        let b = random_checkpoint(&dir.path().join("b"));
        let store = dir.path().join("store");
        let eval = |ck: &Path, label: &str, episodes: usize| {
            let opts = EvalOptions {
                episodes,
                max_new_tokens: 6,
                label: Some(label.into()),
                ..options(checkpoint_at(ck))
            };
            evaluate(opts, &store)
        };
        let stored = || {
            let s = TrajectoryStore::open(&store).expect("opens");
            let mut ids: Vec<(String, String)> = s
                .list(&Filter::default())
                .map(|r| {
                    let h = r.expect("record").header;
                    (h.trajectory_id, h.actor_id)
                })
                .collect();
            ids.sort();
            ids
        };
        let first = eval(&a, "t", 2).expect("evaluates");
        assert_eq!(first.label, "t", "the result names its label");
        let after_first = stored();
        assert_eq!(after_first.len(), 2);
        assert!(after_first
            .iter()
            .all(|(_, actor)| actor.starts_with("eval@")));
        // The same evaluation again: the stored episodes are the result, nothing is added.
        let again = eval(&a, "t", 2).expect("reuses");
        assert_eq!(stored(), after_first);
        assert_eq!(
            serde_json::to_value(&again.families).expect("json"),
            serde_json::to_value(&first.families).expect("json")
        );
        // More instances: the two stored ones are reused, the third is run.
        let more = eval(&a, "t", 3).expect("extends");
        assert_eq!(more.families[0].levels[0].episodes, 3);
        assert_eq!(stored().len(), 3);
        // Other weights under the same label: refused, naming the label, the count and the way out.
        let err = format!("{:#}", eval(&b, "t", 3).expect_err("refused"));
        for want in [
            "\"t\"",
            "3 episode(s)",
            "other weights",
            "--label",
            "--store",
        ] {
            assert!(err.contains(want), "{want}: {err}");
        }
        // Fewer instances than stored: the store would hold episodes the figures left out.
        let err = format!("{:#}", eval(&a, "t", 2).expect_err("refused"));
        assert!(err.contains("not one of this evaluation's"), "{err}");
        assert_eq!(
            stored().len(),
            3,
            "nothing was stored by a refused evaluation"
        );
        // Another label for the other weights is fine.
        eval(&b, "u", 1).expect("evaluates");
        assert_eq!(stored().len(), 4);
    }
}

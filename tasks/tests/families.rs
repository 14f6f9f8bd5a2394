//! Every built-in family: the oracle solves every level for 50 seeds, a naive policy does
//! not, and oracle episodes lengthen roughly geometrically.

use corvid_proto::ToolStatus;
use corvid_tasks::*;

const SEEDS: u64 = 50;

/// Replays the oracle plan in the simulator; checks each status and output, then returns
/// the final workspace.
fn replay(t: &TaskInstance) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut sim = Simulator::new(t.files.clone(), &t.read_only.corpus);
    for (i, s) in t.oracle.steps.iter().enumerate() {
        let (status, out) = sim.call(&s.name, &s.arguments);
        assert_eq!(status, s.expect, "{} step {i}", t.id);
        assert_eq!(out, s.output, "{} step {i}", t.id);
    }
    sim.files
}

#[test]
fn every_oracle_solves_every_level_for_50_seeds() {
    for fam in builtin_families() {
        for level in 1..=fam.levels() {
            for seed in 0..SEEDS {
                let t = fam.instance(level, seed).unwrap();
                let ws = replay(&t);
                let v = t.checker.check(Some(&t.oracle.answer), &ws);
                assert_eq!(v, Verdict::Pass, "{}", t.id);
            }
        }
    }
}

#[test]
fn hops_oracle_follows_the_chain_through_the_initial_files() {
    for level in 1..=8 {
        for seed in 0..SEEDS {
            let t = Hops.instance(level, seed).unwrap();
            // Independently of the plan: start at the prompt's path and follow `next:`.
            let start = t
                .prompt
                .split("Start at ")
                .nth(1)
                .unwrap()
                .split(". ")
                .next()
                .unwrap();
            let mut path = start.to_string();
            let mut reads = 0;
            let value = loop {
                reads += 1;
                let text = String::from_utf8(t.files[&path].clone()).unwrap();
                if let Some(l) = text.lines().find(|l| l.starts_with("next: ")) {
                    path = l["next: ".len()..].to_string();
                } else {
                    let l = text.lines().find(|l| l.starts_with("value: ")).unwrap();
                    break l["value: ".len()..].to_string();
                }
            };
            assert_eq!(value, t.oracle.answer, "{}", t.id);
            assert_eq!(reads, CHAIN_CALLS[level as usize - 1], "{}", t.id);
            let ok_reads = t
                .oracle
                .steps
                .iter()
                .filter(|s| s.expect == ToolStatus::Ok)
                .count();
            assert_eq!(ok_reads, reads, "{}", t.id);
        }
    }
}

#[test]
fn search_oracle_chains_liaisons_in_the_corpus() {
    for level in 1..=8 {
        for seed in 0..20 {
            let t = Search.instance(level, seed).unwrap();
            let by_title = |n: &str| t.read_only.corpus.iter().find(|d| d.title == n).unwrap();
            let mut doc = by_title(
                t.prompt
                    .split(" founded?")
                    .next()
                    .unwrap()
                    .trim_start_matches("In which year was ")
                    .split(". ")
                    .next()
                    .unwrap()
                    .trim_start_matches("Start with "),
            );
            for _ in 1..CHAIN_CALLS[level as usize - 1] {
                let liaison = doc
                    .text
                    .split("Its liaison is ")
                    .nth(1)
                    .unwrap()
                    .split('.')
                    .next()
                    .unwrap();
                doc = by_title(liaison);
            }
            let year = doc
                .text
                .split("founded in ")
                .nth(1)
                .unwrap()
                .split('.')
                .next()
                .unwrap();
            assert_eq!(year, t.oracle.answer, "{}", t.id);
        }
    }
}

#[test]
fn shell_answer_is_the_number_of_error_lines() {
    for level in 1..=8 {
        let t = Shell.instance(level, 3).unwrap();
        let n: usize = t
            .files
            .values()
            .map(|b| {
                String::from_utf8_lossy(b)
                    .lines()
                    .filter(|l| l.contains("ERROR"))
                    .count()
            })
            .sum();
        assert_eq!(n.to_string(), t.oracle.answer);
    }
}

#[test]
fn naive_policies_fail() {
    for fam in builtin_families() {
        for level in 1..=fam.levels() {
            for seed in 0..SEEDS {
                let t = fam.instance(level, seed).unwrap();
                // Answer without acting: the workspace is untouched.
                assert!(!t.checker.check(Some("0"), &t.files).passed(), "{}", t.id);
                assert!(!t.checker.check(None, &t.files).passed(), "{}", t.id);
                // Off by one, with the oracle's final workspace where one exists.
                let n: i64 = t.oracle.answer.parse().unwrap();
                for wrong in [n - 1, n + 1] {
                    let mut ws = t.files.clone();
                    if t.level >= 2 && t.family == "shell" {
                        ws.insert("report.txt".into(), format!("{wrong}\n").into_bytes());
                    }
                    assert!(
                        !t.checker.check(Some(&wrong.to_string()), &ws).passed(),
                        "{}",
                        t.id
                    );
                }
            }
        }
    }
}

#[test]
fn hops_distractor_values_are_rejected() {
    for seed in 0..SEEDS {
        let t = Hops.instance(8, seed).unwrap();
        for b in t.files.values() {
            let text = String::from_utf8_lossy(b);
            if let Some(l) = text.lines().find(|l| l.starts_with("value: ")) {
                let v = &l["value: ".len()..];
                assert_eq!(
                    t.checker.check(Some(v), &t.files).passed(),
                    v == t.oracle.answer
                );
            }
        }
    }
}

#[test]
fn oracle_episodes_lengthen_geometrically_to_16_calls_and_8k_tokens() {
    for fam in builtin_families() {
        let mut prev_tokens = 0;
        for level in 1..=fam.levels() {
            let t = fam.instance(level, 1).unwrap();
            let tokens = t.oracle_tokens();
            if level == 1 {
                assert_eq!(t.oracle_calls(), 1, "{}", t.id);
                assert!(tokens <= 450, "{}: {tokens} tokens", t.id);
            } else {
                assert!(tokens > prev_tokens, "{}: {tokens} <= {prev_tokens}", t.id);
            }
            prev_tokens = tokens;
            if level == fam.levels() {
                assert!(t.oracle_calls() >= 16, "{}", t.id);
                assert!(tokens >= 8192, "{}: {tokens} tokens", t.id);
            }
            assert!(t.oracle_tokens() as u32 <= t.context_budget);
            assert!((t.oracle_calls() as u32) < t.max_turns, "{}", t.id);
        }
    }
}

#[test]
fn oracles_recover_from_a_failure_from_the_middle_level_up() {
    for fam in builtin_families() {
        for level in 1..=fam.levels() {
            let t = fam.instance(level, 5).unwrap();
            assert_eq!(t.oracle.has_recovery(), level >= RECOVERY_FROM, "{}", t.id);
            // A failing call is never the last one: the fix follows.
            if let Some(i) = t.oracle.steps.iter().position(|s| !s.expect.is_success()) {
                assert!(i + 1 < t.oracle.steps.len());
            }
        }
    }
}

#[test]
fn instances_are_deterministic_by_seed_and_hashed() {
    for fam in builtin_families() {
        let a = fam.instance(4, 11).unwrap();
        assert_eq!(a, fam.instance(4, 11).unwrap());
        assert_eq!(a.spec_hash.len(), 64);
        assert_ne!(a.spec_hash, fam.instance(4, 12).unwrap().spec_hash);
        assert_eq!(a.task_ref().spec_hash, a.spec_hash);
    }
}

#[test]
fn out_of_range_levels_are_rejected() {
    assert!(matches!(
        Hops.instance(0, 1),
        Err(TasksError::LevelOutOfRange { .. })
    ));
    assert!(matches!(
        Shell.instance(9, 1),
        Err(TasksError::LevelOutOfRange { max: 8, .. })
    ));
    assert!(builtin_family("nope").is_err());
}

#[test]
fn oracle_process_rewards_are_positive_and_recovery_is_penalised_only_when_invalid() {
    for fam in builtin_families() {
        let t = fam.instance(8, 2).unwrap();
        let calls: Vec<_> = t.oracle.steps.iter().map(|s| s.tool_call()).collect();
        let turns: Vec<ScoredTurn> = calls
            .iter()
            .zip(&t.oracle.steps)
            .map(|(c, s)| ScoredTurn {
                call: c,
                status: s.expect,
            })
            .collect();
        let p = score_turns(&t.process_rules, &turns);
        assert!(p.iter().sum::<f64>() > 0.0, "{}", t.id);
    }
}

#[test]
#[ignore = "prints the level table; run with --ignored --nocapture"]
fn print_level_table() {
    for fam in builtin_families() {
        for level in 1..=fam.levels() {
            let t = fam.instance(level, 1).unwrap();
            println!(
                "{} L{level}: {} calls, {} tokens",
                fam.name(),
                t.oracle_calls(),
                t.oracle_tokens()
            );
        }
    }
}

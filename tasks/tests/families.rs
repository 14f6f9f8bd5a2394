//! Every built-in family the simulator replays: the oracle solves every level for 50 seeds,
//! a naive policy does not, and oracle episodes lengthen roughly geometrically.

use corvid_proto::ToolStatus;
use corvid_tasks::*;

const SEEDS: u64 = 50;

/// The built-in families the simulator replays: all but the code families, whose oracles
/// run Python (`tests/code_families.rs` runs those in the sandbox).
fn simulated_families() -> Vec<Box<dyn TaskFamily>> {
    builtin_families()
        .into_iter()
        .filter(|f| {
            let t = f.instance(1, 0).expect("level 1");
            !t.tools.iter().any(|t| t.name == "python")
        })
        .collect()
}

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
    for fam in simulated_families() {
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
                .and_then(|rest| rest.strip_suffix('.'))
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

/// The demo's ramp: SFT demonstrates levels 1–2, and the first level past them must add only a
/// hop (and a distractor), not filler around the line to copy (see `FILLER` in hops.rs).
#[test]
fn hops_files_hold_only_their_marker_line_through_level_3_and_filler_from_level_4() {
    for seed in 0..SEEDS {
        for level in 1..=4 {
            let t = Hops.instance(level, seed).unwrap();
            let multi_line = t
                .files
                .values()
                .filter(|bytes| String::from_utf8_lossy(bytes).lines().count() > 1)
                .count();
            if level <= 3 {
                assert_eq!(multi_line, 0, "{}: a file has filler", t.id);
            } else {
                assert!(multi_line > 0, "{}: no file has filler", t.id);
            }
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

/// Seeds `0..5` give the five shell kinds in `KINDS` order.
fn shell_seed(kind: &str) -> u64 {
    shell::KINDS.iter().position(|k| *k == kind).unwrap() as u64
}

fn text(t: &TaskInstance, path: &str) -> String {
    String::from_utf8(t.files[path].clone()).unwrap()
}

#[test]
fn shell_kinds_follow_the_seed() {
    for seed in 0..20 {
        let kind = shell::kind_of(seed);
        assert_eq!(kind, shell::KINDS[(seed % 5) as usize]);
        let t = Shell.instance(3, seed).unwrap();
        let dir = match kind {
            "count" | "stats" => "logs/",
            "find" => "records/",
            "csv" => "data/",
            _ => "conf/",
        };
        assert!(
            t.files.keys().all(|p| p.starts_with(dir)),
            "{} {kind}",
            t.id
        );
    }
}

#[test]
fn shell_count_answer_is_the_number_of_error_lines() {
    for level in 1..=8 {
        let t = Shell.instance(level, shell_seed("count") + 5).unwrap();
        let n: usize = t
            .files
            .keys()
            .map(|p| text(&t, p).lines().filter(|l| l.contains("ERROR")).count())
            .sum();
        assert_eq!(n.to_string(), t.oracle.answer);
    }
}

#[test]
fn shell_find_answer_is_the_end_of_the_next_chain() {
    for level in 1..=8 {
        for seed in [1, 6, 11] {
            let t = Shell.instance(level, seed).unwrap();
            let field = |body: &str, key: &str| {
                body.lines()
                    .find_map(|l| l.strip_prefix(key))
                    .unwrap()
                    .to_string()
            };
            let start = t
                .prompt
                .split("`id: ")
                .nth(1)
                .unwrap()
                .split('`')
                .next()
                .unwrap();
            let by_id = |id: &str| {
                t.files
                    .keys()
                    .find(|p| field(&text(&t, p), "id: ") == id)
                    .unwrap()
                    .clone()
            };
            let mut path = by_id(start);
            if level > 1 {
                loop {
                    let next = field(&text(&t, &path), "next: ");
                    if next == "none" {
                        break;
                    }
                    path = by_id(&next);
                }
            }
            let number = path.trim_start_matches("records/").trim_end_matches(".rec");
            assert_eq!(number, t.oracle.answer, "{}", t.id);
        }
    }
}

#[test]
fn shell_stats_report_names_each_logs_unique_top_path() {
    for level in 2..=8 {
        let t = Shell.instance(level, shell_seed("stats") + 10).unwrap();
        let mut want = String::new();
        for p in t.files.keys() {
            let mut counts = std::collections::BTreeMap::<String, usize>::new();
            for l in text(&t, p).lines() {
                *counts
                    .entry(l.split(' ').nth(3).unwrap().to_string())
                    .or_default() += 1;
            }
            let max = *counts.values().max().unwrap();
            let tops: Vec<_> = counts.iter().filter(|(_, n)| **n == max).collect();
            assert_eq!(tops.len(), 1, "{}: a tie for the top path of {p}", t.id);
            want.push_str(&format!("{p} {} {max}\n", tops[0].0));
        }
        // The files are listed in day order, not name order: compare as sets of lines.
        let Checker::FileState { files } = &t.checker else {
            panic!("{}: stats checks report.txt", t.id)
        };
        let Some(FileExpectation::Equals { text: got }) = files.get("report.txt") else {
            panic!("{}", t.id)
        };
        let mut a: Vec<_> = want.lines().collect();
        let mut b: Vec<_> = got.lines().collect();
        a.sort();
        b.sort();
        assert_eq!(a, b, "{}", t.id);
    }
}

#[test]
fn shell_csv_outputs_are_the_filtered_columns() {
    for level in 1..=8 {
        let t = Shell.instance(level, shell_seed("csv") + 5).unwrap();
        let Checker::FileState { files } = &t.checker else {
            panic!("{}", t.id)
        };
        assert_eq!(files.len().to_string(), t.oracle.answer);
        for (out, want) in files {
            // `north-lyon.csv` ← data/north.csv, city Lyon.
            let (region, city) = out.trim_end_matches(".csv").split_once('-').unwrap();
            let input = text(&t, &format!("data/{region}.csv"));
            let mut rows = String::new();
            for l in input.lines().skip(1) {
                let f: Vec<&str> = l.split(',').collect();
                if f[2].to_lowercase() == city {
                    rows.push_str(&format!("{},{}\n", f[1], f[3]));
                }
            }
            assert!(!rows.is_empty());
            assert_eq!(
                want,
                &FileExpectation::Equals { text: rows },
                "{} {out}",
                t.id
            );
        }
    }
}

#[test]
fn shell_config_repair_is_what_the_check_command_asks_for() {
    let valid = regex::Regex::new(shell::config::VALID).unwrap();
    for level in 1..=8 {
        let t = Shell.instance(level, shell_seed("config") + 5).unwrap();
        let Checker::FileState { files } = &t.checker else {
            panic!("{}", t.id)
        };
        let mut broken = 0;
        for (path, want) in files {
            let FileExpectation::Equals { text: fixed } = want else {
                panic!()
            };
            let before = text(&t, path);
            assert_eq!(before.lines().count(), fixed.lines().count());
            for (b, f) in before.lines().zip(fixed.lines()) {
                assert!(valid.is_match(f), "{}: {f:?} is still malformed", t.id);
                if valid.is_match(b) {
                    assert_eq!(b, f, "{}: a valid line changed", t.id);
                } else {
                    broken += 1;
                    // Same key and value, only the separator differs.
                    let (k, v) = f.split_once('=').unwrap();
                    assert!(b.starts_with(k) && b.ends_with(v), "{b:?} -> {f:?}");
                }
            }
        }
        assert!(broken >= 1);
        assert_eq!(broken.to_string(), t.oracle.answer, "{}", t.id);
    }
}

#[test]
fn shell_kinds_each_lengthen_to_16_calls_and_8k_tokens() {
    for kind in shell::KINDS {
        let mut prev = 0;
        for level in 1..=8 {
            let t = Shell.instance(level, shell_seed(kind) + 5).unwrap();
            let tokens = t.oracle_tokens();
            if level == 1 {
                assert_eq!(t.oracle_calls(), 1, "{}", t.id);
                assert!((150..=450).contains(&tokens), "{} {kind}: {tokens}", t.id);
            } else {
                assert!(tokens > prev, "{} {kind}: {tokens} <= {prev}", t.id);
            }
            prev = tokens;
            if level == 8 {
                assert!(t.oracle_calls() >= 16, "{} {kind}", t.id);
                assert!(tokens >= 8192, "{} {kind}: {tokens}", t.id);
            }
        }
    }
}

#[test]
fn naive_policies_fail() {
    for fam in simulated_families() {
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
    for fam in simulated_families() {
        // `recall` reads one file more and notes once (3 calls, ~515 tokens at level 1), and
        // its files are a line or two: its top level is ~7.5K tokens (docs/tasks.md).
        let (first_calls, first_tokens, top_tokens) = match fam.name() {
            "recall" => (3, 600, 7000),
            _ => (1, 450, 8192),
        };
        let mut prev_tokens = 0;
        for level in 1..=fam.levels() {
            let t = fam.instance(level, 1).unwrap();
            let tokens = t.oracle_tokens();
            if level == 1 {
                assert_eq!(t.oracle_calls(), first_calls, "{}", t.id);
                assert!(tokens <= first_tokens, "{}: {tokens} tokens", t.id);
            } else {
                assert!(tokens > prev_tokens, "{}: {tokens} <= {prev_tokens}", t.id);
            }
            prev_tokens = tokens;
            if level == fam.levels() {
                assert!(t.oracle_calls() >= 16, "{}", t.id);
                assert!(tokens >= top_tokens, "{}: {tokens} tokens", t.id);
            }
            assert!(t.oracle_tokens() as u32 <= t.context_budget);
            assert!((t.oracle_calls() as u32) < t.max_turns, "{}", t.id);
        }
    }
}

#[test]
fn oracles_recover_from_a_failure_from_the_middle_level_up() {
    for fam in simulated_families() {
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
    for kind in shell::KINDS {
        for level in 1..=8 {
            let t = Shell.instance(level, shell_seed(kind)).unwrap();
            println!(
                "shell/{kind} L{level}: {} calls, {} tokens",
                t.oracle_calls(),
                t.oracle_tokens()
            );
        }
    }
}

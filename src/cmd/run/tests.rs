//! Unit tests of `corvid run`, one module per file of it. The phases themselves run child
//! processes and are covered end to end by `tests/tests/e2e.rs`.

mod config {
    use std::path::Path;

    use corvid_learner::config::LearnerConfig;
    use corvid_proto::Fold;

    use super::super::config::*;

    #[test]
    fn a_bad_learner_key_is_reported_at_its_line_in_the_file_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.toml");
        // The [run] table first: the learner copy written into the run folder drops it, so
        // errors from that copy gave other line numbers.
        std::fs::write(&path, "[run]\nactors = 2\n\n[rl]\nlr = 1.0\n").unwrap();
        let e = format!("{:#}", split_config(&path).unwrap_err());
        assert!(e.contains(&path.display().to_string()), "{e}");
        assert!(
            e.contains("line 5") && e.contains("unknown field `lr`"),
            "{e}"
        );
    }

    #[test]
    fn a_bad_run_table_is_refused_naming_the_field() {
        assert!(RunSection::default().validate().is_ok());
        let refused = |edit: fn(&mut RunSection), field: &str| {
            let mut run = RunSection::default();
            edit(&mut run);
            let err = format!("{:#}", run.validate().expect_err(field));
            assert!(err.contains(&format!("[run] {field}")), "{field}: {err}");
        };
        refused(|r| r.rl_minutes = -1.0, "rl_minutes");
        refused(|r| r.rl_minutes = f64::NAN, "rl_minutes");
        refused(|r| r.rl_minutes = 1e300, "rl_minutes");
        refused(|r| r.sft_timeout_minutes = 0.0, "sft_timeout_minutes");
        refused(|r| r.actors = 0, "actors");
        refused(|r| r.actor_concurrency = 0, "actor_concurrency");
        refused(|r| r.eval_episodes = 0, "eval_episodes");
        refused(|r| r.eval_workers = 0, "eval_workers");
        refused(|r| r.eval_levels = "1-3".into(), "eval_levels");

        let families = corvid_tasks::Families::new(&[]).expect("built-in families");
        assert!(RunSection::default().validate_family(&families).is_ok());
        let family = |name: &str, levels: &str| {
            let run = RunSection {
                eval_family: name.into(),
                eval_levels: levels.into(),
                ..RunSection::default()
            };
            run.validate_family(&families).map_err(|e| format!("{e:#}"))
        };
        let err = family("hopz", "1..3").expect_err("unknown family");
        assert!(err.contains("[run] eval_family = \"hopz\""), "{err}");
        let err = family("shell", "1..9").expect_err("past the family's levels");
        assert!(err.contains("[run] eval_levels"), "{err}");
    }

    #[test]
    fn rl_arms_share_what_run_minutes_leaves_after_sft_and_the_evaluation_reserve() {
        // 19 minutes, SFT took 7.5, 2.5 kept for evaluation: 9 left, 4.5 per arm of two.
        assert_eq!(rl_minutes_within(19.0, 7.5, 2.5, 2, 6.0), 4.5);
        // One arm (no ablation) gets it all, up to the cap.
        assert_eq!(rl_minutes_within(19.0, 7.5, 2.5, 1, 6.0), 6.0);
        assert_eq!(rl_minutes_within(19.0, 12.5, 2.5, 1, 6.0), 4.0);
        // A slow SFT leaves RL the floor, not nothing.
        assert_eq!(rl_minutes_within(19.0, 18.0, 2.5, 2, 6.0), MIN_RL_MINUTES);
        assert_eq!(rl_minutes_within(19.0, 18.0, 2.5, 2, 0.25), 0.25);
        let bad = RunSection {
            run_minutes: -1.0,
            ..RunSection::default()
        };
        assert!(format!("{:#}", bad.validate().unwrap_err()).contains("[run] run_minutes"));
    }

    #[test]
    fn run_names_that_are_not_one_folder_under_runs_are_refused() {
        for ok in ["demo", "a1", "x-y_z.2"] {
            assert!(check_run_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", "a b", "../escaped", "a/b"] {
            let err = format!("{:#}", check_run_name(bad).expect_err(bad));
            assert!(err.contains("--name"), "{bad}: {err}");
        }
    }

    #[test]
    fn an_ablation_with_other_task_levels_is_refused_before_anything_runs() {
        let dir = tempfile::tempdir().unwrap();
        let config =
            |max: u32| format!("[tasks]\nfamilies = [\"hops\"]\nmax_levels = {{ hops = {max} }}\n");
        let main = LearnerConfig::from_toml(&config(3)).unwrap();
        let (same, other) = (dir.path().join("same.toml"), dir.path().join("other.toml"));
        std::fs::write(&same, config(3)).unwrap();
        std::fs::write(&other, config(5)).unwrap();
        let main_path = Path::new("demo.toml");
        let main_table: toml::Table = config(3).parse().unwrap();
        let file = |p: &Path| ArmSpec::Config(p.display().to_string());
        read_ablation_config(&main, (main_path, &main_table), &file(&same)).unwrap();
        let err = read_ablation_config(&main, (main_path, &main_table), &file(&other))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("other.toml") && err.contains("must share [tasks]"),
            "{err}"
        );
        // An arm of overrides that changes the levels is refused the same way.
        let over: toml::Table = "tasks = { max_levels = { hops = 5 } }".parse().unwrap();
        let err = read_ablation_config(&main, (main_path, &main_table), &ArmSpec::Overrides(over))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("demo.toml with the arm's fields") && err.contains("must share [tasks]"),
            "{err}"
        );
    }

    #[test]
    fn an_arm_of_overrides_is_the_main_config_with_those_fields_changed() {
        let text = "[tasks]\nfamilies = [\"hops\"]\n[rl]\nadvantage = \"step\"\nkl_coef = 0.05\n\
                    [rollout.context]\nwindow_tokens = 768\nfold = \"notes\"\nmemory_tokens = 64\n";
        let main = LearnerConfig::from_toml(text).unwrap();
        let main_table: toml::Table = text.parse().unwrap();
        let run: RunSection = toml::from_str(
            "ablation = { grpo = { rl = { advantage = \"grpo\" } }, \
             drop = { rollout = { context = { fold = \"drop_tool_output\" } } }, \
             other = \"configs/demo-grpo.toml\" }",
        )
        .unwrap();
        run.validate().unwrap();
        let arms = run.ablation.arms();
        let names: Vec<&str> = arms.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["drop", "grpo", "other"]);
        assert_eq!(arms[2].1, ArmSpec::Config("configs/demo-grpo.toml".into()));
        let main_path = Path::new("long.toml");
        let (grpo, context) =
            read_ablation_config(&main, (main_path, &main_table), &arms[1].1).unwrap();
        assert_eq!(grpo["rl"]["advantage"].as_str(), Some("grpo"));
        // Fields the arm leaves alone stay the main config's, the window and fold included.
        assert_eq!(grpo["rl"]["kl_coef"].as_float(), Some(0.05));
        assert_eq!((context.window_tokens, context.fold), (768, Fold::Notes));
        let (_, context) =
            read_ablation_config(&main, (main_path, &main_table), &arms[0].1).unwrap();
        assert_eq!(
            (context.window_tokens, context.fold, context.memory_tokens),
            (768, Fold::DropToolOutput, 64)
        );
        // One path is the arm `grpo`, as before; a name that cannot name a folder is refused.
        let one: RunSection = toml::from_str("ablation = \"configs/demo-grpo.toml\"").unwrap();
        assert_eq!(one.ablation.arms()[0].0, GRPO_ARM);
        let bad: RunSection = toml::from_str("ablation = { \"Drop Arm\" = \"x.toml\" }").unwrap();
        let err = bad.validate().unwrap_err().to_string();
        assert!(
            err.contains("\"Drop Arm\"") && err.contains("lowercase"),
            "{err}"
        );
    }
}

mod children {
    use std::io::Write;

    use corvid_learner::metrics::UpdateRecord;

    use super::super::children::MetricsTail;

    fn line(step: u64) -> String {
        let mut r = UpdateRecord {
            step,
            policy_version: step,
            ..UpdateRecord::default()
        };
        r.curriculum.frontier.insert("hops".into(), 2);
        serde_json::to_string(&r).unwrap()
    }

    #[test]
    fn the_metrics_tail_yields_typed_records_and_names_a_bad_line_by_file_and_number() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let mut tail = MetricsTail::<UpdateRecord>::new(path.clone());
        assert!(tail.read().is_empty(), "no file yet, no lines");
        let mut f = std::fs::File::create(&path).unwrap();
        // A record, a line of another shape, a record, and a line still being written.
        let fourth = line(4);
        let (head, rest) = fourth.split_at(10);
        write!(f, "{}\n{{\"step\": \"two\"}}\n{}\n{head}", line(1), line(3)).unwrap();
        let read = tail.read();
        assert_eq!(read.len(), 3, "the unfinished line waits for its newline");
        let first = read[0].as_ref().unwrap();
        assert_eq!((first.step, first.curriculum.frontier["hops"]), (1, 2));
        let bad = read[1].as_ref().unwrap_err().to_string();
        assert!(
            bad.contains(&path.display().to_string())
                && bad.contains("line 2")
                && bad.contains("UpdateRecord"),
            "{bad}"
        );
        assert_eq!(read[2].as_ref().unwrap().step, 3);
        writeln!(f, "{rest}").unwrap();
        let read = tail.read();
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].as_ref().unwrap().step, 4);
        // Bytes that are not UTF-8 are a bad line like any other, not the end of the file.
        f.write_all(b"\xff\xfe\n").unwrap();
        writeln!(f, "{}", line(6)).unwrap();
        let read = tail.read();
        let bad = read[0].as_ref().unwrap_err().to_string();
        assert!(bad.contains("line 5"), "{bad}");
        writeln!(f, "not json\n{}", line(8)).unwrap();
        let steps: Vec<u64> = tail.records().iter().map(|r| r.step).collect();
        assert_eq!(steps, vec![8], "records() skips the bad line 7");
        assert!(tail.read().is_empty());
    }
}

mod phases {
    use std::collections::BTreeMap;
    use std::path::Path;
    use std::process::Command;
    use std::time::{Duration, Instant};

    use corvid_learner::metrics::UpdateRecord;
    use corvid_learner::trainer::SftRecord;

    use super::super::phases::*;

    #[test]
    fn the_rl_learner_resumes_only_a_run_with_a_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("learner.toml");
        let args = rl_learner_args(&cfg, dir.path());
        assert!(!args.contains(&"--resume".to_string()), "{args:?}");
        std::fs::create_dir_all(dir.path().join("ckpt").join("00000003")).unwrap();
        let args = rl_learner_args(&cfg, dir.path());
        assert_eq!(
            args.last().map(String::as_str),
            Some("--resume"),
            "{args:?}"
        );
    }

    #[test]
    fn a_learner_that_fails_during_rl_stops_the_run_and_a_clean_exit_does_not() {
        let exit = |code: i32| {
            Command::new("sh")
                .args(["-c", &format!("exit {code}")])
                .status()
                .unwrap()
        };
        let log = Path::new("runs/x/learner-rl.log");
        let after = Duration::from_secs(42);
        learner_ended_early("rl", exit(0), after, log).unwrap();
        let err = learner_ended_early("ablation", exit(3), after, log)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ablation learner exited with exit status: 3 after 42 s")
                && err.contains("runs/x/learner-rl.log"),
            "{err}"
        );
    }

    #[test]
    fn progress_lines_show_the_records_figures() {
        let mut r = UpdateRecord {
            step: 7,
            policy_version: 6,
            ..UpdateRecord::default()
        };
        r.rollout.reward_mean = 0.5;
        r.rollout.success_rate = 0.25;
        r.loss.kl = 0.0123;
        r.curriculum.frontier = BTreeMap::from([("hops".into(), 3), ("search".into(), 1)]);
        let line = progress_line("rl", &r, Instant::now());
        for part in [
            "update    7 v6 ",
            "reward  0.500",
            "success  25.0%",
            "frontier hops L3 search L1 |",
            "kl 0.0123",
        ] {
            assert!(line.contains(part), "{part:?} in {line}");
        }

        let sft = |step: u64, tokens_seen: u64, unix_ms: u64| SftRecord {
            step,
            loss: 1.5,
            aux_loss: 0.0,
            tokens: 0,
            tokens_seen,
            grad_norm: 1.0,
            lr: 1e-3,
            heldout_loss: (step == 2).then_some(1.25),
            unix_ms,
        };
        let mut last = None;
        let first = sft_progress_line(&sft(1, 1000, 10_000), &mut last, Instant::now());
        assert!(
            first.contains("step     1 loss 1.5000 lr 1.00e-3      - trained"),
            "{first}"
        );
        let second = sft_progress_line(&sft(2, 3000, 10_500), &mut last, Instant::now());
        assert!(
            second.contains("held-out 1.2500") && second.contains("  4000 trained tok/s"),
            "{second}"
        );
    }
}

mod evaluate {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use crate::cmd::eval::EvalResult;

    use super::super::evaluate::*;

    #[test]
    fn evaluation_extends_to_the_highest_frontier_reached() {
        let f = |l: u32| BTreeMap::from([("hops".to_string(), l)]);
        let none = BTreeMap::new();
        assert_eq!(
            eval_levels("1..3", "hops", &[&f(2), &none]).unwrap(),
            (1, 3)
        );
        assert_eq!(
            eval_levels("1..3", "hops", &[&f(3), &f(5)]).unwrap(),
            (1, 5)
        );
        assert_eq!(eval_levels("2..3", "hops", &[&f(4)]).unwrap(), (2, 4));
        assert_eq!(eval_levels("1..3", "search", &[&f(6)]).unwrap(), (1, 3));
        let err = eval_levels("3..1", "hops", &[]).unwrap_err().to_string();
        assert!(err.contains("eval_levels"), "{err}");
    }

    #[test]
    fn evaluation_jobs_run_the_random_policy_and_the_long_levels_first() {
        let stages = vec![
            ("sft".to_string(), PathBuf::from("ref")),
            ("rl".to_string(), PathBuf::from("ckpt")),
            ("random".to_string(), PathBuf::from("eval/random-init")),
        ];
        let order: Vec<(String, u32)> = eval_jobs(&stages, (1, 3))
            .into_iter()
            .map(|j| (j.stage, j.level))
            .collect();
        let want = [
            ("random", 3),
            ("random", 2),
            ("random", 1),
            ("sft", 3),
            ("rl", 3),
            ("sft", 2),
            ("rl", 2),
            ("sft", 1),
            ("rl", 1),
        ];
        assert_eq!(
            order,
            want.map(|(s, l)| (s.to_string(), l)).to_vec(),
            "every (stage, level) once, longest first"
        );
    }

    #[test]
    fn a_stage_evaluated_level_by_level_is_reported_as_one_result() {
        use crate::cmd::eval::{FamilyResult, LevelResult, TokenBucket};
        let part = |level: u32, wall_s: f64, tok_s: f64| EvalResult {
            stage: "sft".into(),
            checkpoint: "runs/x/ref".into(),
            policy_version: 0,
            episodes_per_level: 200,
            k: 1,
            temperature: 0.0,
            seed: 1 << 62,
            store: "runs/x/eval/store".into(),
            label: "sft".into(),
            families: vec![FamilyResult::new(
                "hops",
                vec![LevelResult {
                    level,
                    episodes: 200,
                    success_rate: Some(level as f64 / 10.0),
                    tool_call_parse_rate: None,
                    tool_call_success_rate: None,
                    multi_step_completion: None,
                    failure_recovery_rate: None,
                    pass_at_k: None,
                    pass_hat_k: None,
                    mean_turns: 2.0,
                    mean_tokens: 100.0 * level as f64,
                    excluded: 0,
                    terminations: BTreeMap::new(),
                    // 20 episodes of 100 × level tokens, 2 × level of them successes.
                    by_tokens: vec![TokenBucket {
                        up_to: (100 * level as u64 + 1).next_power_of_two().max(256),
                        scored: 20,
                        successes: 2 * level as usize,
                    }],
                    by_position: BTreeMap::new(),
                    by_density: Vec::new(),
                }],
            )],
            wall_s,
            generated_tokens_per_s: tok_s,
        };
        // Finished out of order, as two workers return them.
        let m = merge_stage(vec![
            part(3, 30.0, 1000.0),
            part(1, 10.0, 2000.0),
            part(2, 20.0, 1500.0),
        ])
        .unwrap();
        let levels: Vec<(u32, Option<f64>)> = m.families[0]
            .levels
            .iter()
            .map(|l| (l.level, l.success_rate))
            .collect();
        assert_eq!(levels, vec![(1, Some(0.1)), (2, Some(0.2)), (3, Some(0.3))]);
        assert_eq!(m.families.len(), 1);
        // The family's token buckets span the merged levels: levels 1 and 2 below 256 tokens
        // (15% success), level 3 below 512 (30%), so the effective length is 512.
        let buckets: Vec<(u64, usize, usize)> = m.families[0]
            .by_tokens
            .iter()
            .map(|b| (b.up_to, b.scored, b.successes))
            .collect();
        assert_eq!(buckets, vec![(256, 40, 6), (512, 20, 6)]);
        assert_eq!(m.families[0].effective_length, Some(512));
        assert!((m.wall_s - 60.0).abs() < 1e-9);
        // (30·1000 + 10·2000 + 20·1500) tokens over 60 s.
        assert!((m.generated_tokens_per_s - 80_000.0 / 60.0).abs() < 1e-9);
        assert!(merge_stage(Vec::new()).is_err());
    }
}

//! Reports from synthetic run folders: figures computed from the right inputs, goals met and
//! missed, valid charts, and partial runs that say what is missing.

use std::path::Path;

use corvid_learner::metrics::{Rate, UpdateRecord};
use corvid_model::MoeHealth;
use serde_json::{json, Value};

use super::goals::GOAL_FRONTIER_TOKENS_RATIO;
use super::plots::tests::decode_png;
use super::*;

const MIN: u64 = 60_000;

fn put(dir: &Path, rel: &str, text: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn put_json(dir: &Path, rel: &str, v: &Value) {
    put(dir, rel, &serde_json::to_string_pretty(v).unwrap());
}

/// An evaluation file: `rates[family] = [success at level 1, 2, ...]`.
fn eval(stage: &str, rates: &[(&str, &[Option<f64>])]) -> Value {
    let families: Vec<Value> = rates
        .iter()
        .map(|(family, levels)| {
            let levels: Vec<Value> = levels
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    json!({"level": i + 1, "episodes": 200, "success_rate": r,
                       "tool_call_parse_rate": 0.99, "tool_call_success_rate": 0.97,
                       "multi_step_completion": 0.9, "failure_recovery_rate": null,
                       "pass_at_k": 0.99, "pass_hat_k": 0.8, "mean_turns": 2.0 + i as f64,
                       "mean_tokens": 100.0 * (i + 1) as f64, "excluded": 0})
                })
                .collect();
            // The family's breakdowns, as `corvid eval` writes them.
            let scored = 200 * levels.len();
            let half = json!({"scored": scored / 2, "successes": scored / 4});
            json!({"family": family, "levels": levels,
                   "by_tokens": [{"up_to": 256, "scored": scored / 2, "successes": scored / 4},
                                 {"up_to": 1024, "scored": scored / 2, "successes": 0}],
                   "by_position": {"beginning": half, "end": half},
                   "by_density": [{"up_to": 0.0, "scored": scored, "successes": scored / 2}],
                   "effective_length": 256})
        })
        .collect();
    json!({"stage": stage, "checkpoint": format!("ckpt/{stage}.safetensors"),
           "policy_version": 3, "episodes_per_level": 200, "k": 4, "families": families})
}

fn run_json(finished_after_min: Option<u64>) -> Value {
    let start = START_MS;
    json!({
        "name": "demo", "config": "configs/demo.toml",
        "started_unix_ms": start,
        "finished_unix_ms": finished_after_min.map(|m| start + m * MIN),
        "stages": {"sft_s": 120.0, "rl_s": 700.0, "eval_s": 200.0},
        "frontier_level": {"hops": 4, "search": 2},
        "main_family": "hops",
        "level_tokens": {"hops": {"1": 100, "2": 210, "3": 320, "4": 450, "5": 600},
                         "search": {"1": 200, "2": 260}},
        "ablation": {"step_level": 0.45, "trajectory_grpo": null}
    })
}

/// The start time of `run_json`'s run.
const START_MS: u64 = 1_700_000_000_000;

/// Success counts with rate `rate` over 100 episodes.
fn rate(rate: f64) -> Rate {
    Rate {
        episodes: 100,
        successes: (100.0 * rate).round() as u64,
        rate,
    }
}

/// One layer's MoE health.
fn moe(layer: i64, load: &[f64], max_vio: f64, router_entropy: f64, dead: i64) -> MoeHealth {
    MoeHealth {
        layer,
        load: load.to_vec(),
        max_vio,
        router_entropy,
        dead_experts: dead,
        ..MoeHealth::default()
    }
}

/// Lines of `metrics/metrics.jsonl` as the learner writes them.
fn jsonl(records: impl IntoIterator<Item = UpdateRecord>) -> String {
    records
        .into_iter()
        .map(|r| serde_json::to_string(&r).unwrap() + "\n")
        .collect()
}

/// `n` RL updates 20 s apart: frontier 1 → 4, two MoE layers of 4 experts.
fn metrics(n: usize) -> String {
    jsonl((1..=n).map(|u| {
        let level = 1 + (u * 4 - 1) / n; // 1..=4
        let x = u as f64 / n as f64;
        let mut r = UpdateRecord {
            step: u as u64,
            policy_version: u as u64,
            unix_ms: START_MS + 20_000 * u as u64,
            ..UpdateRecord::default()
        };
        let ro = &mut r.rollout;
        ro.reward_mean = 0.2 + 0.6 * x;
        ro.success_rate = 0.3 + 0.5 * x;
        ro.success_by_task = [
            (format!("hops/{level}"), rate(0.5 + 0.3 * x)),
            ("search/1".into(), rate(0.9)),
            ("search/2".into(), rate(0.6)),
        ]
        .into();
        ro.staleness_mean = 0.5;
        ro.tokens_per_s = 2000.0;
        ro.episodes_per_s = 3.0;
        r.curriculum.frontier = [("hops".into(), level as u32), ("search".into(), 2)].into();
        let lo = &mut r.loss;
        (lo.policy, lo.kl, lo.entropy) = (-0.01, 0.01 * x, 1.5 - x);
        (lo.clip_frac_low, lo.clip_frac_high) = (0.01, 0.02);
        (lo.iw_mean, lo.iw_max, lo.grad_norm) = (1.0, 1.8, 0.7);
        let mm = &mut r.mismatch;
        (mm.k3_kl, mm.token_mult_prob_error) = (1e-3 * (1.0 + x), 1.01);
        (mm.logp_abs_diff_mean, mm.logp_abs_diff_max) = (0.01, 0.4 + x);
        mm.ratio_above_2_frac = 1e-3;
        r.moe = vec![
            moe(0, &[0.4, 0.2, 0.2, 0.2], 0.6, 1.2 - 0.1 * x, 0),
            moe(1, &[0.25, 0.25, 0.5, 0.0], 1.0, 1.0, 1),
        ];
        r.spikes.count = (u / 10) as u64;
        r
    }))
}

fn sft(n: usize) -> String {
    (1..=n)
        .map(|s| {
            let mut v = json!({"step": s, "loss": 3.0 / s as f64, "lr": 1e-3, "tokens_per_s": 5e3});
            if s % 5 == 0 {
                v["eval_loss"] = json!(3.5 / s as f64);
            }
            v.to_string() + "\n"
        })
        .collect()
}

/// A finished run whose RL beats SFT at hops level 4 by 25 points.
fn finished_run(dir: &Path) {
    put_json(dir, "run.json", &run_json(Some(18)));
    put(dir, "metrics/metrics.jsonl", &metrics(30));
    put(dir, "metrics/sft.jsonl", &sft(20));
    let s = |v: f64| Some(v);
    put_json(
        dir,
        "eval/random.json",
        &eval(
            "random",
            &[
                ("search", &[s(0.05), s(0.02)]),
                ("hops", &[s(0.03), s(0.02), s(0.01), s(0.0)]),
            ],
        ),
    );
    put_json(
        dir,
        "eval/sft.json",
        &eval(
            "sft",
            &[
                ("search", &[s(0.9), s(0.5)]),
                ("hops", &[s(0.9), s(0.8), s(0.3), s(0.2)]),
            ],
        ),
    );
    put_json(
        dir,
        "eval/rl.json",
        &eval(
            "rl",
            &[
                ("search", &[s(0.95), s(0.55)]),
                ("hops", &[s(0.92), s(0.9), s(0.75), s(0.45), s(0.1)]),
            ],
        ),
    );
    put_json(
        dir,
        "eval/ablation-grpo.json",
        &eval(
            "ablation-grpo",
            &[("hops", &[s(0.9), s(0.85), s(0.6), s(0.3)])],
        ),
    );
}

fn report_json(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap()
}

fn close(v: &Value, want: f64) -> bool {
    v.as_f64().is_some_and(|x| (x - want).abs() < 1e-9)
}

const ALL_CHARTS: [&str; 9] = [
    "reward_success.png",
    "frontier.png",
    "kl_entropy.png",
    "policy_update.png",
    "mismatch.png",
    "expert_load.png",
    "routing_entropy.png",
    "sft_loss.png",
    "long_context.png",
];

#[test]
fn finished_run_headline_is_read_at_the_main_family_frontier() {
    let dir = tempfile::tempdir().unwrap();
    finished_run(dir.path());
    let summary = write(dir.path()).unwrap();
    let r = report_json(dir.path());

    assert_eq!(r["main_family"], "hops");
    assert_eq!(r["frontier_level"], 4);
    // hops level 4, not level 3 (0.3 → 0.75) nor search's frontier.
    assert!(close(&r["success"]["random"], 0.0), "{}", r["success"]);
    assert!(close(&r["success"]["sft"], 0.2), "{}", r["success"]);
    assert!(close(&r["success"]["rl"], 0.45), "{}", r["success"]);
    assert!(close(&r["frontier_tokens_ratio_vs_level1"], 4.5));
    assert!(close(&r["ablation"]["step_level"], 0.45));
    // run.json has null: taken from eval/ablation-grpo.json at hops 4.
    assert!(close(&r["ablation"]["trajectory_grpo"], 0.3));

    let goals = r["goals"].as_array().unwrap();
    assert_eq!(goals.len(), 3);
    assert!(goals.iter().all(|g| g["met"] == true), "{goals:#?}");
    assert!(close(&goals[0]["measured"], 25.0), "{}", goals[0]);
    assert!(close(&goals[1]["measured"], 4.5));
    assert!(close(&goals[2]["measured"], 18.0));
    assert!(close(&r["run"]["duration_minutes"], 18.0));

    // Per-stage, per-family, per-level tables.
    let row = r["success_table"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["family"] == "hops" && row["level"] == 3)
        .unwrap();
    assert!(
        close(&row["sft"], 0.3) && close(&row["rl"], 0.75) && close(&row["ablation_grpo"], 0.6)
    );
    assert!(close(&row["oracle_tokens"], 320.0));
    // Level 5 only in the RL file: a row with the other stages null.
    let row5 = r["success_table"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["family"] == "hops" && row["level"] == 5)
        .unwrap();
    assert!(row5["sft"].is_null() && close(&row5["rl"], 0.1));
    assert_eq!(
        r["eval"]["sft"]["families"][1]["levels"][3]["episodes"],
        200
    );
    assert!(r["eval"]["rl"]["families"][1]["levels"][0]["failure_recovery_rate"].is_null());

    // Training summary.
    assert_eq!(r["training"]["rl_updates"], 30);
    assert_eq!(r["training"]["frontier_by_family"]["hops"], 4);
    assert_eq!(r["training"]["loss_spikes"], 3);
    assert_eq!(r["training"]["sft_steps"], 20);
    assert!(close(&r["training"]["sft_final_eval_loss"], 3.5 / 20.0));

    // Every chart exists and decodes.
    let files: Vec<String> = summary
        .plots
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files, ALL_CHARTS);
    for p in &summary.plots {
        let (w, h) = decode_png(p);
        assert_eq!(w, plots::WIDTH);
        assert!(h >= 260, "{} is {w}x{h}", p.display());
    }
    assert!(
        r["missing"].as_array().unwrap().is_empty(),
        "{}",
        r["missing"]
    );

    // The page states the goals and shows every chart by relative path.
    let html = std::fs::read_to_string(&summary.html).unwrap();
    assert_eq!(html.matches(">MET<").count(), 3);
    assert!(!html.contains("MISSED"));
    for f in ALL_CHARTS {
        assert!(html.contains(&format!("src=\"plots/{f}\"")), "{f}");
    }
    assert!(html.contains("<tr class=\"frontier\"><td class=\"l\">hops</td><td>4</td>"));
    assert!(!html.contains("Missing inputs"));

    // The summary carries the same figures.
    assert_eq!(summary.headline.success.rl, Some(0.45));
    assert_eq!(summary.headline.frontier_level, Some(4));
    assert_eq!(summary.json, dir.path().join("report.json"));
}

#[test]
fn missed_goals_say_so_with_the_measured_values() {
    let dir = tempfile::tempdir().unwrap();
    finished_run(dir.path());
    // Frontier hops 3: RL only 5 points above SFT there, oracle tokens 320/100; 25 minutes.
    let mut run = run_json(Some(25));
    run["frontier_level"]["hops"] = json!(3);
    put_json(dir.path(), "run.json", &run);
    let s = |v: f64| Some(v);
    put_json(
        dir.path(),
        "eval/rl.json",
        &eval("rl", &[("hops", &[s(0.9), s(0.85), s(0.35), s(0.2)])]),
    );
    write(dir.path()).unwrap();
    let r = report_json(dir.path());
    assert_eq!(r["frontier_level"], 3);
    let goals = r["goals"].as_array().unwrap();
    assert_eq!(goals[0]["met"], false);
    assert!(close(&goals[0]["measured"], 5.0), "{}", goals[0]);
    assert!(goals[0]["note"].as_str().unwrap().starts_with("MISSED"));
    assert_eq!(goals[1]["met"], false);
    assert!(close(&goals[1]["measured"], 3.2));
    assert_eq!(goals[2]["met"], false);
    assert!(close(&goals[2]["measured"], 25.0));
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert_eq!(html.matches(">MISSED<").count(), 3);
    assert!(html.contains("0 of 3 goals met"));
}

#[test]
fn goal_targets_come_from_run_json_when_given() {
    let dir = tempfile::tempdir().unwrap();
    finished_run(dir.path());
    let mut run = run_json(Some(18));
    run["goals"] = json!({"rl_minus_sft_points": 30, "max_minutes": 15});
    put_json(dir.path(), "run.json", &run);
    let summary = write(dir.path()).unwrap();
    assert_eq!(summary.goals[0].target, 30.0);
    assert!(!summary.goals[0].met, "25 points < 30");
    assert_eq!(summary.goals[1].target, GOAL_FRONTIER_TOKENS_RATIO);
    assert!(!summary.goals[2].met, "18 minutes > 15");
}

#[test]
fn the_report_says_whether_sft_reached_its_heldout_loss_target() {
    // The run's last held-out loss is 3.5 / 20 = 0.175.
    for (target, reached) in [
        (Some(0.2), Some(true)),
        (Some(0.1), Some(false)),
        (None, None),
    ] {
        let dir = tempfile::tempdir().unwrap();
        finished_run(dir.path());
        let mut run = run_json(Some(18));
        run["sft_heldout_loss_target"] = json!(target);
        put_json(dir.path(), "run.json", &run);
        write(dir.path()).unwrap();
        let r = report_json(dir.path());
        assert_eq!(
            r["training"]["sft_reached_target"],
            json!(reached),
            "{target:?}"
        );
        let noted = r["notes"].as_array().unwrap().iter().any(|n| {
            n.as_str()
                .unwrap()
                .contains("SFT stopped at its step cap (20 steps)")
        });
        assert_eq!(noted, reached == Some(false), "{target:?}: {}", r["notes"]);
        let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
        assert_eq!(
            html.contains("not reached"),
            reached == Some(false),
            "{target:?}"
        );
    }
}

#[test]
fn interrupted_run_without_rl_eval_reports_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    finished_run(dir.path());
    write(dir.path()).unwrap();
    assert!(dir.path().join("plots/sft_loss.png").exists());

    // Now the same folder as an interrupted run: no finish, no RL evaluation, no SFT log,
    // a torn last metrics line.
    put_json(dir.path(), "run.json", &run_json(None));
    std::fs::remove_file(dir.path().join("eval/rl.json")).unwrap();
    std::fs::remove_file(dir.path().join("eval/ablation-grpo.json")).unwrap();
    std::fs::remove_file(dir.path().join("metrics/sft.jsonl")).unwrap();
    put(
        dir.path(),
        "metrics/metrics.jsonl",
        &(metrics(12) + "{\"step\": 13, \"rollout\": {\"reward_me"),
    );
    let summary = write(dir.path()).unwrap();
    let r = report_json(dir.path());

    assert!(r["success"]["rl"].is_null());
    assert!(close(&r["success"]["sft"], 0.2));
    assert!(r["ablation"]["trajectory_grpo"].is_null());
    let goals = r["goals"].as_array().unwrap();
    for g in goals {
        if g["name"].as_str().unwrap().contains("tokens") {
            assert_eq!(g["met"], true, "the frontier ratio needs no RL evaluation");
            continue;
        }
        assert_eq!(g["met"], false, "{g}");
        assert!(g["measured"].is_null(), "{g}");
        assert!(
            g["note"].as_str().unwrap().starts_with("not measured"),
            "{g}"
        );
    }
    assert!(goals[0]["note"].as_str().unwrap().contains("success.rl"));
    assert!(goals[2]["note"]
        .as_str()
        .unwrap()
        .contains("no finish time"));

    let missing: Vec<&str> = r["missing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert!(
        missing.iter().any(|m| m.starts_with("eval/rl.json")),
        "{missing:?}"
    );
    assert!(missing.iter().any(|m| m.starts_with("metrics/sft.jsonl")));
    assert!(missing.iter().any(|m| m.starts_with("SFT loss chart")));
    assert!(r["notes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n == "metrics/metrics.jsonl: 1 unreadable line(s) skipped"));
    assert_eq!(r["run"]["finished"], false);
    assert_eq!(r["training"]["rl_updates"], 12);

    // The stale SFT chart of the earlier report is gone; the others are valid.
    assert!(!dir.path().join("plots/sft_loss.png").exists());
    assert_eq!(summary.plots.len(), ALL_CHARTS.len() - 1);
    for p in &summary.plots {
        decode_png(p);
    }
    let html = std::fs::read_to_string(&summary.html).unwrap();
    assert!(html.contains("not finished"));
    assert!(html.contains("Missing inputs"));
    assert!(html.contains("eval/rl.json (no held-out evaluation"));
    assert!(html.contains("NOT MEASURED"));
    assert!(!html.contains("sft_loss.png"));
}

#[test]
fn empty_run_folder_gives_a_report_of_missing_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let summary = write(dir.path()).unwrap();
    assert!(summary.plots.is_empty());
    assert!(summary.goals.iter().all(|g| !g.met && g.measured.is_none()));
    let r = report_json(dir.path());
    assert!(r["success"]["random"].is_null());
    assert!(r["frontier_level"].is_null());
    let missing = r["missing"].as_array().unwrap();
    for want in [
        "run.json",
        "metrics/metrics.jsonl",
        "eval/random.json",
        "eval/sft.json",
    ] {
        assert!(
            missing
                .iter()
                .any(|m| m.as_str().unwrap().starts_with(want)),
            "{want} not listed in {missing:?}"
        );
    }
    assert!(summary.html.exists());

    let err = write(&dir.path().join("absent")).unwrap_err();
    assert!(format!("{err:#}").contains("no run folder"), "{err:#}");
}

#[test]
fn without_run_json_the_frontier_comes_from_the_metrics_and_the_family_from_eval() {
    let dir = tempfile::tempdir().unwrap();
    finished_run(dir.path());
    std::fs::remove_file(dir.path().join("run.json")).unwrap();
    write(dir.path()).unwrap();
    let r = report_json(dir.path());
    // eval/rl.json lists search first; the metrics' last frontier of search is 2.
    assert_eq!(r["main_family"], "search");
    assert_eq!(r["frontier_level"], 2);
    assert!(close(&r["success"]["sft"], 0.5));
    assert!(close(&r["success"]["rl"], 0.55));
    assert!(r["frontier_tokens_ratio_vs_level1"].is_null());
    assert_eq!(r["goals"][1]["met"], false);
    assert!(r["goals"][1]["measured"].is_null());
}

#[test]
fn expert_load_is_the_mean_of_the_last_updates() {
    let dir = tempfile::tempdir().unwrap();
    // 15 updates: layer 0 load [1, 0] for the first 5, [0.5, 0.5] after; the mean of the last
    // 10 is therefore exactly [0.5, 0.5]. KL is non-finite throughout (written as null).
    let lines = jsonl((1..=15).map(|u| {
        let load = if u <= 5 { [1.0, 0.0] } else { [0.5, 0.5] };
        let mut r = UpdateRecord {
            step: u,
            moe: vec![moe(0, &load, 0.0, u as f64, i64::from(u <= 5))],
            ..UpdateRecord::default()
        };
        r.loss.kl = f64::NAN;
        r
    }));
    put(dir.path(), "metrics/metrics.jsonl", &lines);
    let summary = write(dir.path()).unwrap();
    let r = report_json(dir.path());
    let layer = &r["training"]["expert_load"][0];
    assert_eq!(r["training"]["expert_load_updates"], EXPERT_LOAD_LAST_N);
    assert_eq!(layer["load"], json!([0.5, 0.5]));
    assert!(close(&layer["router_entropy"], 10.5)); // mean of 6..=15
    assert_eq!(layer["dead_experts"], 0.0);
    let files: Vec<String> = summary
        .plots
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(files.iter().any(|f| f == "expert_load.png"), "{files:?}");
    assert!(
        files.iter().any(|f| f == "routing_entropy.png"),
        "{files:?}"
    );
    // No curriculum figures: no frontier chart, and the absent figures are noted.
    assert!(!files.iter().any(|f| f == "frontier.png"), "{files:?}");
    let notes = r["notes"].as_array().unwrap();
    for key in ["kl", "frontier", "wall_s"] {
        let note = format!("metrics/metrics.jsonl never has a usable `{key}`");
        assert!(notes.iter().any(|n| n == &json!(note)), "{key}: {notes:?}");
    }
    assert!(!notes
        .iter()
        .any(|n| n.as_str().unwrap().contains("`entropy`")));
}

/// `n` updates 30 s apart from `start_ms`, with a `family/level` the batch had no episode of.
fn metrics_nested(n: usize, start_ms: u64) -> String {
    jsonl((1..=n).map(|u| {
        let mut r = UpdateRecord {
            step: u as u64,
            policy_version: u as u64 + 1,
            unix_ms: start_ms + 30_000 * u as u64,
            update_s: 2.5,
            ..UpdateRecord::default()
        };
        let ro = &mut r.rollout;
        (ro.episodes, ro.reward_mean, ro.success_rate) = (32, 0.1 * u as f64, 0.5);
        ro.success_by_task = [
            ("hops/2".into(), rate(0.75)),
            ("hops/3".into(), Rate::default()),
        ]
        .into();
        (ro.tokens, ro.episodes_per_s, ro.tokens_per_s) = (9000, 1.5, 3000.0);
        (ro.staleness_mean, ro.staleness_max) = (0.25, 1);
        let lo = &mut r.loss;
        (lo.policy, lo.kl, lo.entropy, lo.balance) = (-0.02, 0.003, 0.9, 0.01);
        (lo.clip_frac_low, lo.clip_frac_high) = (0.01, 0.02);
        (lo.iw_mean, lo.iw_max, lo.grad_norm, lo.lr) = (1.0, 2.0, 0.8, 1e-4);
        r.mismatch.token_mult_prob_error = 1.02;
        r.moe = vec![moe(0, &[0.5, 0.5], 0.0, 0.69, 0)];
        r.spikes.count = 2;
        r.curriculum.frontier = [("hops".into(), 2 + u as u32 / 3)].into();
        r.curriculum.context_tokens = 2048;
        r.service.groups_completed = u as u64;
        r
    }))
}

#[test]
fn the_learners_metrics_give_every_figure_and_chart() {
    let dir = tempfile::tempdir().unwrap();
    finished_run(dir.path());
    put(
        dir.path(),
        "metrics/metrics.jsonl",
        &metrics_nested(6, START_MS),
    );
    // An ablation arm other than `grpo` is read from its own file.
    put(
        dir.path(),
        "eval/ablation-drop.json",
        &eval("ablation-drop", &[("hops", &[Some(0.0)])]).to_string(),
    );
    let inputs = Inputs::read(dir.path()).unwrap();
    assert_eq!(
        inputs.arm_evals.keys().collect::<Vec<_>>(),
        ["ablation-drop"]
    );
    let u = &inputs.updates[2];
    assert_eq!(u.wall_s, Some(90.0), "unix_ms against run.json's start");
    assert_eq!(u.success_by_family_level()["hops"]["2"], Some(0.75));
    // A level without episodes in the batch has no rate (not a rate of 0).
    assert_eq!(u.success_by_family_level()["hops"]["3"], None);
    assert_eq!(u.success_at("hops", 3), None);

    let summary = write(dir.path()).unwrap();
    assert_eq!(summary.plots.len(), ALL_CHARTS.len());
    let r = report_json(dir.path());
    assert_eq!(r["training"]["last_policy_version"], 7);
    assert_eq!(r["training"]["frontier_by_family"]["hops"], 4);
    assert_eq!(r["training"]["loss_spikes"], 2);
    assert!(r["training"]["last_success_by_family_level"]["hops"]["3"].is_null());
    assert!(
        !r["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("never has")),
        "every expected figure is found: {}",
        r["notes"]
    );
}

#[test]
fn a_record_written_by_the_learner_is_read_as_written() {
    let dir = tempfile::tempdir().unwrap();
    put_json(
        dir.path(),
        "run.json",
        &json!({"started_unix_ms": START_MS}),
    );
    let mut rec = UpdateRecord {
        step: 7,
        policy_version: 8,
        unix_ms: START_MS + 90_000,
        ..UpdateRecord::default()
    };
    rec.rollout
        .success_by_task
        .insert("hops/3".into(), rate(0.75));
    rec.loss.kl = 0.01;
    rec.moe.push(moe(1, &[0.25; 4], 0.1, 1.3, 2));
    rec.curriculum.frontier.insert("hops".into(), 3);
    let mut skipped = rec.clone();
    skipped.step = 8;
    skipped.loss.grad_norm = f64::NAN;
    put(
        dir.path(),
        "metrics/metrics.jsonl",
        &jsonl([rec.clone(), skipped]),
    );

    let inputs = Inputs::read(dir.path()).unwrap();
    assert_eq!(inputs.updates.len(), 2, "{:?}", inputs.notes);
    let u = &inputs.updates[0];
    assert_eq!(u.record, rec);
    assert_eq!(u.wall_s, Some(90.0));
    assert_eq!(u.success_at("hops", 3), Some(0.75));
    assert_eq!(u.moe_layers().next().map(|(id, _)| id), Some(1));
    // A non-finite figure does not cost the line: it reads as NaN, a gap in the charts.
    assert!(inputs.updates[1].record.loss.grad_norm.is_nan());
    assert_eq!(inputs.updates[1].record.loss.kl, 0.01);
}

#[test]
fn an_sft_record_written_by_the_learner_is_read() {
    use corvid_learner::trainer::{SftRecord, SFT_METRICS_FILE};
    let dir = tempfile::tempdir().unwrap();
    let rec = |step: u64, heldout_loss: Option<f64>| SftRecord {
        step,
        loss: 2.0 / step as f64,
        aux_loss: 0.01,
        tokens: 1000,
        tokens_seen: 1000 * step,
        grad_norm: 0.5,
        lr: 1e-3,
        heldout_loss,
        unix_ms: 1_700_000_000_000 + step,
    };
    let text: String = [rec(1, None), rec(10, Some(0.4))]
        .iter()
        .map(|r| serde_json::to_string(r).unwrap() + "\n")
        .collect();
    put(dir.path(), &format!("metrics/{SFT_METRICS_FILE}"), &text);
    let inputs = Inputs::read(dir.path()).unwrap();
    assert_eq!(inputs.sft.len(), 2);
    assert_eq!(inputs.sft[1].step, Some(10));
    assert_eq!(inputs.sft[1].loss, Some(0.2));
    assert_eq!(inputs.sft[1].lr, Some(1e-3));
    assert_eq!(inputs.sft[0].eval_loss, None);
    assert_eq!(inputs.sft[1].eval_loss, Some(0.4));
}

//! Reports from synthetic run folders: figures computed from the right inputs, goals met and
//! missed, valid charts, and partial runs that say what is missing.

use std::path::Path;

use serde_json::{json, Value};

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
            json!({"family": family, "levels": levels})
        })
        .collect();
    json!({"stage": stage, "checkpoint": format!("ckpt/{stage}.safetensors"),
           "policy_version": 3, "episodes_per_level": 200, "k": 4, "families": families})
}

fn run_json(finished_after_min: Option<u64>) -> Value {
    let start = 1_700_000_000_000u64;
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

/// `n` RL updates: frontier 1 → 4, two MoE layers of 4 experts.
fn metrics(n: usize) -> String {
    let mut out = String::new();
    for u in 1..=n {
        let level = 1 + (u * 4 - 1) / n; // 1..=4
        let x = u as f64 / n as f64;
        let line = json!({
            "update": u, "policy_version": u, "wall_s": 20.0 * u as f64,
            "reward_mean": 0.2 + 0.6 * x, "success_rate": 0.3 + 0.5 * x,
            "success_by_family_level": {"hops": {level.to_string(): 0.5 + 0.3 * x},
                                        "search": {"1": 0.9, "2": 0.6}},
            "frontier": {"hops": level, "search": 2},
            "policy_loss": -0.01, "kl": 0.01 * x, "entropy": 1.5 - x,
            "clip_frac_low": 0.01, "clip_frac_high": 0.02, "is_weight_mean": 1.0,
            "is_weight_max": 1.8, "staleness_mean": 0.5, "grad_norm": 0.7,
            "tokens_per_s": 2000.0, "episodes_per_s": 3.0,
            "moe": [
                {"layer": 0, "load": [0.4, 0.2, 0.2, 0.2], "max_vio": 0.6,
                 "router_entropy": 1.2 - 0.1 * x, "dead_experts": 0},
                {"layer": 1, "load": [0.25, 0.25, 0.5, 0.0], "max_vio": 1.0,
                 "router_entropy": 1.0, "dead_experts": 1}
            ],
            "loss_spikes": u / 10
        });
        out.push_str(&line.to_string());
        out.push('\n');
    }
    out
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

const ALL_CHARTS: [&str; 7] = [
    "reward_success.png",
    "frontier.png",
    "kl_entropy.png",
    "policy_update.png",
    "expert_load.png",
    "routing_entropy.png",
    "sft_loss.png",
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
        &(metrics(12) + "{\"update\": 13, \"reward_me"),
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
    // 10 is therefore exactly [0.5, 0.5].
    let lines: String = (1..=15)
        .map(|u| {
            let load = if u <= 5 { [1.0, 0.0] } else { [0.5, 0.5] };
            json!({"update": u, "moe": [{"layer": 0, "load": load, "router_entropy": u as f64,
                                         "dead_experts": if u <= 5 {1} else {0}}]})
            .to_string()
                + "\n"
        })
        .collect();
    put(dir.path(), "metrics/metrics.jsonl", &lines);
    let summary = write(dir.path()).unwrap();
    let r = report_json(dir.path());
    let layer = &r["training"]["expert_load"][0];
    assert_eq!(r["training"]["expert_load_updates"], EXPERT_LOAD_LAST_N);
    assert_eq!(layer["load"], json!([0.5, 0.5]));
    assert!(close(&layer["router_entropy"], 10.5)); // mean of 6..=15
    assert_eq!(layer["dead_experts"], 0.0);
    // Only MoE data: the heat map and routing chart are drawn, and absent keys are noted.
    let files: Vec<String> = summary
        .plots
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files, ["expert_load.png", "routing_entropy.png"]);
    assert!(r["notes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n == "metrics/metrics.jsonl never has a usable `kl`"));
}

/// `n` lines in the learner's own layout (`corvid_learner::metrics::UpdateRecord`).
fn metrics_nested(n: usize, start_ms: u64) -> String {
    (1..=n)
        .map(|u| {
            json!({
                "step": u, "policy_version": u + 1, "unix_ms": start_ms + 30_000 * u as u64,
                "update_s": 2.5,
                "rollout": {"episodes": 32, "reward_mean": 0.1 * u as f64, "success_rate": 0.5,
                            "success_by_task": {
                                "hops/2": {"episodes": 16, "successes": 12, "rate": 0.75},
                                "hops/3": {"episodes": 0, "successes": 0, "rate": 0.0}},
                            "tokens": 9000, "episodes_per_s": 1.5, "tokens_per_s": 3000.0,
                            "staleness_mean": 0.25, "staleness_max": 1, "stale_skipped": 0,
                            "unscored_skipped": 0},
                "loss": {"total": 0.1, "policy": -0.02, "kl": 0.003, "entropy": 0.9,
                         "balance": 0.01, "clip_frac_low": 0.01, "clip_frac_high": 0.02,
                         "iw_mean": 1.0, "iw_min": 0.5, "iw_max": 2.0, "iw_truncated_frac": 0.0,
                         "grad_norm": 0.8, "lr": 1e-4},
                "moe": [{"layer": 0, "load": [0.5, 0.5], "max_vio": 0.0, "cv": 0.0,
                         "load_entropy": 1.0, "router_entropy": 0.69, "dead_experts": 0}],
                "spikes": {"spike": false, "count": 2, "window_mean": 0.0, "window_std": 0.0},
                "curriculum": {"frontier": {"hops": 2 + u / 3}, "context_tokens": 2048},
                "service": {"open_groups": 1, "groups_completed": u, "groups_expired": 0,
                            "actors_active": 2, "trajectories_read": 32 * u}
            })
            .to_string()
                + "\n"
        })
        .collect()
}

#[test]
fn the_learners_nested_metrics_layout_is_read() {
    let dir = tempfile::tempdir().unwrap();
    finished_run(dir.path());
    let start = run_json(Some(18))["started_unix_ms"].as_u64().unwrap();
    put(
        dir.path(),
        "metrics/metrics.jsonl",
        &metrics_nested(6, start),
    );
    let inputs = Inputs::read(dir.path()).unwrap();
    let u = &inputs.updates[2];
    assert_eq!(u.update, Some(3));
    assert_eq!(u.policy_version, Some(4));
    assert_eq!(u.wall_s, Some(90.0), "unix_ms against run.json's start");
    assert!((u.reward_mean.unwrap() - 0.3).abs() < 1e-12);
    assert_eq!(u.kl, Some(0.003));
    assert_eq!(u.entropy, Some(0.9));
    assert_eq!(u.policy_loss, Some(-0.02));
    assert_eq!(u.is_weight_max, Some(2.0));
    assert_eq!(u.staleness_mean, Some(0.25));
    assert_eq!(u.loss_spikes, Some(2));
    assert_eq!(u.frontier.get("hops"), Some(&3));
    assert_eq!(u.success_by_family_level["hops"]["2"], Some(0.75));
    // A level without episodes in the batch has no rate (not a rate of 0).
    assert_eq!(u.success_by_family_level["hops"]["3"], None);
    assert_eq!(u.moe[0].router_entropy, Some(0.69));

    let summary = write(dir.path()).unwrap();
    assert_eq!(summary.plots.len(), ALL_CHARTS.len());
    let r = report_json(dir.path());
    assert_eq!(r["training"]["last_policy_version"], 7);
    assert_eq!(r["training"]["frontier_by_family"]["hops"], 4);
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
fn a_record_written_by_the_learner_is_read_in_full() {
    // The contract with `corvid_learner::metrics`: if a field the report reads is renamed
    // there, this test fails here.
    use corvid_learner::metrics::{LayerHealth, Rate, UpdateRecord};
    let dir = tempfile::tempdir().unwrap();
    let start = 1_700_000_000_000u64;
    put_json(dir.path(), "run.json", &json!({"started_unix_ms": start}));
    let mut rec = UpdateRecord {
        step: 7,
        policy_version: 8,
        unix_ms: start + 90_000,
        ..UpdateRecord::default()
    };
    rec.rollout.reward_mean = 0.4;
    rec.rollout.success_rate = 0.5;
    rec.rollout.success_by_task.insert(
        "hops/3".into(),
        Rate {
            episodes: 4,
            successes: 3,
            rate: 0.75,
        },
    );
    rec.rollout.tokens_per_s = 1234.0;
    rec.rollout.episodes_per_s = 2.0;
    rec.rollout.staleness_mean = 0.5;
    rec.loss.policy = -0.1;
    rec.loss.kl = 0.01;
    rec.loss.entropy = 1.1;
    rec.loss.clip_frac_low = 0.02;
    rec.loss.clip_frac_high = 0.03;
    rec.loss.iw_mean = 0.99;
    rec.loss.iw_max = 1.7;
    rec.loss.grad_norm = 0.3;
    rec.moe.push(LayerHealth {
        layer: 1,
        load: vec![0.25; 4],
        max_vio: 0.1,
        router_entropy: 1.3,
        dead_experts: 2,
        ..LayerHealth::default()
    });
    rec.spikes.count = 1;
    rec.curriculum.frontier.insert("hops".into(), 3);
    put(
        dir.path(),
        "metrics/metrics.jsonl",
        &(serde_json::to_string(&rec).unwrap() + "\n"),
    );

    let inputs = Inputs::read(dir.path()).unwrap();
    assert_eq!(inputs.updates.len(), 1);
    let u = &inputs.updates[0];
    assert_eq!(u.update, Some(7));
    assert_eq!(u.policy_version, Some(8));
    assert_eq!(u.wall_s, Some(90.0));
    assert_eq!(u.reward_mean, Some(0.4));
    assert_eq!(u.success_rate, Some(0.5));
    assert_eq!(u.success_by_family_level["hops"]["3"], Some(0.75));
    assert_eq!(u.frontier.get("hops"), Some(&3));
    assert_eq!(u.policy_loss, Some(-0.1));
    assert_eq!(u.kl, Some(0.01));
    assert_eq!(u.entropy, Some(1.1));
    assert_eq!(u.clip_frac_low, Some(0.02));
    assert_eq!(u.clip_frac_high, Some(0.03));
    assert_eq!(u.is_weight_mean, Some(0.99));
    assert_eq!(u.is_weight_max, Some(1.7));
    assert_eq!(u.grad_norm, Some(0.3));
    assert_eq!(u.tokens_per_s, Some(1234.0));
    assert_eq!(u.episodes_per_s, Some(2.0));
    assert_eq!(u.staleness_mean, Some(0.5));
    assert_eq!(u.loss_spikes, Some(1));
    let m = &u.moe[0];
    assert_eq!(
        (
            m.layer,
            m.load.as_slice(),
            m.max_vio,
            m.router_entropy,
            m.dead_experts
        ),
        (
            Some(1),
            [0.25; 4].as_slice(),
            Some(0.1),
            Some(1.3),
            Some(2.0)
        )
    );
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

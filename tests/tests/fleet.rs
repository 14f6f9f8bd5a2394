//! The fleet across network hosts: a learner host and two actor hosts, each a network
//! namespace with its own address ([`corvid_e2e::hosts`]), running real `corvid learner`
//! and `corvid actor` processes. Each scenario does to the network what an operator's
//! network does — a link down for 30 s, a host gone for good, the learner cut off for 60 s,
//! a lossy and slow link, the learner SIGKILLed and resumed — and ends with the books
//! reconciled from the store, the learner's metrics and the actors' own summaries
//! ([`reconcile`]).
//!
//! Making namespaces needs root; without it every test here says so and passes without
//! running (CI runs as root). The scenarios run one at a time: each times outages against
//! the learner's clocks, which a second run on two cores would skew.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use corvid_e2e::hosts::Network;
use corvid_e2e::{acked_ids, corvid, wait_for};
use serde_json::Value;

/// The run every scenario trains: the e2e run's tiny model, until stopped.
const CONFIG: &str = include_str!("../fleet.toml");
/// Where the learner listens: its host's address.
const LISTEN: &str = "10.0.0.1:50051";
/// Episodes per group in `CONFIG`.
const GROUP_SIZE: u64 = 3;
/// The actor hosts.
const ACTORS: [&str; 2] = ["a1", "a2"];

/// One scenario at a time (see the module docs).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The three hosts, or `None` (after saying why) where namespaces cannot be made.
fn hosts() -> Option<Network> {
    match Network::new(&["learner", ACTORS[0], ACTORS[1]]) {
        Ok(n) => Some(n),
        Err(e) => {
            eprintln!("skipping the multi-host scenario: {e} (run the tests as root)");
            None
        }
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Sends `signal` (`TERM`, `KILL`) to `child`.
fn signal(child: &Child, signal: &str) {
    let ok = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{signal} {}", child.id());
}

/// Waits up to `timeout` for `child` to exit; SIGKILLs it and panics past that.
fn wait_exit(child: &mut Child, what: &str, timeout: Duration) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            return s;
        }
        if t.elapsed() > timeout {
            let _ = child.kill();
            panic!("{what} did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A learner and its actors on the three hosts.
struct Fleet {
    net: Network,
    dir: tempfile::TempDir,
    learner: Option<Child>,
    actors: BTreeMap<String, Child>,
}

impl Fleet {
    /// The learner on its host, then one actor per actor host once the token exists.
    fn start(net: Network) -> Self {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("fleet.toml"), CONFIG).expect("config");
        let mut f = Fleet {
            net,
            dir,
            learner: None,
            actors: BTreeMap::new(),
        };
        f.start_learner(false);
        let token = f.run().join("token");
        wait_for("the learner's token file", Duration::from_secs(120), || {
            token.exists()
        });
        for h in ACTORS {
            f.start_actor(h);
        }
        f
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn run(&self) -> PathBuf {
        self.path("run")
    }

    fn start_learner(&mut self, resume: bool) {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.path("learner.log"))
            .expect("learner log");
        let mut cmd = self.net.command("learner", &corvid());
        cmd.arg("learner")
            .arg("--config")
            .arg(self.path("fleet.toml"))
            .arg("--run-dir")
            .arg(self.run())
            .args(["--listen", LISTEN])
            .env("RUST_LOG", "info")
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        if resume {
            cmd.arg("--resume");
        }
        self.learner = Some(cmd.spawn().expect("spawning the learner"));
    }

    fn start_actor(&mut self, host: &str) {
        let mut cmd = self.net.command(host, &corvid());
        cmd.arg("actor")
            .args(["--learner", &format!("http://{LISTEN}")])
            .arg("--token-file")
            .arg(self.run().join("token"))
            .args([
                "--concurrency",
                "4",
                "--name",
                host,
                "--grace-s",
                "5",
                "--json",
            ])
            .arg("--spool")
            .arg(self.path(&format!("spool-{host}")))
            .env("RUST_LOG", "info,corvid_actor::submit=debug")
            .stdout(File::create(self.path(&format!("{host}.json"))).expect("summary"))
            .stderr(File::create(self.path(&format!("{host}.log"))).expect("log"));
        let child = cmd.spawn().expect("spawning an actor");
        self.actors.insert(host.to_owned(), child);
    }

    fn actor_log(&self, host: &str) -> String {
        read(&self.path(&format!("{host}.log")))
    }

    fn acked(&self, host: &str) -> usize {
        acked_ids(&self.actor_log(host)).len()
    }

    /// Metrics lines written so far (one per RL update).
    fn updates(&self) -> usize {
        read(&self.run().join("metrics").join("metrics.jsonl"))
            .lines()
            .count()
    }

    fn wait_acked(&self, host: &str, n: usize, timeout: Duration) {
        wait_for(
            &format!("{n} trajectories acked to {host}"),
            timeout,
            || self.acked(host) >= n,
        );
    }

    fn wait_updates(&self, n: usize, timeout: Duration) {
        wait_for(&format!("{n} RL updates"), timeout, || self.updates() >= n);
    }

    /// Both actors have had trajectories acknowledged and the learner has trained.
    fn wait_streaming(&self) {
        for h in ACTORS {
            self.wait_acked(h, 2, Duration::from_secs(300));
        }
        self.wait_updates(1, Duration::from_secs(300));
    }

    /// SIGKILLs the learner (and reaps it).
    fn kill_learner(&mut self) {
        let mut l = self.learner.take().expect("a running learner");
        signal(&l, "KILL");
        let _ = l.wait();
    }

    /// Stops the actors (SIGTERM: in-flight episodes finish or are abandoned, the spool
    /// drains), then the learner (SIGTERM: a checkpoint), and reads the books.
    fn stop(mut self) -> Books {
        let hosts: Vec<String> = self.actors.keys().cloned().collect();
        for host in hosts {
            let child = self.actors.get_mut(&host).expect("a running actor");
            signal(child, "TERM");
            let s = wait_exit(child, &format!("actor {host}"), Duration::from_secs(120));
            assert!(
                s.success(),
                "actor {host} failed:\n{}",
                self.actor_log(&host)
            );
        }
        let mut learner = self.learner.take().expect("a running learner");
        signal(&learner, "TERM");
        let s = wait_exit(&mut learner, "the learner", Duration::from_secs(180));
        assert!(
            s.success(),
            "the learner failed:\n{}",
            read(&self.path("learner.log"))
        );
        let store = self.run().join("store");
        let out = std::process::Command::new(corvid())
            .args(["replay", "list", "--json", "--store"])
            .arg(&store)
            .stderr(Stdio::inherit())
            .output()
            .expect("corvid replay list");
        assert!(out.status.success(), "corvid replay list failed");
        let stored = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("a record line"))
            .collect();
        let mut summaries = BTreeMap::new();
        let mut logs = BTreeMap::new();
        for h in ACTORS {
            logs.insert(h.to_owned(), self.actor_log(h));
            if self.actors.contains_key(h) {
                let text = read(&self.path(&format!("{h}.json")));
                let v: Value = serde_json::from_str(text.trim())
                    .unwrap_or_else(|e| panic!("actor {h}'s summary {text:?}: {e}"));
                summaries.insert(h.to_owned(), v);
            }
        }
        let metrics = read(&self.run().join("metrics").join("metrics.jsonl"))
            .lines()
            .map(|l| serde_json::from_str(l).expect("a metrics line"))
            .collect();
        Books {
            stored,
            summaries,
            logs,
            metrics,
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for c in self.actors.values_mut().chain(self.learner.as_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What a stopped fleet leaves to count.
struct Books {
    /// `corvid replay list --json` of the store.
    stored: Vec<Value>,
    /// The final `--json` report of each actor that was stopped, not lost.
    summaries: BTreeMap<String, Value>,
    /// Each actor host's log.
    logs: BTreeMap<String, String>,
    /// The learner's metrics lines.
    metrics: Vec<Value>,
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

impl Books {
    /// Metrics by RL step, the last line of each step (an update redone after a SIGKILL
    /// replaces the lost one; its training was rolled back with the checkpoint).
    fn updates(&self) -> Vec<&Value> {
        let mut by_step = BTreeMap::new();
        for m in &self.metrics {
            by_step.insert(u(&m["step"]), m);
        }
        by_step.into_values().collect()
    }

    /// The last update's service figures.
    fn service(&self) -> &Value {
        &self.metrics.last().expect("at least one RL update")["service"]
    }
}

/// The books of a stopped fleet; `lost` are actor hosts that vanished without stopping.
///
/// - **Nothing acknowledged is lost**: every id any actor's log shows acknowledged is stored.
/// - **Stored = acknowledged**: an actor that stopped cleanly saw every trajectory of its
///   own that is stored acknowledged, and nothing else; its report has nothing lost,
///   rejected or left in its spool. (A vanished actor may have had a trajectory stored
///   whose acknowledgement never reached it.)
/// - **Every episode handed out is stored, reclaimed, or in a group that expired or is
///   still open**, per the learner's counters at its last update.
/// - **None trained twice**: an episode is its group and sampler seed; the updates consumed
///   no more episodes than distinct ones are stored, and skipped no more second copies than
///   the store holds.
fn reconcile(b: &Books, lost: &[&str]) -> Summary {
    let ids: Vec<&str> = b
        .stored
        .iter()
        .map(|r| r["header"]["trajectory_id"].as_str().expect("id"))
        .collect();
    let stored: HashSet<&str> = ids.iter().copied().collect();
    assert_eq!(stored.len(), ids.len(), "a trajectory id is stored twice");

    for (host, log) in &b.logs {
        for id in acked_ids(log) {
            assert!(
                stored.contains(id.as_str()),
                "{host} saw {id} acknowledged but it is not in the store"
            );
        }
    }
    for (host, s) in &b.summaries {
        assert!(!lost.contains(&host.as_str()));
        for k in ["lost", "rejected", "spool_left"] {
            assert_eq!(u(&s[k]), 0, "actor {host}'s report: {k} in {s}");
        }
        let actor_id = s["actor_id"].as_str().expect("actor_id");
        let own: HashSet<&str> = b
            .stored
            .iter()
            .filter(|r| r["header"]["actor_id"] == actor_id)
            .map(|r| r["header"]["trajectory_id"].as_str().expect("id"))
            .collect();
        let acked: Vec<String> = acked_ids(&b.logs[host]);
        let acked: HashSet<&str> = acked.iter().map(String::as_str).collect();
        assert_eq!(
            own, acked,
            "actor {host}: its stored trajectories are not the ones it saw acknowledged"
        );
    }

    // Episodes: (group, sampler seed) → copies stored.
    let mut episodes: HashMap<(String, u64), u64> = HashMap::new();
    for r in &b.stored {
        let h = &r["header"];
        let group = h["group_id"].as_str().unwrap_or_default().to_owned();
        *episodes
            .entry((group, u(&h["sampling"]["seed"])))
            .or_default() += 1;
    }
    let distinct = episodes.len() as u64;
    let copies = ids.len() as u64 - distinct;
    let updates = b.updates();
    let consumed: u64 = updates
        .iter()
        .map(|m| {
            let r = &m["rollout"];
            [
                "episodes",
                "stale_skipped",
                "unscored_skipped",
                "too_long_skipped",
                "invalid_skipped",
            ]
            .iter()
            .map(|k| u(&r[*k]))
            .sum::<u64>()
        })
        .sum();
    let copies_skipped: u64 = updates
        .iter()
        .map(|m| u(&m["rollout"]["copies_skipped"]))
        .sum();
    assert!(
        consumed <= distinct,
        "the updates consumed {consumed} episodes but only {distinct} distinct ones are stored"
    );
    assert!(
        copies_skipped <= copies,
        "{copies_skipped} second copies skipped but the store holds {copies}"
    );
    let sv = b.service();
    let (issued, reclaimed) = (u(&sv["episodes_issued"]), u(&sv["episodes_reclaimed"]));
    let unfinished_groups = u(&sv["open_groups"]) + u(&sv["groups_expired"]);
    assert!(
        issued - reclaimed <= distinct + GROUP_SIZE * unfinished_groups,
        "handed out {issued} episodes ({reclaimed} of them again) but only {distinct} are \
         stored and {unfinished_groups} groups are open or expired"
    );
    let s = Summary {
        stored: ids.len() as u64,
        distinct,
        copies,
        copies_skipped,
        consumed,
        issued,
        reclaimed,
        groups_expired: u(&sv["groups_expired"]),
        updates: updates.len() as u64,
    };
    eprintln!("books: {s:?}");
    s
}

/// The reconciled totals a scenario may assert more on.
#[derive(Debug)]
#[allow(dead_code)] // printed whole; scenarios read some fields
struct Summary {
    stored: u64,
    distinct: u64,
    copies: u64,
    copies_skipped: u64,
    consumed: u64,
    issued: u64,
    reclaimed: u64,
    groups_expired: u64,
    updates: u64,
}

/// One scenario's turn, the hosts, and a fleet streaming on them; `None` (after saying why)
/// where hosts cannot be made.
fn streaming_fleet() -> Option<(std::sync::MutexGuard<'static, ()>, Fleet)> {
    let one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let fleet = Fleet::start(hosts()?);
    fleet.wait_streaming();
    Some((one, fleet))
}

fn report_u(b: &Books, host: &str, key: &str) -> u64 {
    u(&b.summaries[host][key])
}

#[test]
fn an_actor_hosts_link_down_for_30_s_spools_resends_and_its_late_copies_are_not_trained() {
    let Some((_one, fleet)) = streaming_fleet() else {
        return;
    };

    // Cut a1 off while it runs an episode, so that it holds an assignment the learner must
    // hand out again once a1 times out.
    let active = fleet.path("spool-a1").join("active");
    wait_for("a1 running an episode", Duration::from_secs(120), || {
        std::fs::read_dir(&active).is_ok_and(|d| {
            d.flatten()
                .any(|e| e.metadata().is_ok_and(|m| m.is_file() && m.len() > 0))
        })
    });
    fleet.net.link("a1", false).expect("link down");
    let (before, acked_before) = (fleet.updates(), fleet.acked("a1"));
    std::thread::sleep(Duration::from_secs(30));
    let during = fleet.updates();
    fleet.net.link("a1", true).expect("link up");
    assert!(
        during > before,
        "the learner trained on a2's episodes while a1 was cut off ({before} → {during} updates)"
    );
    fleet.wait_acked("a1", acked_before + 1, Duration::from_secs(120));
    fleet.wait_updates(during + 2, Duration::from_secs(180));

    let b = fleet.stop();
    let s = reconcile(&b, &[]);
    assert!(
        s.reclaimed >= 1,
        "a1's held episodes were handed out again after actor_timeout_s: {s:?}"
    );
}

#[test]
fn an_actor_host_that_disappears_for_good_loses_nothing_acknowledged() {
    let Some((_one, mut fleet)) = streaming_fleet() else {
        return;
    };

    fleet.net.remove_host("a1");
    if let Some(mut c) = fleet.actors.remove("a1") {
        let _ = c.wait();
    }
    let n = fleet.updates();
    fleet.wait_updates(n + 3, Duration::from_secs(240));

    let b = fleet.stop();
    let s = reconcile(&b, &["a1"]);
    assert!(s.updates as usize >= n + 3, "{s:?}");
}

#[test]
fn actors_finish_episodes_while_the_learner_host_is_cut_off_for_60_s_and_submit_them_after() {
    let Some((_one, fleet)) = streaming_fleet() else {
        return;
    };

    fleet.net.link("learner", false).expect("link down");
    let acked_before: usize = ACTORS.iter().map(|h| fleet.acked(h)).sum();
    std::thread::sleep(Duration::from_secs(60));
    fleet.net.link("learner", true).expect("link up");
    let n = fleet.updates();
    fleet.wait_updates(n + 2, Duration::from_secs(240));
    let acked_after: usize = ACTORS.iter().map(|h| fleet.acked(h)).sum();
    assert!(
        acked_after > acked_before,
        "the actors' episodes reached the learner after the outage ({acked_before} → {acked_after})"
    );

    let b = fleet.stop();
    reconcile(&b, &[]);
}

#[test]
fn a_lossy_slow_link_completes_a_short_run_beside_a_clean_one() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut net) = hosts() else { return };
    let how = match net.impair("a1", 5.0, 50) {
        Ok(how) => how,
        Err(e) => {
            eprintln!("skipping the lossy-link scenario: a link cannot be impaired here ({e})");
            return;
        }
    };
    eprintln!("a1's link: 5% loss, 50 ms delay, each way, by {how:?}");
    let fleet = Fleet::start(net);
    let start = Instant::now();
    fleet.wait_streaming();
    let n = fleet.updates();
    fleet.wait_updates(n + 6, Duration::from_secs(300));
    let secs = start.elapsed().as_secs_f64();
    if let Some(w) = fleet.net.wire("a1") {
        eprintln!("a1's wire: {}", w.counts());
    }
    let b = fleet.stop();
    reconcile(&b, &[]);
    // Throughput of the lossy link (a1) against the clean one (a2) in the same run.
    let acked = ACTORS.map(|h| report_u(&b, h, "acked"));
    for (h, n) in ACTORS.iter().zip(acked) {
        eprintln!(
            "{h}: {n} trajectories acknowledged in {secs:.0} s ({:.2}/s)",
            n as f64 / secs
        );
    }
    eprintln!(
        "lossy/clean throughput: {:.2}",
        acked[0] as f64 / acked[1].max(1) as f64
    );
    assert!(acked[0] >= 1, "the actor behind the lossy link delivered");
}

#[test]
fn the_learner_sigkilled_and_resumed_while_actors_on_other_hosts_keep_streaming() {
    let Some((_one, mut fleet)) = streaming_fleet() else {
        return;
    };
    fleet.wait_updates(2, Duration::from_secs(180));

    fleet.kill_learner();
    let killed_at = fleet.updates();
    std::thread::sleep(Duration::from_secs(3));
    fleet.start_learner(true);
    fleet.wait_updates(killed_at + 3, Duration::from_secs(300));

    let acked_after: usize = ACTORS.iter().map(|h| fleet.acked(h)).sum();
    let b = fleet.stop();
    let s = reconcile(&b, &[]);
    assert!(
        s.updates as usize >= killed_at + 3,
        "the resumed learner went on training: {s:?}"
    );
    assert!(
        acked_after >= 4,
        "the actors kept streaming across the restart"
    );
}

//! Durability under SIGKILL: a child process writes trajectories and reports each
//! one it finished (= flushed = would be acked); the parent kills it at a random
//! moment, reopens the store and checks that every reported trajectory is intact
//! and that nothing partial is visible. Twenty rounds on the same store.
//!
//! The child is this test binary re-run with `CORVID_CRASH_CHILD` set, selecting
//! only `crash_child_writer` (a no-op in a normal run).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use corvid_proto::synthetic::{self, Shape};
use corvid_store::{Begin, Filter, TrajectoryStore};
use rand::Rng;

const ROUNDS: usize = 20;
const CHILD_ENV: &str = "CORVID_CRASH_CHILD";

/// Every other trajectory records routes of this shape (they go to its route file).
const ROUTES: corvid_proto::RouteShape = corvid_proto::RouteShape {
    moe_layers: 8,
    experts_per_token: 4,
    routed_experts: 64,
};

/// Whether trajectory `id` records routes.
fn routed(id: &str) -> bool {
    id.bytes().map(u64::from).sum::<u64>() % 2 == 0
}

/// Trajectory `id`'s header and its steps.
fn trajectory(id: &str) -> (corvid_proto::TrajectoryHeader, Vec<corvid_proto::Step>) {
    let mut header = synthetic::header(id, "hops", 1, 0);
    if !routed(id) {
        return (header, synthetic::steps(id, shape_of(id)).collect());
    }
    header.routes = Some(ROUTES);
    (
        header,
        synthetic::routed_steps(id, shape_of(id), ROUTES).collect(),
    )
}

/// Trajectory shapes vary with the id so kills land mid-trajectory often.
fn shape_of(id: &str) -> Shape {
    let n = id.bytes().map(u64::from).sum::<u64>();
    Shape {
        steps: 5 + n % 40,
        tokens_per_step: 64 + (n % 5) as u32 * 50,
    }
}

#[test]
fn crash_child_writer() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return; // normal run: nothing to do
    };
    let (dir, round) = spec.split_once('|').expect("dir|round");
    let store = Arc::new(TrajectoryStore::open(dir).expect("open store"));
    println!("READY");
    for i in 0.. {
        let id = format!("r{round}-t{i}");
        let shape = shape_of(&id);
        let (header, steps) = trajectory(&id);
        let Begin::New(mut w) = store.begin(header).unwrap() else {
            continue;
        };
        for (seq, step) in steps.into_iter().enumerate() {
            w.append(seq as u64, step).unwrap();
        }
        w.finish_blocking(synthetic::footer(&id, shape)).unwrap();
        println!("ACK {id}");
    }
}

fn verify_intact(store: &TrajectoryStore, id: &str) {
    let shape = shape_of(id);
    let rec = store
        .get(id)
        .unwrap()
        .unwrap_or_else(|| panic!("acknowledged trajectory {id} is missing"));
    assert_eq!(
        rec.footer,
        Some(synthetic::footer(id, shape)),
        "{id} footer"
    );
    let written = trajectory(id).1;
    let mut n = 0;
    for (seq, step) in store.steps(id).unwrap().unwrap().enumerate() {
        assert!(step.unwrap() == written[seq], "{id} step {seq}");
        n += 1;
    }
    assert_eq!(n, shape.steps, "{id} step count");
}

#[test]
fn sigkill_at_random_moments_loses_no_acknowledged_trajectory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let exe = std::env::current_exe().unwrap();
    let mut rng = rand::rng();
    let mut acked_total: Vec<String> = Vec::new();
    for round in 0..ROUNDS {
        let mut child = Command::new(&exe)
            .args([
                "crash_child_writer",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, format!("{}|{round}", path.display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        // Wait until the child has opened the store (slow on a loaded machine), then
        // kill it anywhere from before its first write to deep into the stream.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            // The test harness prints its own lines first.
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                // libtest may print "test crash_child_writer ... " on the same line.
                Ok(line) if line.ends_with("READY") => break,
                Ok(_) => continue,
                Err(e) => panic!("round {round}: child never opened the store: {e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(0..300)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        reader.join().unwrap();
        let acked: Vec<String> = rx
            .try_iter()
            .filter_map(|l| l.strip_prefix("ACK ").map(str::to_owned))
            .collect();

        let store = TrajectoryStore::open(&path).unwrap();
        assert_eq!(
            store.stats().unwrap().open,
            0,
            "round {round}: partial left open"
        );
        acked_total.extend(acked);
        for id in &acked_total {
            verify_intact(&store, id);
        }
        // Whatever is visible is whole, acknowledged or not (the kill may land
        // between the flush and the report).
        let mut visible_routed = Vec::new();
        for rec in store.list(&Filter::default()) {
            let id = rec.unwrap().header.trajectory_id;
            verify_intact(&store, &id);
            if routed(&id) {
                visible_routed.push(format!("{id}.routes"));
            }
        }
        // No route file outlives its trajectory.
        let mut files: Vec<String> = std::fs::read_dir(path.join(corvid_store::ROUTES_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        files.sort();
        visible_routed.sort();
        assert_eq!(files, visible_routed, "round {round}: route files");
    }
    assert!(
        acked_total.len() >= ROUNDS,
        "children acknowledged only {} trajectories in {ROUNDS} rounds; the test did not exercise the store",
        acked_total.len()
    );
}

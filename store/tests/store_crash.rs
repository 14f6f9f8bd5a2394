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
        let Begin::New(mut w) = store.begin(synthetic::header(&id, "hops", 1, 0)).unwrap() else {
            continue;
        };
        for (seq, step) in synthetic::steps(&id, shape).enumerate() {
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
    let mut n = 0;
    for (seq, step) in store.steps(id).unwrap().unwrap().enumerate() {
        assert_eq!(
            step.unwrap(),
            synthetic::step(id, seq as u64, shape),
            "{id} step {seq}"
        );
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
        for rec in store.list(&Filter::default()) {
            verify_intact(&store, &rec.unwrap().header.trajectory_id);
        }
    }
    assert!(
        acked_total.len() >= ROUNDS,
        "children acknowledged only {} trajectories in {ROUNDS} rounds; the test did not exercise the store",
        acked_total.len()
    );
}

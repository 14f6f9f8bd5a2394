//! The trajectory store on real sled on disk: visibility, idempotence, indexes,
//! export and the trainer cursor.

use std::sync::Arc;

use corvid_proto::synthetic::{self, Shape};
use corvid_proto::Termination;
use corvid_store::{Begin, Filter, TrajectoryStore};

const SHAPE: Shape = Shape {
    steps: 4,
    tokens_per_step: 12,
};

fn open(dir: &tempfile::TempDir) -> Arc<TrajectoryStore> {
    Arc::new(TrajectoryStore::open(dir.path().join("store")).unwrap())
}

/// Writes synthetic trajectory `id` completely.
fn write(store: &Arc<TrajectoryStore>, id: &str, family: &str, level: u32, version: u64) {
    let Begin::New(mut w) = store
        .begin(synthetic::header(id, family, level, version))
        .unwrap()
    else {
        panic!("{id} already stored")
    };
    for (seq, step) in synthetic::steps(id, SHAPE).enumerate() {
        w.append(seq as u64, step).unwrap();
    }
    w.finish_blocking(synthetic::footer(id, SHAPE)).unwrap();
}

#[test]
fn finished_trajectory_reads_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    write(&store, "t1", "hops", 2, 5);
    let rec = store.get("t1").unwrap().expect("visible");
    assert_eq!(rec.header, synthetic::header("t1", "hops", 2, 5));
    assert_eq!(rec.footer, Some(synthetic::footer("t1", SHAPE)));
    let steps: Vec<_> = store
        .steps("t1")
        .unwrap()
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(steps, synthetic::steps("t1", SHAPE).collect::<Vec<_>>());
}

/// Steps longer than a piece (a DeepSeek-V3 route shape, ~470 KB) are written in pieces
/// and read back whole, beside small steps, an empty step and a trajectory whose id
/// extends this one's.
#[test]
fn steps_longer_than_a_piece_read_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let shape = corvid_proto::RouteShape {
        moe_layers: 58,
        experts_per_token: 8,
        routed_experts: 256,
    };
    let long = Shape {
        steps: 3,
        tokens_per_step: 1000,
    };
    let pattern = synthetic::RoutePattern::new("t", shape);
    let mut steps: Vec<_> = synthetic::steps("t", long)
        .enumerate()
        .map(|(seq, s)| pattern.apply(seq as u64, s))
        .collect();
    // An empty step, then a one-token step (one route row).
    steps.insert(1, corvid_proto::Step::context(1, vec![]));
    steps.insert(2, pattern.apply(2, corvid_proto::Step::context(2, vec![7])));
    let bytes = |s: &corvid_proto::Step| {
        use prost::Message;
        corvid_proto::pb::Step::from(s.clone()).encoded_len()
    };
    assert!(bytes(&steps[0]) > 50 * corvid_store::STEP_PIECE_BYTES);
    let mut header = synthetic::header("t", "hops", 1, 1);
    header.routes = Some(shape);
    let Begin::New(mut w) = store.begin(header).unwrap() else {
        panic!()
    };
    for (seq, s) in steps.iter().enumerate() {
        w.append(seq as u64, s.clone()).unwrap();
    }
    let tokens = steps.iter().map(|s| s.token_ids.len() as u64).sum();
    let generated = steps.iter().map(|s| s.generated_count() as u64).sum();
    let footer = corvid_proto::TrajectoryFooter {
        step_count: steps.len() as u64,
        token_count: tokens,
        generated_token_count: generated,
        ..synthetic::footer("t", long)
    };
    w.finish_blocking(footer).unwrap();
    write(&store, "t0", "hops", 1, 1);
    let read: Vec<_> = store
        .steps("t")
        .unwrap()
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(read, steps);
    drop(store);
    let store = open(&dir);
    let (_, t) = store.load("t").unwrap().unwrap();
    assert_eq!(t.steps, steps);
    assert_eq!(
        store.load("t0").unwrap().unwrap().1.steps.len(),
        SHAPE.steps as usize
    );
}

/// Writes synthetic trajectory `id` completely, with routes of `routes`; returns its steps.
fn write_routed(
    store: &Arc<TrajectoryStore>,
    id: &str,
    routes: corvid_proto::RouteShape,
) -> Vec<corvid_proto::Step> {
    let steps: Vec<_> = synthetic::routed_steps(id, SHAPE, routes).collect();
    let mut header = synthetic::header(id, "hops", 1, 1);
    header.routes = Some(routes);
    let Begin::New(mut w) = store.begin(header).unwrap() else {
        panic!("{id} already stored")
    };
    for (seq, s) in steps.iter().enumerate() {
        w.append(seq as u64, s.clone()).unwrap();
    }
    w.finish_blocking(synthetic::footer(id, SHAPE)).unwrap();
    steps
}

/// The route files in `store`'s folder, by name.
fn route_files(store: &TrajectoryStore) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(store.path().join(corvid_store::ROUTES_DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn a_route_file_lives_and_dies_with_its_trajectory() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    // 32 bytes per token: the smallest shape whose routes go to a file.
    let shape = corvid_proto::RouteShape {
        moe_layers: 16,
        experts_per_token: 2,
        routed_experts: 64,
    };
    assert_eq!(
        shape.bytes_per_token(),
        corvid_store::ROUTE_FILE_BYTES_PER_TOKEN
    );
    let routed = |id: &str| {
        let mut header = synthetic::header(id, "hops", 1, 1);
        header.routes = Some(shape);
        header
    };
    // Finished: its file holds a frame per step (16 bytes, then the routes).
    let steps = write_routed(&store, "r", shape);
    let route_bytes: usize = steps.iter().map(|s| 16 + s.routes.len()).sum();
    let file = store.path().join("routes/r.routes");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), route_bytes as u64);
    // Dropped unfinished: its file goes with its steps.
    let Begin::New(mut w) = store.begin(routed("dropped")).unwrap() else {
        panic!()
    };
    w.append(0, steps[0].clone()).unwrap();
    assert_eq!(route_files(&store), ["dropped.routes", "r.routes"]);
    drop(w);
    assert_eq!(route_files(&store), ["r.routes"]);
    // Without a route shape, no file; with a smaller one, the routes stay in their steps.
    write(&store, "plain", "hops", 1, 1);
    let small = corvid_proto::RouteShape {
        moe_layers: 15,
        ..shape
    };
    let small_steps = write_routed(&store, "small", small);
    assert_eq!(route_files(&store), ["r.routes"]);
    assert_eq!(store.load("small").unwrap().unwrap().1.steps, small_steps);
    assert!(!store.get("small").unwrap().unwrap().routes_in_file);
    // A file whose trajectory never finished (its open record lost in a crash) is removed
    // at the next open; a file the store did not name is left alone.
    let path = store.path().to_path_buf();
    drop(store);
    std::fs::write(path.join("routes/lost.routes"), b"partial").unwrap();
    std::fs::write(path.join("routes/README"), b"mine").unwrap();
    let store = open(&dir);
    assert_eq!(route_files(&store), ["README", "r.routes"]);
    let (_, t) = store.load("r").unwrap().unwrap();
    assert_eq!(t.steps, steps);
    assert!(store.get("r").unwrap().unwrap().routes_in_file);
    assert!(!store.get("plain").unwrap().unwrap().routes_in_file);
    // Resending a finished id changes nothing, its file included.
    assert!(matches!(
        store.begin(routed("r")).unwrap(),
        Begin::Duplicate(_)
    ));
    assert_eq!(std::fs::metadata(&file).unwrap().len(), route_bytes as u64);
}

#[test]
fn unfinished_trajectory_is_invisible_to_every_reader() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    write(&store, "done", "hops", 1, 1);
    let Begin::New(mut w) = store
        .begin(synthetic::header("half", "hops", 1, 1))
        .unwrap()
    else {
        panic!()
    };
    w.append(0, synthetic::step("half", 0, SHAPE)).unwrap();

    assert!(store.get("half").unwrap().is_none());
    assert!(store.steps("half").unwrap().is_none());
    let listed: Vec<String> = store
        .list(&Filter::default())
        .map(|r| r.unwrap().header.trajectory_id)
        .collect();
    assert_eq!(listed, ["done"]);
    let mut out = Vec::new();
    let summary = store.export_jsonl(&Filter::default(), &mut out).unwrap();
    assert_eq!(summary.trajectories, 1);
    assert!(!String::from_utf8(out).unwrap().contains("\"half\""));
    let trainer: Vec<_> = store.finished_since(0).map(|r| r.unwrap().1).collect();
    assert_eq!(trainer.len(), 1);
    assert_eq!(store.stats().unwrap().open, 1);

    drop(w); // a broken stream: everything it wrote goes
    assert_eq!(store.stats().unwrap().open, 0);
    assert!(store.steps("half").unwrap().is_none());
}

#[test]
fn resubmitting_a_finished_id_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    write(&store, "t1", "hops", 1, 1);
    let before = store.get("t1").unwrap();
    match store.begin(synthetic::header("t1", "other", 9, 9)).unwrap() {
        Begin::Duplicate(rec) => assert_eq!(Some(*rec), before),
        Begin::New(_) => panic!("a finished id must not be rewritten"),
    }
    assert_eq!(store.get("t1").unwrap(), before);
    assert_eq!(store.stats().unwrap().finished, 1);
}

#[test]
fn a_second_writer_for_a_live_id_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let first = store.begin(synthetic::header("t1", "hops", 1, 1)).unwrap();
    let err = store
        .begin(synthetic::header("t1", "hops", 1, 1))
        .unwrap_err();
    assert!(err.to_string().contains("another stream"), "{err}");
    drop(first);
    assert!(matches!(
        store.begin(synthetic::header("t1", "hops", 1, 1)).unwrap(),
        Begin::New(_)
    ));
}

#[test]
fn a_header_that_could_not_be_read_back_is_refused_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let mut nan = synthetic::header("t-nan", "hops", 1, 1);
    nan.sampling.top_p = f32::NAN;
    let refused = |header| match store.begin(header) {
        Ok(_) => panic!("stored"),
        Err(e) => e,
    };
    let err = refused(nan);
    assert!(err.to_string().contains("sampling.top_p"), "{err}");
    let err = refused(synthetic::header("bad id", "hops", 1, 1));
    assert!(err.to_string().contains("trajectory_id"), "{err}");
    // The store still reads, and holds nothing.
    assert_eq!(store.stats().unwrap().finished, 0);
    assert_eq!(store.list(&Filter::default()).count(), 0);
}

#[test]
fn footer_totals_must_match_what_was_streamed() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let Begin::New(mut w) = store.begin(synthetic::header("t1", "hops", 1, 1)).unwrap() else {
        panic!()
    };
    w.append(0, synthetic::step("t1", 0, SHAPE)).unwrap();
    let err = w
        .finish_blocking(synthetic::footer("t1", SHAPE))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("footer.step_count is 4 but 1 were streamed"),
        "{err}"
    );
    assert!(store.get("t1").unwrap().is_none());
    assert_eq!(store.stats().unwrap().open, 0);
}

#[test]
fn sequence_gaps_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let Begin::New(mut w) = store.begin(synthetic::header("t1", "hops", 1, 1)).unwrap() else {
        panic!()
    };
    w.append(0, synthetic::step("t1", 0, SHAPE)).unwrap();
    let err = w.append(2, synthetic::step("t1", 2, SHAPE)).unwrap_err();
    assert!(
        err.to_string().contains("expected step chunk seq 1, got 2"),
        "{err}"
    );
}

#[test]
fn filters_use_indexes_and_agree_with_a_full_scan() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let mut n = 0;
    for family in ["hops", "search", "shell"] {
        for level in 1..=3 {
            for version in 0..3 {
                write(
                    &store,
                    &format!("{family}-{level}-{version}-{n}"),
                    family,
                    level,
                    version,
                );
                n += 1;
            }
        }
    }
    let all: Vec<_> = store.list(&Filter::default()).map(|r| r.unwrap()).collect();
    assert_eq!(all.len(), 27);
    let filters = [
        Filter {
            family: Some("search".into()),
            ..Filter::default()
        },
        Filter {
            family: Some("search".into()),
            level: Some(2),
            ..Filter::default()
        },
        Filter {
            level: Some(3),
            ..Filter::default()
        },
        Filter {
            min_policy_version: Some(1),
            max_policy_version: Some(1),
            ..Filter::default()
        },
        Filter {
            min_policy_version: Some(2),
            ..Filter::default()
        },
        Filter {
            termination: Some(Termination::MaxTurns),
            ..Filter::default()
        },
        Filter {
            termination: Some(Termination::Answered),
            success: Some(true),
            ..Filter::default()
        },
        Filter {
            success: Some(false),
            ..Filter::default()
        },
    ];
    for f in &filters {
        let mut got: Vec<String> = store
            .list(f)
            .map(|r| r.unwrap().header.trajectory_id)
            .collect();
        let mut want: Vec<String> = all
            .iter()
            .filter(|r| f.matches(r))
            .map(|r| r.header.trajectory_id.clone())
            .collect();
        got.sort();
        want.sort();
        assert_eq!(got, want, "{f:?}");
        assert!(
            !want.is_empty() || f.success.is_some(),
            "filter matched nothing: {f:?}"
        );
    }
    let limited = Filter {
        limit: Some(5),
        ..Filter::default()
    };
    assert_eq!(store.list(&limited).count(), 5);
    let stats = store.stats().unwrap();
    assert_eq!(stats.finished, 27);
    assert_eq!(stats.tokens, 27 * SHAPE.tokens());
    assert_eq!(stats.by_task["shell/2"], 3);
}

#[test]
fn trainer_cursor_resumes_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let cursor;
    {
        let store = Arc::new(TrajectoryStore::open(&path).unwrap());
        for i in 0..5 {
            write(&store, &format!("a{i}"), "hops", 1, 0);
        }
        let read: Vec<_> = store.finished_since(0).map(|r| r.unwrap()).collect();
        assert_eq!(read.len(), 5);
        cursor = read[2].0;
        store
            .mark_consumed(
                read[..3]
                    .iter()
                    .map(|(_, r)| r.header.trajectory_id.as_str()),
                7,
            )
            .unwrap();
        store.flush_sync().unwrap();
    }
    let store = Arc::new(TrajectoryStore::open(&path).unwrap());
    write(&store, "b0", "hops", 1, 0);
    let rest: Vec<String> = store
        .finished_since(cursor)
        .map(|r| r.unwrap().1.header.trajectory_id)
        .collect();
    assert_eq!(rest, ["a3", "a4", "b0"]);
    assert_eq!(store.consumed_at("a0").unwrap(), Some(7));
    assert_eq!(store.consumed_at("a3").unwrap(), None);
    assert_eq!(store.stats().unwrap().consumed, 3);
}

#[test]
fn export_is_one_json_line_per_trajectory_with_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    write(&store, "t1", "hops", 1, 0);
    write(&store, "t2", "shell", 1, 0);
    let mut out = Vec::new();
    let summary = store.export_jsonl(&Filter::default(), &mut out).unwrap();
    assert_eq!(summary.trajectories, 2);
    assert_eq!(summary.steps, 8);
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["header"]["trajectory_id"], "t1");
    let steps = lines[0]["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 4);
    let first: corvid_proto::Step = serde_json::from_value(steps[0].clone()).unwrap();
    assert_eq!(first, synthetic::step("t1", 0, SHAPE));
}

#[test]
fn a_store_reopens_right_after_it_is_closed_and_a_held_one_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    // Close and reopen back to back: sled finishes log writes on background
    // threads after the last handle drops, so its file lock can outlast the close
    // for a moment, and `open` has to wait that out.
    for round in 0..5 {
        let store = Arc::new(TrajectoryStore::open(&path).unwrap());
        write(&store, &format!("r{round}"), "hops", 1, 0);
        store.flush_sync().unwrap();
    }
    let held = TrajectoryStore::open(&path).unwrap();
    assert_eq!(held.stats().unwrap().finished, 5);
    // While it is held, a second open fails (after a bounded wait) and names the path.
    let err = TrajectoryStore::open(&path).unwrap_err().to_string();
    assert!(err.contains("store") && err.contains("lock"), "{err}");
}

/// Many streams finishing at once while the trainer's cursor walks the store and marks
/// what it consumed: the write path (transaction, then flush) under concurrent flushes,
/// batches and iterators. sled 0.34 deadlocked here (a transaction queued behind a flush
/// froze every later reader, the learner's RPCs included) until the store ordered its
/// writers against its flushes; the check is liveness, so the bound is generous.
#[test]
fn concurrent_finishes_flushes_and_cursor_reads_never_deadlock() {
    const STREAMS: usize = 48;
    const PER_STREAM: usize = 12;
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let writer_store = Arc::clone(&store);
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut tasks = tokio::task::JoinSet::new();
            for s in 0..STREAMS {
                let store = Arc::clone(&writer_store);
                tasks.spawn(async move {
                    for i in 0..PER_STREAM {
                        let id = format!("s{s}-t{i}");
                        let Begin::New(mut w) =
                            store.begin(synthetic::header(&id, "hops", 1, 1)).unwrap()
                        else {
                            panic!("{id} already stored")
                        };
                        for (seq, step) in synthetic::steps(&id, SHAPE).enumerate() {
                            w.append(seq as u64, step).unwrap();
                        }
                        w.finish(synthetic::footer(&id, SHAPE)).await.unwrap();
                    }
                });
            }
            while let Some(r) = tasks.join_next().await {
                r.unwrap();
            }
        });
        let _ = done_tx.send(());
    });
    // The trainer's side: walk the cursor and mark what was read, as `Collector::poll` does.
    let reader_store = Arc::clone(&store);
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let reader = std::thread::spawn(move || {
        let (mut cursor, mut step, mut seen) = (0u64, 0u64, 0usize);
        while stop_rx.try_recv().is_err() {
            let batch: Vec<(u64, String)> = reader_store
                .finished_since(cursor)
                .map(|r| r.map(|(seq, rec)| (seq, rec.header.trajectory_id)))
                .collect::<Result<_, _>>()
                .unwrap();
            if let Some((last, _)) = batch.last() {
                cursor = *last;
                step += 1;
                seen += batch.len();
                reader_store
                    .mark_consumed(batch.iter().map(|(_, id)| id.as_str()), step)
                    .unwrap();
            }
        }
        seen
    });
    let finished = done_rx.recv_timeout(std::time::Duration::from_secs(120));
    assert!(
        finished.is_ok(),
        "the store deadlocked: {STREAMS} streams did not finish {PER_STREAM} trajectories each in 120 s"
    );
    stop_tx.send(()).unwrap();
    let seen = reader.join().unwrap();
    assert!(
        seen <= STREAMS * PER_STREAM,
        "the cursor read {seen} trajectories"
    );
    assert_eq!(store.finished_since(0).count(), STREAMS * PER_STREAM);
}

/// A store of `n` finished trajectories of a larger shape (a db file of a few MB), closed.
fn filled_store(dir: &tempfile::TempDir, n: usize) -> std::path::PathBuf {
    let store = open(dir);
    for i in 0..n {
        let id = format!("t{i}");
        let shape = Shape {
            steps: 8,
            tokens_per_step: 400,
        };
        let Begin::New(mut w) = store.begin(synthetic::header(&id, "hops", 1, 0)).unwrap() else {
            panic!("{id} already stored")
        };
        for (seq, step) in synthetic::steps(&id, shape).enumerate() {
            w.append(seq as u64, step).unwrap();
        }
        w.finish_blocking(synthetic::footer(&id, shape)).unwrap();
    }
    drop(store);
    dir.path().join("store")
}

/// A copy of the store folder `from` at `to`.
fn copy_store(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Set in a child process of this test binary: the store it opens.
const OPEN_CHILD_ENV: &str = "CORVID_OPEN_CHILD";

/// The child: opens the store named by [`OPEN_CHILD_ENV`], reads every trajectory in it and
/// prints one line (a no-op in a normal run): `OPENED n` when all `n` read back, `REFUSED`
/// with the error when the open was refused, `UNREADABLE` with the error when a store that
/// opened cannot be read whole.
#[test]
fn open_child() {
    let Ok(path) = std::env::var(OPEN_CHILD_ENV) else {
        return;
    };
    match TrajectoryStore::open(&path) {
        Ok(s) => match s.export_jsonl(&Filter::default(), &mut std::io::sink()) {
            Ok(read) => println!("OPENED {}", read.trajectories),
            Err(e) => println!("UNREADABLE {e}"),
        },
        Err(e) => println!("REFUSED {e}"),
    }
    // Exit now, as a CLI command would: a thread left unwinding through a half-recovered
    // sled may never finish, and the harness would wait for it.
    std::process::exit(0);
}

/// Opens the store `path` in a child process and returns its line. A damaged store is never
/// opened in this process: the store reports a sled panic at once, but the thread that
/// panicked may hang unwinding through sled's destructors, and a CLI command exits after the
/// error where this test process would keep it. The 60 s limit catches an open that hangs.
fn open_in_child(path: &std::path::Path) -> String {
    use std::io::Read;
    // Beside the store's folder, not in it: the test lists what the open left there.
    let stderr_path = path.with_extension("stderr");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["open_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(OPEN_CHILD_ENV, path)
        .env("RUST_BACKTRACE", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("opening {} did not finish in 60 s", path.display());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    // The harness prints `test open_child ... ` before the child's own line.
    out.lines()
        .find_map(|l| {
            let at = ["OPENED ", "REFUSED ", "UNREADABLE "]
                .iter()
                .find_map(|word| l.find(word))?;
            Some(l[at..].to_string())
        })
        .unwrap_or_else(|| {
            let err = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            panic!("the child opening {} said: {out}\n{err}", path.display())
        })
}

#[test]
fn a_truncated_store_is_refused_not_emptied() {
    let dir = tempfile::tempdir().unwrap();
    let path = filled_store(&dir, 150);
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path.join("corvid-finished.json")).unwrap())
            .unwrap();
    assert_eq!(record["finished_at_least"], 150, "{record}");
    assert_eq!(
        TrajectoryStore::open(&path)
            .unwrap()
            .stats()
            .unwrap()
            .finished,
        150,
        "it reopens as it was"
    );
    // Cut the log, as a failed copy or a full disk would, at several points. sled reads
    // some cuts as corruption and recovers others by dropping the tail (down to an empty
    // store): every one that loses data must be refused, naming the store.
    let len = std::fs::metadata(path.join("db")).unwrap().len();
    const SEGMENT: u64 = 512 << 10; // sled's segment size: cuts at a boundary recover silently
    let boundary = (len / 2 / SEGMENT).max(1) * SEGMENT;
    for (keep, snapshot) in [
        (len / 3, true),
        (len * 9 / 10, true),
        (SEGMENT, true),
        (boundary, true),
        (len / 3, false),
    ] {
        let copy = dir.path().join(format!("cut-{keep}-{snapshot}"));
        copy_store(&path, &copy);
        if !snapshot {
            // Without sled's snapshot the cut log is replayed from its start.
            for e in std::fs::read_dir(&copy).unwrap() {
                let p = e.unwrap().path();
                if p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("snap.")
                {
                    std::fs::remove_file(p).unwrap();
                }
            }
        }
        std::fs::OpenOptions::new()
            .write(true)
            .open(copy.join("db"))
            .unwrap()
            .set_len(keep)
            .unwrap();
        let line = open_in_child(&copy);
        let kept: Vec<u64> = std::fs::read_dir(&copy)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_name().to_string_lossy().starts_with("db.cut-"))
            .map(|e| e.metadata().unwrap().len())
            .collect();
        assert_eq!(
            kept,
            [keep],
            "the cut log is kept as it was before sled opened it"
        );
        if line == "OPENED 150" {
            // The cut took only free space at the log's tail (where sled's data sits varies
            // from run to run): nothing was lost.
            continue;
        }
        let Some(e) = line.strip_prefix("REFUSED ") else {
            panic!("a store cut to {keep} of {len} bytes: {line} of 150 trajectories");
        };
        assert!(e.contains(&copy.display().to_string()), "{e}");
        assert!(e.contains("damaged"), "{e}");
        if e.contains("at least 150 were acknowledged") {
            // Deleting the record accepts the loss: what is left opens.
            std::fs::remove_file(copy.join("corvid-finished.json")).unwrap();
            let line = open_in_child(&copy);
            let left: u64 = line
                .strip_prefix("OPENED ")
                .unwrap_or_else(|| panic!("{line}"))
                .parse()
                .unwrap();
            assert!(left < 150, "{left}");
        }
    }
}

#[test]
fn a_store_with_a_zeroed_block_is_reported_not_panicked_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = filled_store(&dir, 150);
    let db = path.join("db");
    let len = std::fs::metadata(&db).unwrap().len();
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new().write(true).open(&db).unwrap();
        f.seek(SeekFrom::Start(len / 2)).unwrap();
        f.write_all(&[0u8; 4096]).unwrap();
    }
    // Where sled's live data sits in the file varies from run to run: a block of free space
    // may be hit (then everything opens), otherwise the open is refused naming the store.
    // Never a panic, a hang or a store opened short.
    let line = open_in_child(&path);
    if line != "OPENED 150" {
        assert!(line.starts_with("REFUSED "), "{line}");
        assert!(line.contains(&path.display().to_string()), "{line}");
    }
}

/// The trainer reads with one cursor, the last finish position it saw: positions must
/// become visible in their own order, or a reader that polls while writers race steps past
/// a position that commits later and never reads that trajectory.
#[test]
fn a_single_cursor_reader_sees_every_trajectory_finished_by_racing_writers() {
    const WRITERS: usize = 4;
    const EACH: usize = 150;
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let reader = {
        let (store, done) = (Arc::clone(&store), Arc::clone(&done));
        std::thread::spawn(move || {
            let (mut cursor, mut seen) = (0u64, std::collections::HashSet::new());
            loop {
                let writers_done = done.load(std::sync::atomic::Ordering::Acquire) == WRITERS;
                for r in store.finished_since(cursor) {
                    let (seq, rec) = r.unwrap();
                    cursor = seq;
                    seen.insert(rec.header.trajectory_id);
                }
                if writers_done {
                    return seen;
                }
            }
        })
    };
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (store, done) = (Arc::clone(&store), Arc::clone(&done));
            std::thread::spawn(move || {
                for i in 0..EACH {
                    write(&store, &format!("w{w}-{i}"), "hops", 1, 1);
                }
                done.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let seen = reader.join().unwrap();
    let missed: Vec<String> = (0..WRITERS)
        .flat_map(|w| (0..EACH).map(move |i| format!("w{w}-{i}")))
        .filter(|id| !seen.contains(id))
        .collect();
    assert!(
        missed.is_empty(),
        "the cursor stepped past {} of {} trajectories: {:?}",
        missed.len(),
        WRITERS * EACH,
        &missed[..missed.len().min(5)]
    );
}

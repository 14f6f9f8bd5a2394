//! The adversarial suite: every case of `shared/research/sandbox_anchors.md`
//! §10 plus a host-environment canary. Each test asserts containment and that
//! the next call in the same process (and workspace) still works.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::time::{Duration, Instant};

use common::*;
use corvid_proto::ToolStatus;
use corvid_sandbox::{
    CustomTool, Entry, Limits, Mount, MountSource, Sandbox, SandboxError, Workspace, WorkspaceSpec,
};
use serde_json::json;

/// A file next to (outside) the workspace that no call may read or change.
fn plant_outside(ws: &Workspace) -> std::path::PathBuf {
    let p = ws.host_path().parent().expect("root").join("outside.txt");
    std::fs::write(&p, "OUTSIDE-SECRET").expect("write outside");
    p
}

fn with_data(files: &[(&str, &str)], data: &[(&str, &str)]) -> Workspace {
    let mut spec = WorkspaceSpec::with_files(
        files
            .iter()
            .map(|(p, c)| (p.to_string(), c.as_bytes().to_vec())),
    );
    spec.mounts.push(Mount {
        name: "data".into(),
        source: MountSource::Files(
            data.iter()
                .map(|(p, c)| (p.to_string(), c.as_bytes().to_vec()))
                .collect(),
        ),
    });
    Workspace::create(spec).expect("workspace")
}

// ------------------------------------------------------------ 1. traversal

#[test]
fn path_traversal_in_all_forms_is_refused() {
    let mut w = ws(&[("a/x.txt", "inside")]);
    let outside = plant_outside(&w);
    let deep = format!("{}outside.txt", "../".repeat(50));
    let forms = [
        "../outside.txt",
        "/etc/passwd",
        "/workspace/../outside.txt",
        "/workspace/a/../../outside.txt",
        deep.as_str(),
    ];
    for p in forms {
        let o = tool(&mut w, "read_file", json!({ "path": p }));
        assert_eq!(
            o.result.status,
            ToolStatus::PermissionDenied,
            "{p}: {}",
            o.text
        );
        assert!(!o.text.contains("OUTSIDE-SECRET") && !o.text.contains("root:"));
        assert_clean(&w, &o);
        let o = tool(
            &mut w,
            "write_file",
            json!({ "path": p, "content": "pwned" }),
        );
        assert_eq!(
            o.result.status,
            ToolStatus::PermissionDenied,
            "{p}: {}",
            o.text
        );
        let o = sh(&mut w, &format!("cat {p}"));
        assert!(
            !o.text.contains("OUTSIDE-SECRET") && !o.text.contains("root:"),
            "{}",
            o.text
        );
        assert_ne!(o.result.status, ToolStatus::Ok);
        let o = sh(&mut w, &format!("echo pwned > {p}"));
        assert_ne!(o.result.status, ToolStatus::Ok, "{p}: {}", o.text);
        assert_clean(&w, &o);
    }
    let o = adv(
        &mut w,
        "adversary",
        &[
            "read",
            "../outside.txt",
            "/workspace/../outside.txt",
            "/outside.txt",
            "/etc/passwd",
        ],
    );
    assert!(!o.stdout.contains("read "), "{}", o.stdout);
    // Staying inside with `..` is fine.
    let o = tool(&mut w, "read_file", json!({ "path": "a/../a/x.txt" }));
    assert_eq!(o.text, "inside\n");
    assert_eq!(
        std::fs::read_to_string(&outside).expect("outside"),
        "OUTSIDE-SECRET"
    );
    assert_alive(&mut w);
}

// ------------------------------------------------------------ 2. host-planted symlinks

#[test]
fn host_planted_absolute_and_relative_symlinks_are_not_followed_out() {
    let mut w = ws(&[("in.txt", "inside")]);
    let outside = plant_outside(&w);
    let h = w.host_path().to_path_buf();
    symlink(&outside, h.join("abs")).expect("symlink");
    symlink("../outside.txt", h.join("rel")).expect("symlink");
    symlink("..", h.join("up")).expect("symlink");
    symlink("/", h.join("root")).expect("symlink");
    symlink("in.txt", h.join("ok")).expect("symlink");
    for p in ["abs", "rel", "up/outside.txt", "root/etc/passwd"] {
        let o = tool(&mut w, "read_file", json!({ "path": p }));
        assert_eq!(
            o.result.status,
            ToolStatus::PermissionDenied,
            "{p}: {}",
            o.text
        );
        assert_clean(&w, &o);
        let o = tool(&mut w, "write_file", json!({ "path": p, "content": "x" }));
        assert_ne!(o.result.status, ToolStatus::Ok, "{p}: {}", o.text);
        let o = sh(&mut w, &format!("cat {p}; echo x > {p}"));
        assert!(!o.text.contains("OUTSIDE-SECRET") && !o.text.contains("root:"));
    }
    for p in ["up", "root"] {
        let o = tool(&mut w, "list_dir", json!({ "path": p }));
        assert_ne!(o.result.status, ToolStatus::Ok, "{p}: {}", o.text);
        let o = sh(&mut w, &format!("ls {p}/"));
        assert!(
            !o.text.contains("outside.txt") && !o.text.contains("etc"),
            "{}",
            o.text
        );
    }
    let o = adv(
        &mut w,
        "adversary",
        &["readdir", "up", "root", "/workspace/up"],
    );
    assert!(
        o.stdout.lines().all(|l| l.contains("error")),
        "{}",
        o.stdout
    );
    // A symlink that stays inside works for host tools.
    assert_eq!(
        tool(&mut w, "read_file", json!({ "path": "ok" })).text,
        "inside\n"
    );
    assert_eq!(
        std::fs::read_to_string(&outside).expect("outside"),
        "OUTSIDE-SECRET"
    );
    assert_alive(&mut w);
}

// ------------------------------------------------------------ 3. guest-created symlinks

#[test]
fn guest_created_escape_symlink_is_never_followed_by_guest_or_host() {
    let mut w = ws(&[]);
    let outside = plant_outside(&w);
    let o = adv(&mut w, "adversary", &["symlink", "../../..", "esc"]);
    assert!(o.stdout.contains("symlink:"), "{}", o.stdout);
    let o = adv(&mut w, "adversary", &["symlink", "../outside.txt", "esc2"]);
    assert!(o.stdout.contains("symlink:"));
    for p in ["esc/etc/passwd", "esc2"] {
        let o = sh(&mut w, &format!("cat {p}"));
        assert_ne!(o.result.status, ToolStatus::Ok);
        let o = tool(&mut w, "read_file", json!({ "path": p }));
        assert_ne!(o.result.status, ToolStatus::Ok, "{}", o.text);
        let o = tool(
            &mut w,
            "write_file",
            json!({ "path": p, "content": "pwned" }),
        );
        assert_ne!(o.result.status, ToolStatus::Ok, "{}", o.text);
    }
    // The host's snapshot and usage walk record the links without following them.
    let snap = w.snapshot().expect("snapshot");
    for (p, e) in &snap.entries {
        assert!(
            matches!(e, Entry::Symlink(_)) || !p.starts_with("esc"),
            "{p} followed"
        );
    }
    assert!(snap.entries.keys().all(|k| !k.contains("passwd")));
    assert!(w.read("esc2").is_err());
    assert_eq!(
        std::fs::read_to_string(&outside).expect("outside"),
        "OUTSIDE-SECRET"
    );
    assert_alive(&mut w);
}

// ------------------------------------------------------------ 4. trailing slashes

#[test]
fn trailing_slash_tricks_do_not_escape() {
    let mut w = ws(&[]);
    let outside = plant_outside(&w);
    let root = w.host_path().parent().expect("root").to_path_buf();
    std::fs::create_dir_all(root.join("odir")).expect("mkdir");
    std::fs::write(root.join("odir/f"), "OUTSIDE-SECRET").expect("write");
    let h = w.host_path().to_path_buf();
    symlink("../odir/", h.join("slashlink")).expect("symlink");
    symlink(root.join("odir/"), h.join("abslash")).expect("symlink");
    let o = adv(&mut w, "adversary", &["symlink", "../odir/", "guestslash"]);
    assert!(o.stdout.contains("symlink:"));
    for p in [
        "slashlink/",
        "slashlink//f",
        "slashlink/./f",
        "abslash/f",
        "guestslash/f",
        "guestslash//",
    ] {
        let o = tool(&mut w, "read_file", json!({ "path": p }));
        assert_ne!(o.result.status, ToolStatus::Ok, "{p}: {}", o.text);
        let o = sh(&mut w, &format!("cat {p}; ls {p}; echo pwned > {p}"));
        assert!(!o.text.contains("OUTSIDE-SECRET"), "{p}: {}", o.text);
        let o = adv(&mut w, "adversary", &["read", p]);
        assert!(!o.stdout.contains(": read "), "{p}: {}", o.stdout);
        let o = adv(&mut w, "adversary", &["write", p]);
        assert!(!o.stdout.contains(": wrote"), "{p}: {}", o.stdout);
    }
    assert_eq!(
        std::fs::read_to_string(root.join("odir/f")).expect("f"),
        "OUTSIDE-SECRET"
    );
    assert_eq!(
        std::fs::read_dir(root.join("odir")).expect("odir").count(),
        1
    );
    assert_eq!(
        std::fs::read_to_string(&outside).expect("outside"),
        "OUTSIDE-SECRET"
    );
    assert_alive(&mut w);
}

// ------------------------------------------------------------ 5. read-only mounts

#[test]
fn read_only_mount_bypasses_truncate_link_rename_are_refused() {
    let mut w = with_data(&[], &[("ro.txt", "READ-ONLY-BYTES")]);
    let o = adv(&mut w, "adversary", &["ro-attacks", "ro.txt"]);
    for l in o.stdout.lines() {
        assert!(
            !l.ends_with(": ok"),
            "read-only bypass succeeded: {l}\n{}",
            o.stdout
        );
    }
    assert!(
        o.stdout.contains("link_ro_to_rw") && o.stdout.contains("rename_ro_to_rw"),
        "{}",
        o.stdout
    );
    let names: Vec<String> = w.snapshot().expect("snap").entries.into_keys().collect();
    assert!(names.is_empty(), "{names:?} {}", o.stdout);
    for cmd in [
        "echo x > /data/ro.txt",
        "rm /data/ro.txt",
        "mv /data/ro.txt /workspace/",
        "touch /data/new",
        "mkdir /data/d",
    ] {
        let o = sh(&mut w, cmd);
        assert_ne!(o.result.status, ToolStatus::Ok, "{cmd}: {}", o.text);
    }
    let o = tool(
        &mut w,
        "write_file",
        json!({ "path": "/data/ro.txt", "content": "x" }),
    );
    assert_eq!(o.result.status, ToolStatus::PermissionDenied);
    // The read-only workspace variant of a custom tool cannot write either.
    let o = adv(&mut w, "adversary_ro", &["write", "/workspace/new.txt"]);
    assert!(o.stdout.contains("error"), "{}", o.stdout);
    let o = sh(&mut w, "cat /data/ro.txt");
    assert_eq!(o.text, "READ-ONLY-BYTES");
    let o = tool(&mut w, "read_file", json!({ "path": "/data/ro.txt" }));
    assert_eq!(o.text, "READ-ONLY-BYTES\n");
    assert_alive(&mut w);
}

// ------------------------------------------------------------ 6. loops and depth

#[test]
fn symlink_loops_and_deep_directories_are_bounded() {
    let mut w = ws(&[]);
    let h = w.host_path().to_path_buf();
    symlink("b", h.join("a")).expect("symlink");
    symlink("a", h.join("b")).expect("symlink");
    let t = Instant::now();
    assert_ne!(sh(&mut w, "cat a").result.status, ToolStatus::Ok);
    assert_ne!(
        tool(&mut w, "read_file", json!({"path": "a"}))
            .result
            .status,
        ToolStatus::Ok
    );
    assert_ne!(
        tool(&mut w, "write_file", json!({"path": "a", "content": "x"}))
            .result
            .status,
        ToolStatus::Ok
    );
    let deep = vec!["d"; 1000].join("/");
    let o = sh(&mut w, &format!("mkdir -p {deep}"));
    assert!(
        matches!(o.result.status, ToolStatus::Ok | ToolStatus::ExitNonzero),
        "{}",
        o.text
    );
    let _ = sh(&mut w, "find . -type d | wc -l");
    assert!(w.snapshot().is_ok());
    assert!(w.usage().is_ok());
    assert!(t.elapsed() < Duration::from_secs(20));
    assert_alive(&mut w);
}

// ------------------------------------------------------------ 7. NUL and control characters

#[test]
fn nul_control_and_bidi_characters_in_paths_are_rejected_before_any_syscall() {
    let mut w = ws(&[("a", "x")]);
    for p in [
        "a\u{0}b",
        "a\nb",
        "a\u{1b}[31m",
        "\u{202e}txt.exe",
        "x\u{2066}y",
    ] {
        for t in ["read_file", "list_dir"] {
            let o = tool(&mut w, t, json!({ "path": p }));
            assert_eq!(
                o.result.status,
                ToolStatus::InvalidCall,
                "{t} {p:?}: {}",
                o.text
            );
            assert!(!o.text.contains('\u{0}') && !o.text.contains('\u{1b}'));
        }
        let o = tool(&mut w, "write_file", json!({ "path": p, "content": "x" }));
        assert_eq!(o.result.status, ToolStatus::InvalidCall);
    }
    let o = sh(&mut w, "cat a\u{0}b");
    assert_eq!(o.result.status, ToolStatus::InvalidCall);
    let o = adv(&mut w, "adversary", &["read", "a\u{0}b"]);
    assert_eq!(o.result.status, ToolStatus::InvalidCall);
    assert_eq!(w.snapshot().expect("snap").entries.len(), 1);
    assert_alive(&mut w);
}

// ------------------------------------------------------------ 8. timestamps

#[test]
fn extreme_timestamps_do_not_panic_the_host() {
    let mut w = ws(&[("t.txt", "x")]);
    let o = adv(&mut w, "adversary", &["times", "t.txt"]);
    assert!(o.stdout.contains("set_times"), "{}", o.text);
    assert!(o.result.status != ToolStatus::InfraError);
    assert!(sh(&mut w, "ls -l").text.contains("t.txt"));
    assert!(w.snapshot().is_ok());
    assert_alive(&mut w);
}

// ------------------------------------------------------------ 9. readdir

#[test]
fn readdir_returns_exactly_the_entries_sorted() {
    let names = ["zeta", "alpha", "Beta", "m.txt", "dir/x"];
    let files: Vec<(&str, &str)> = names.iter().map(|n| (*n, "1")).collect();
    let mut w = ws(&files);
    let o = adv(
        &mut w,
        "adversary",
        &["readdir", "/workspace", "/workspace/dir"],
    );
    assert_eq!(
        o.stdout,
        "/workspace: Beta,alpha,dir,m.txt,zeta\n/workspace/dir: x\n"
    );
    assert_eq!(sh(&mut w, "ls").text, "Beta\nalpha\ndir\nm.txt\nzeta\n");
    let o = tool(&mut w, "list_dir", json!({}));
    assert_eq!(
        o.text,
        "Beta  (1 bytes)\nalpha  (1 bytes)\ndir/\nm.txt  (1 bytes)\nzeta  (1 bytes)\n"
    );
    assert_alive(&mut w);
}

// ------------------------------------------------------------ 10. no host paths in errors

#[test]
fn error_text_contains_only_guest_visible_paths() {
    let mut w = ws(&[("f", "x")]);
    let calls: Vec<(&str, serde_json::Value)> = vec![
        ("read_file", json!({"path": "missing/x"})),
        ("read_file", json!({"path": "/"})),
        ("read_file", json!({"path": "/workspace"})),
        ("list_dir", json!({"path": "f"})),
        ("write_file", json!({"path": "f/g", "content": "x"})),
        (
            "shell",
            json!({"command": "cat nope; ls /nope; cd /etc; grep x nope; pwd"}),
        ),
        (
            "shell",
            json!({"command": "sed 's/[/x/' f; sort -k 0 f; cut f; nosuch"}),
        ),
        ("adversary", json!({"args": ["panic"]})),
        (
            "adversary",
            json!({"args": ["read", "/proc/self/environ", "/etc/hostname"]}),
        ),
        ("nosuchtool", json!({})),
        ("read_file", json!({"path": 3})),
    ];
    for (t, a) in calls {
        let o = tool(&mut w, t, a);
        assert_clean(&w, &o);
        assert!(!o.text.contains(w.host_path().to_string_lossy().as_ref()));
    }
    let o = sh(&mut w, "pwd");
    assert_eq!(o.text, "/workspace\n");
    assert_alive(&mut w);
}

// ------------------------------------------------------------ 11–12. CPU

#[test]
fn infinite_loop_ends_in_compute_budget_then_timeout_without_fuel() {
    let mut w = ws(&[]);
    let o = adv(&mut w, "adversary", &["loop"]);
    assert_eq!(o.result.status, ToolStatus::ComputeBudget, "{}", o.text);
    assert!(o.result.fuel_used >= Limits::default().fuel);
    let t = Instant::now();
    let o = adv(&mut w, "adversary_slow", &["loop"]);
    assert_eq!(o.result.status, ToolStatus::Timeout, "{}", o.text);
    // Deadline 30 ticks × 10 ms, plus one tick and scheduling slack.
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    assert_alive(&mut w);
}

#[test]
fn bulk_memory_loop_is_still_interrupted() {
    let mut w = ws(&[]);
    let t = Instant::now();
    let o = adv(&mut w, "adversary_slow", &["memfill"]);
    assert!(
        matches!(
            o.result.status,
            ToolStatus::Timeout | ToolStatus::ComputeBudget
        ),
        "{}",
        o.text
    );
    // The deadline is 0.3 s; the bound is loose because CI machines are shared.
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let o = adv(&mut w, "adversary", &["memfill"]);
    assert!(
        matches!(
            o.result.status,
            ToolStatus::Timeout | ToolStatus::ComputeBudget
        ),
        "{}",
        o.text
    );
    assert_alive(&mut w);
}

// ------------------------------------------------------------ 13–14. memory and stack

#[test]
fn memory_growth_ends_in_memory_limit() {
    let mut w = ws(&[]);
    for case in ["grow", "grow-small"] {
        let o = adv(&mut w, "adversary", &[case]);
        assert_eq!(
            o.result.status,
            ToolStatus::MemoryLimit,
            "{case}: {}",
            o.text
        );
        assert!(o.text.contains("memory_limit"));
    }
    assert_alive(&mut w);
}

#[test]
fn unbounded_recursion_ends_in_stack_overflow_as_memory_limit() {
    let mut w = ws(&[]);
    let t = Instant::now();
    let o = adv(&mut w, "adversary", &["recurse"]);
    assert_eq!(o.result.status, ToolStatus::MemoryLimit, "{}", o.text);
    assert!(o.text.contains("stack"));
    assert!(t.elapsed() < Duration::from_secs(2));
    // Rust keeps big locals on a shadow stack in linear memory; overflowing
    // it is an out-of-bounds trap inside the guest: a crash, contained.
    let o = adv(&mut w, "adversary", &["recurse-shadow"]);
    assert_eq!(
        (o.result.status, o.result.exit_code),
        (ToolStatus::ExitNonzero, corvid_sandbox::EXIT_CRASHED),
        "{}",
        o.text
    );
    assert_alive(&mut w);
}

// ------------------------------------------------------------ 15. output flood

#[test]
fn output_flood_is_capped_and_truncated_for_display() {
    let mut w = ws(&[]);
    let t = Instant::now();
    let o = adv(&mut w, "adversary", &["spew"]);
    assert_eq!(
        o.result.status,
        ToolStatus::OutputTruncated,
        "{}",
        &o.text[o.text.len().saturating_sub(300)..]
    );
    assert_eq!(o.stdout.len(), 1 << 20);
    assert!(o.text.len() < (16 << 10) + 512);
    assert!(o.text.contains("bytes truncated"));
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let o = adv(&mut w, "adversary", &["spew-err"]);
    assert!(o.stderr.len() <= 64 << 10);
    assert!(o.text.len() < (16 << 10) + 512);
    let o = sh(&mut w, "seq 1 10000000");
    assert!(
        matches!(
            o.result.status,
            ToolStatus::OutputTruncated | ToolStatus::ComputeBudget
        ),
        "{:?}",
        o.result
    );
    assert_alive(&mut w);
}

// ------------------------------------------------------------ 16. disk and inodes

#[test]
fn disk_and_inode_floods_hit_the_quota_and_stay_per_episode() {
    let mut w = ws(&[]);
    let mut other = ws(&[("keep.txt", "ok")]);
    // Either the post-call check sees the quota crossed, or the wall-clock
    // deadline stops the writer first (slow disks); never silently over.
    let o = adv(&mut w, "adversary", &["bigfile", "100"]);
    let used = w.usage().expect("usage");
    if used.bytes > w.quota().max_bytes {
        assert_eq!(o.result.status, ToolStatus::QuotaExceeded, "{}", o.text);
        assert!(o.text.contains("quota_exceeded"));
    } else {
        assert_eq!(o.result.status, ToolStatus::Timeout, "{}", o.text);
    }
    let o = sh(&mut w, "rm big.bin");
    assert_eq!(
        o.result.status,
        ToolStatus::Ok,
        "{} {:?}",
        o.text,
        w.usage()
    );
    let o = adv(&mut w, "adversary", &["manyfiles", "12000"]);
    let used = w.usage().expect("usage");
    if used.inodes > w.quota().max_inodes {
        assert_eq!(o.result.status, ToolStatus::QuotaExceeded, "{}", o.text);
        let o = tool(
            &mut w,
            "write_file",
            json!({"path": "more.txt", "content": "x"}),
        );
        assert_eq!(o.result.status, ToolStatus::QuotaExceeded);
    } else {
        assert_eq!(o.result.status, ToolStatus::Timeout, "{}", o.text);
    }
    // Doubling a file with the shell is cut by the toolbox's redirect cap or the quota.
    let mut w2 = ws(&[]);
    let o = sh(&mut w2, "seq 1 200000 > a; cat a a a a a a a a > b; cat b b b b b b b b > a; cat a a a a a a a a > b");
    assert!(
        matches!(
            o.result.status,
            ToolStatus::QuotaExceeded
                | ToolStatus::ExitNonzero
                | ToolStatus::ComputeBudget
                | ToolStatus::Timeout
        ),
        "{:?} {}",
        o.result,
        o.text
    );
    assert_alive(&mut w2);
    assert_eq!(sh(&mut other, "cat keep.txt").text, "ok");
    // The flooded episode still runs commands, and deletes its way back under
    // quota within one call: the toolbox lists a directory in a few large
    // fd_readdir calls (wasmtime re-lists the whole directory on each one, so
    // std's 4 KiB readdir made `rm -r` of 12,000 entries take ~5 s).
    let o = sh(&mut w, "echo alive");
    assert_eq!(o.stdout, "alive\n", "{}", o.text);
    let t = Instant::now();
    let o = sh(&mut w, "rm -r many");
    assert_eq!(
        o.result.status,
        ToolStatus::Ok,
        "{} {:?} after {:?}",
        o.text,
        w.usage(),
        t.elapsed()
    );
    let used = w.usage().expect("usage");
    assert_eq!((used.inodes, used.bytes), (0, 0));
    assert_eq!(sh(&mut w, "ls").stdout, "");
    let o = tool(
        &mut w,
        "write_file",
        json!({"path": "more.txt", "content": "x"}),
    );
    assert_eq!(o.result.status, ToolStatus::Ok, "{}", o.text);
    assert_eq!(sh(&mut w, "cat more.txt").stdout, "x");
    assert_alive(&mut w);
    assert_alive(&mut other);
}

// ------------------------------------------------------------ 17. randomness

/// The quota check skips its walk when inotify saw no change; every way a
/// guest can add bytes or entries after a skipped walk must still be caught.
#[test]
fn quota_is_enforced_after_calls_whose_walk_was_skipped() {
    let spec = |files: &[(&str, &str)]| {
        let mut s = WorkspaceSpec::with_files(
            files
                .iter()
                .map(|(p, c)| (p.to_string(), c.as_bytes().to_vec())),
        );
        s.quota = corvid_sandbox::Quota {
            max_bytes: 4096,
            max_inodes: 8,
        };
        Workspace::create(s).expect("workspace")
    };
    let mut w = spec(&[("a.txt", "abc")]);
    for _ in 0..3 {
        assert_eq!(sh(&mut w, "cat a.txt").result.status, ToolStatus::Ok);
    }
    // Content growth of an existing file, in a directory made by an earlier call.
    assert_eq!(sh(&mut w, "mkdir -p d/e").result.status, ToolStatus::Ok);
    assert_eq!(sh(&mut w, "cat a.txt").result.status, ToolStatus::Ok);
    assert_eq!(sh(&mut w, "echo hi > d/e/f").result.status, ToolStatus::Ok);
    let o = sh(&mut w, "seq 1 2000 >> d/e/f");
    assert_eq!(o.result.status, ToolStatus::QuotaExceeded, "{}", o.text);
    // Still over on a read-only command (cached usage, no walk), then back under.
    assert_eq!(
        sh(&mut w, "cat a.txt").result.status,
        ToolStatus::QuotaExceeded
    );
    assert_eq!(sh(&mut w, "rm d/e/f").result.status, ToolStatus::Ok);
    assert_eq!(sh(&mut w, "cat a.txt").result.status, ToolStatus::Ok);
    // Entries: renamed directories keep being watched.
    assert_eq!(sh(&mut w, "mv d d2").result.status, ToolStatus::Ok);
    let o = sh(&mut w, "touch d2/e/1 d2/e/2 d2/e/3 d2/e/4 d2/e/5 d2/e/6");
    assert_eq!(o.result.status, ToolStatus::QuotaExceeded, "{}", o.text);
    // A custom WASI module's writes count the same way.
    let mut w = spec(&[]);
    assert_eq!(sh(&mut w, "true").result.status, ToolStatus::Ok);
    let o = adv(&mut w, "adversary", &["bigfile", "1"]);
    assert_eq!(o.result.status, ToolStatus::QuotaExceeded, "{}", o.text);
    assert_eq!(w.usage().expect("usage").bytes, 1 << 20);
    assert_eq!(sh(&mut w, "rm big.bin").result.status, ToolStatus::Ok);
    assert_alive(&mut w);
}

#[test]
fn huge_random_request_is_bounded() {
    let mut w = ws(&[]);
    let o = adv(&mut w, "adversary", &["random", "1073741824"]);
    assert!(!o.stdout.contains("random_get: ok"), "{}", o.text);
    let o = adv(&mut w, "adversary", &["random", "4096"]);
    assert!(o.stdout.contains("random_get: ok"), "{}", o.text);
    assert_alive(&mut w);
}

// ------------------------------------------------------------ 18. sleep

#[test]
fn sleep_fails_fast_instead_of_parking_the_worker() {
    let mut w = ws(&[]);
    let t = Instant::now();
    let o = adv(&mut w, "adversary", &["sleep"]);
    assert!(o.stdout.contains("poll_oneoff: errno 58"), "{}", o.text);
    let o = adv(&mut w, "adversary", &["std-sleep"]);
    assert_ne!(o.result.status, ToolStatus::Ok);
    assert!(!o.stdout.contains("slept"));
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_alive(&mut w);
}

// ------------------------------------------------------------ 19. fds

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
fn fd_exhaustion_is_bounded_and_leaks_nothing() {
    let mut w = ws(&[]);
    let _ = adv(&mut w, "adversary", &["fds", "10"]);
    let before = open_fds();
    let o = adv(&mut w, "adversary", &["fds", "10000"]);
    assert!(
        o.stdout.contains("opened") || o.stdout.contains("open failed"),
        "{}",
        o.text
    );
    let after = open_fds();
    // Other tests run in parallel threads and open files too: allow slack,
    // but 10 000 leaked descriptors would show.
    assert!(after < before + 200, "fds before {before}, after {after}");
    assert_alive(&mut w);
}

// ------------------------------------------------------------ 20. modules

#[test]
fn oversized_garbage_and_foreign_import_modules_are_rejected_at_registration() {
    let huge = CustomTool {
        wasm: vec![0u8; 17 << 20],
        ..adversary_tool("huge", Limits::default(), false)
    };
    assert!(matches!(
        Sandbox::builder().custom_tool(huge).build(),
        Err(SandboxError::CustomTool { .. })
    ));
    let garbage = CustomTool {
        wasm: b"\0asm garbage".to_vec(),
        ..adversary_tool("garbage", Limits::default(), false)
    };
    assert!(matches!(
        Sandbox::builder().custom_tool(garbage).build(),
        Err(SandboxError::Module { .. })
    ));
    let bad_name = adversary_tool("shell", Limits::default(), false);
    assert!(matches!(
        Sandbox::builder().custom_tool(bad_name).build(),
        Err(SandboxError::CustomTool { .. })
    ));
    let bad_limits = adversary_tool(
        "x",
        Limits {
            memory_bytes: 1 << 40,
            ..Limits::default()
        },
        false,
    );
    assert!(matches!(
        Sandbox::builder().custom_tool(bad_limits).build(),
        Err(SandboxError::Limit { .. })
    ));
    let mut w = ws(&[]);
    assert_alive(&mut w);
}

// ------------------------------------------------------------ 21–22. env, argv, canary

#[test]
fn host_environment_canary_never_reaches_any_tool_output() {
    // SAFETY (edition 2021): set once; no other test reads this variable.
    std::env::set_var("SANDBOX_CANARY_7f3a", "CANARY-VALUE-91c2");
    let mut w = ws(&[]);
    let outs = vec![
        adv(&mut w, "adversary", &["env"]),
        sh(
            &mut w,
            "echo $SANDBOX_CANARY_7f3a ${SANDBOX_CANARY_7f3a} \"$HOME\"",
        ),
        adv(&mut w, "adversary", &["read", "/proc/self/environ"]),
        sh(&mut w, "grep -r CANARY / ; grep -r CANARY ."),
    ];
    for o in &outs {
        assert!(
            !o.text.contains("CANARY-VALUE") && !o.stdout.contains("CANARY-VALUE"),
            "{}",
            o.text
        );
    }
    assert_eq!(outs[1].text, "/workspace\n");
    assert_alive(&mut w);
}

#[test]
fn env_and_argv_show_only_the_allow_list() {
    let mut w = ws(&[]);
    let o = adv(&mut w, "adversary", &["env", "x y"]);
    assert_eq!(
        o.stdout,
        "HOME=/workspace\nPWD=/workspace\nLANG=C.UTF-8\narg adversary\narg env\narg x y\n"
    );
    assert_alive(&mut w);
}

// ------------------------------------------------------------ 23. cross-episode leakage

#[test]
fn reused_pool_slot_leaks_nothing_across_episodes() {
    // One slot: episode B must land on the slot episode A just used.
    let sb = Sandbox::builder()
        .pool_slots(1)
        .custom_tool(adversary_tool("adversary", Limits::default(), true))
        .build()
        .expect("sandbox");
    let mut a = ws(&[]);
    let o = sb.call(
        &mut a,
        "adversary",
        &json!({"args": ["secret-write"]}).to_string(),
    );
    assert_eq!(o.stdout, "planted\n");
    let o = sb.call(
        &mut a,
        "shell",
        &json!({"command": "echo SECRET-FILE > s.txt"}).to_string(),
    );
    assert_eq!(o.result.status, ToolStatus::Ok);
    drop(a);
    let mut b = ws(&[]);
    let o = sb.call(
        &mut b,
        "adversary",
        &json!({"args": ["secret-scan"]}).to_string(),
    );
    assert_eq!(o.stdout, "found=false dirty=false\n", "{}", o.text);
    let o = sb.call(
        &mut b,
        "shell",
        &json!({"command": "grep -r SECRET . ; ls"}).to_string(),
    );
    assert!(!o.text.contains("SECRET-FILE"));
    assert_alive(&mut b);
}

// ------------------------------------------------------------ 24–26. network, escapes, exits

#[test]
fn no_socket_can_be_used() {
    let mut w = ws(&[]);
    let o = adv(&mut w, "adversary", &["sock"]);
    assert!(
        o.stdout.lines().count() == 8 && o.stdout.lines().all(|l| l.contains("errno")),
        "{}",
        o.stdout
    );
    assert_eq!(sh(&mut w, "curl http://example.com").result.exit_code, 127);
    assert_alive(&mut w);
}

#[test]
fn ansi_escapes_reach_the_model_as_inert_text() {
    let mut w = ws(&[]);
    let o = adv(&mut w, "adversary", &["ansi"]);
    assert!(
        !o.text.contains('\u{1b}') && !o.text.contains('\u{7}'),
        "{:?}",
        o.text
    );
    assert!(o.text.contains("\\x1b[31m"));
    assert_alive(&mut w);
}

#[test]
fn exit_codes_at_and_above_126_are_mapped_and_panics_are_tool_errors() {
    let mut w = ws(&[]);
    for code in [0, 1, 125, 126, 127, 200, 255] {
        let o = adv(&mut w, "adversary", &["exit", &code.to_string()]);
        assert_eq!(o.result.exit_code, code);
        let want = if code == 0 {
            ToolStatus::Ok
        } else {
            ToolStatus::ExitNonzero
        };
        assert_eq!(o.result.status, want, "{code}: {}", o.text);
    }
    let o = sh(&mut w, "no-such-command");
    assert_eq!(
        (o.result.status, o.result.exit_code),
        (ToolStatus::ExitNonzero, 127)
    );
    assert!(o.text.contains("command not found") && o.text.ends_with("[exit code 127]"));
    let o = sh(&mut w, "no-such-command; echo $?");
    assert!(o.text.contains("127\n"));
    let o = adv(&mut w, "adversary", &["panic"]);
    assert_eq!(
        (o.result.status, o.result.exit_code),
        (ToolStatus::ExitNonzero, corvid_sandbox::EXIT_CRASHED)
    );
    assert_clean(&w, &o);
    assert_alive(&mut w);
}

// ------------------------------------------------------------ 27. determinism

fn episode(seed: u64) -> Vec<String> {
    let mut spec = WorkspaceSpec::with_files([("b.txt", "2\n1\n"), ("a/c.txt", "x")]);
    spec.seed = seed;
    let mut w = Workspace::create(spec).expect("ws");
    let mut texts = Vec::new();
    for (t, a) in [
        (
            "shell",
            json!({"command": "ls -l; find . | sort; sort -n b.txt; echo $?"}),
        ),
        ("adversary", json!({"args": ["random-print"]})),
        ("list_dir", json!({"path": "a"})),
        (
            "shell",
            json!({"command": "seq 3 | tr 1 x > o.txt; cat o.txt; wc -c o.txt"}),
        ),
        ("adversary", json!({"args": ["random-print"]})),
    ] {
        let o = sandbox().call(&mut w, t, &a.to_string());
        texts.push(format!(
            "{:?} {} {}",
            o.result.status, o.result.fuel_used, o.text
        ));
    }
    texts
}

#[test]
fn same_task_and_seed_give_byte_identical_outputs() {
    let (a, b, c) = (episode(7), episode(7), episode(8));
    assert_eq!(a, b);
    assert_ne!(
        a[1], c[1],
        "different seeds should give different randomness"
    );
    assert_ne!(a[1], a[4], "successive calls draw fresh randomness");
    let mut w = ws(&[]);
    assert_alive(&mut w);
}

// ------------------------------------------------------------ 29. pool exhaustion

#[test]
fn more_concurrent_calls_than_pool_slots_queue_instead_of_failing() {
    let sb = Sandbox::builder().pool_slots(2).build().expect("sandbox");
    std::thread::scope(|s| {
        for i in 0..8 {
            let sb = sb.clone();
            s.spawn(move || {
                let mut w = ws(&[("f", "hello\n")]);
                for _ in 0..5 {
                    let o = sb.call(
                        &mut w,
                        "shell",
                        &json!({"command": format!("cat f; echo {i}")}).to_string(),
                    );
                    assert_eq!(o.result.status, ToolStatus::Ok, "{}", o.text);
                    assert_eq!(o.text, format!("hello\n{i}\n"));
                }
            });
        }
    });
    let mut w = ws(&[]);
    assert_alive(&mut w);
}

// ------------------------------------------------------------ call contract

#[test]
fn malformed_calls_are_classified_not_crashed() {
    let mut w = ws(&[]);
    let cases: Vec<(&str, String, ToolStatus)> = vec![
        ("nope", "{}".into(), ToolStatus::UnknownTool),
        ("shell", "not json".into(), ToolStatus::InvalidCall),
        ("shell", "[1,2]".into(), ToolStatus::InvalidCall),
        ("shell", "{}".into(), ToolStatus::InvalidCall),
        ("shell", r#"{"command": 5}"#.into(), ToolStatus::InvalidCall),
        (
            "shell",
            r#"{"command": "ls", "extra": 1}"#.into(),
            ToolStatus::InvalidCall,
        ),
        (
            "read_file",
            r#"{"path": "x", "offset": -1}"#.into(),
            ToolStatus::InvalidCall,
        ),
        (
            "read_file",
            r#"{"path": "missing"}"#.into(),
            ToolStatus::NotFound,
        ),
        (
            "shell",
            format!("{{\"command\": \"{}\"}}", "x".repeat(20_000)),
            ToolStatus::InvalidCall,
        ),
        (
            "write_file",
            format!(
                "{{\"path\": \"a\", \"content\": \"{}\"}}",
                "x".repeat(2 << 20)
            ),
            ToolStatus::InvalidCall,
        ),
    ];
    for (name, args, want) in cases {
        let o = sandbox().call(&mut w, name, &args);
        assert_eq!(
            o.result.status,
            want,
            "{name} {}: {}",
            &args[..args.len().min(60)],
            o.text
        );
        assert!(
            o.text.starts_with(&format!("error: {want}: ")),
            "{}",
            o.text
        );
        assert_clean(&w, &o);
    }
    assert_alive(&mut w);
}

#[test]
fn spec_paths_are_validated_and_workspace_is_removed_on_drop() {
    let bad = WorkspaceSpec {
        files: BTreeMap::from([("../x".to_string(), vec![])]),
        ..Default::default()
    };
    assert!(matches!(
        Workspace::create(bad),
        Err(SandboxError::SpecPath { .. })
    ));
    let w = ws(&[("x", "1")]);
    let p = w.host_path().to_path_buf();
    assert!(p.exists());
    drop(w);
    assert!(!p.exists());
}

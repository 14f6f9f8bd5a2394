//! The curriculum on synthetic success streams.

use corvid_tasks::*;

fn cfg() -> CurriculumConfig {
    CurriculumConfig {
        promote_threshold: 0.8,
        demote_threshold: 0.3,
        window: 10,
        min_samples: 5,
        frontier_share: 0.6,
        replay_decay: 0.5,
        context_stages: vec![
            ContextStage {
                min_level: 1,
                context_tokens: 1024,
            },
            ContextStage {
                min_level: 3,
                context_tokens: 4096,
            },
        ],
    }
}

#[test]
fn promotes_only_after_min_samples_above_threshold() {
    let mut c = Curriculum::new(cfg(), &[("hops", 8), ("shell", 8)], 1).unwrap();
    for _ in 0..4 {
        assert_eq!(c.record("hops", 1, true).unwrap(), LevelChange::None);
    }
    assert_eq!(c.record("hops", 1, true).unwrap(), LevelChange::Promoted(2));
    assert_eq!(c.frontier("hops").unwrap(), 2);
    assert_eq!(c.frontier("shell").unwrap(), 1, "families are independent");
    // 4 of 5 = 0.8 >= 0.8 promotes; results at other levels do not count.
    for s in [true, false, true, true] {
        c.record("hops", 2, s).unwrap();
    }
    assert_eq!(c.record("hops", 5, true).unwrap(), LevelChange::None);
    assert_eq!(c.record("hops", 2, true).unwrap(), LevelChange::Promoted(3));
}

#[test]
fn low_success_at_a_new_frontier_does_not_demote() {
    let mut c = Curriculum::new(cfg(), &[("hops", 8)], 1).unwrap();
    for _ in 0..5 {
        c.record("hops", 1, true).unwrap();
    }
    for _ in 0..20 {
        assert_eq!(c.record("hops", 2, false).unwrap(), LevelChange::None);
    }
    assert_eq!(c.frontier("hops").unwrap(), 2);
}

#[test]
fn demotes_when_the_mastered_level_collapses() {
    let mut c = Curriculum::new(cfg(), &[("hops", 8)], 1).unwrap();
    for _ in 0..5 {
        c.record("hops", 1, true).unwrap();
    }
    // Level 1 (replayed) collapses: 1 of 5 = 0.2 <= 0.3.
    for s in [false, true, false, false] {
        assert_eq!(c.record("hops", 1, s).unwrap(), LevelChange::None);
    }
    assert_eq!(c.record("hops", 1, false).unwrap(), LevelChange::Demoted(1));
    assert_eq!(c.frontier("hops").unwrap(), 1);
    assert_eq!(c.progress("hops").unwrap().highest_admitted, 2);
}

#[test]
fn never_promotes_past_the_top_level() {
    let mut c = Curriculum::new(cfg(), &[("tiny", 2)], 1).unwrap();
    for _ in 0..50 {
        let f = c.frontier("tiny").unwrap();
        c.record("tiny", f, true).unwrap();
    }
    assert_eq!(c.frontier("tiny").unwrap(), 2);
}

#[test]
fn weights_favour_the_frontier_and_replay_every_easier_level() {
    let mut c = Curriculum::new(cfg(), &[("hops", 8)], 1).unwrap();
    assert_eq!(c.weights("hops").unwrap(), vec![(1, 1.0)]);
    for level in 1..=3 {
        for _ in 0..5 {
            c.record("hops", level, true).unwrap();
        }
    }
    // frontier 4: w4 = .6 ; levels 1..3 share .4 as 1/4 : 1/2 : 1 -> .4/1.75 * (.25, .5, 1)
    let w = c.weights("hops").unwrap();
    let want = [
        (1, 0.4 * 0.25 / 1.75),
        (2, 0.4 * 0.5 / 1.75),
        (3, 0.4 / 1.75),
        (4, 0.6),
    ];
    for ((l, x), (wl, wx)) in w.iter().zip(want) {
        assert_eq!(*l, wl);
        assert!((x - wx).abs() < 1e-12, "{w:?}");
    }
    assert_eq!(c.level_for("hops", 0.0).unwrap(), 1);
    assert_eq!(c.level_for("hops", 0.99).unwrap(), 4);
    let n = 4000;
    let at_frontier = (0..n)
        .filter(|_| c.sample_level("hops").unwrap() == 4)
        .count();
    assert!((at_frontier as f64 / n as f64 - 0.6).abs() < 0.05);
}

#[test]
fn context_stage_follows_the_highest_admitted_level() {
    let mut c = Curriculum::new(cfg(), &[("hops", 8), ("shell", 8)], 1).unwrap();
    assert_eq!(c.context_tokens(), 1024);
    for level in 1..=2 {
        for _ in 0..5 {
            c.record("shell", level, true).unwrap();
        }
    }
    assert_eq!(c.context_tokens(), 4096);
    // A demotion of shell does not shrink the context.
    for _ in 0..5 {
        c.record("shell", 2, false).unwrap();
    }
    assert_eq!(c.frontier("shell").unwrap(), 2);
    assert_eq!(c.context_tokens(), 4096);
}

#[test]
fn resumed_curriculum_continues_exactly() {
    let mut a = Curriculum::new(cfg(), &[("hops", 8), ("search", 8)], 42).unwrap();
    for i in 0..37 {
        let f = a.sample_level("hops").unwrap();
        a.record("hops", f, i % 5 != 0).unwrap();
        a.sample_level("search").unwrap();
    }
    let saved = a.save();
    let mut b = Curriculum::load(&saved).unwrap();
    assert_eq!(a, b);
    for i in 0..200 {
        let (la, lb) = (
            a.sample_level("hops").unwrap(),
            b.sample_level("hops").unwrap(),
        );
        assert_eq!(la, lb);
        assert_eq!(
            a.record("hops", la, i % 3 != 0).unwrap(),
            b.record("hops", lb, i % 3 != 0).unwrap()
        );
    }
    assert_eq!(a, b);
}

#[test]
fn invalid_config_and_state_are_rejected() {
    let mut bad = cfg();
    bad.min_samples = 11;
    assert!(matches!(
        Curriculum::new(bad, &[("h", 2)], 0),
        Err(TasksError::InvalidConfig { .. })
    ));
    let mut bad = cfg();
    bad.demote_threshold = 0.9;
    assert!(Curriculum::new(bad, &[("h", 2)], 0).is_err());
    assert!(matches!(Curriculum::load("{"), Err(TasksError::State(_))));
    let c = Curriculum::new(cfg(), &[("h", 2)], 0).unwrap();
    let broken = c.save().replace("\"frontier\": 1", "\"frontier\": 7");
    assert!(Curriculum::load(&broken).is_err());
    assert!(Curriculum::new(cfg(), &[("h", 2)], 0)
        .unwrap()
        .record("x", 1, true)
        .is_err());
}

#[test]
fn reconfigured_curriculum_keeps_its_progress_under_the_new_settings() {
    let mut c = Curriculum::new(cfg(), &[("hops", 8)], 1).unwrap();
    for _ in 0..5 {
        c.record("hops", 1, true).unwrap();
    }
    assert_eq!(c.frontier("hops").unwrap(), 2);
    for ok in [true, false, true, true, false, true, true] {
        c.record("hops", 2, ok).unwrap();
    }
    assert_eq!(c.progress("hops").unwrap().frontier_window.len(), 7);
    assert!(
        !c.reconfigure(cfg()).unwrap(),
        "the same settings change nothing"
    );

    let new = CurriculumConfig {
        window: 4,
        min_samples: 4,
        frontier_share: 0.9,
        ..cfg()
    };
    assert!(c.reconfigure(new.clone()).unwrap());
    assert_eq!(c.config(), &new);
    let p = c.progress("hops").unwrap();
    assert_eq!(p.frontier, 2);
    // The newest four results stay.
    assert_eq!(
        p.frontier_window.iter().copied().collect::<Vec<_>>(),
        [true, false, true, true]
    );
    let w = c.weights("hops").unwrap();
    assert_eq!(w.len(), 2);
    assert!(
        (w[1].1 - 0.9).abs() < 1e-12 && (w[0].1 - 0.1).abs() < 1e-12,
        "{w:?}"
    );

    let bad = CurriculumConfig {
        min_samples: 8,
        window: 4,
        ..cfg()
    };
    let err = c.reconfigure(bad).unwrap_err().to_string();
    assert!(err.contains("min_samples"), "{err}");
    assert_eq!(c.config(), &new, "a rejected config changes nothing");
}

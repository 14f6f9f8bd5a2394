//! Checkers accept the right answer and reject near misses.

use std::collections::BTreeMap;

use corvid_tasks::*;

fn ws(files: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
    files
        .iter()
        .map(|(p, c)| (p.to_string(), c.as_bytes().to_vec()))
        .collect()
}

#[test]
fn exact_rejects_off_by_one_and_accepts_whitespace() {
    let c = Checker::Exact {
        expected: "42".into(),
        case_insensitive: false,
    };
    let w = ws(&[]);
    assert!(c.check(Some(" 42\n"), &w).passed());
    assert!(!c.check(Some("41"), &w).passed());
    assert!(!c.check(Some("43"), &w).passed());
    assert!(!c.check(Some("420"), &w).passed());
    assert!(!c.check(None, &w).passed());
}

#[test]
fn exact_case_folding_is_opt_in() {
    let strict = Checker::Exact {
        expected: "Kalo".into(),
        case_insensitive: false,
    };
    let loose = Checker::Exact {
        expected: "Kalo".into(),
        case_insensitive: true,
    };
    assert!(!strict.check(Some("kalo"), &ws(&[])).passed());
    assert!(loose.check(Some("KALO"), &ws(&[])).passed());
}

#[test]
fn regex_is_anchored() {
    let c = Checker::Regex {
        pattern: r"\d{4}".into(),
    };
    assert!(c.check(Some("1987"), &ws(&[])).passed());
    assert!(!c.check(Some("in 1987"), &ws(&[])).passed());
    assert!(!c.check(Some("19870"), &ws(&[])).passed());
    assert!(Checker::Regex {
        pattern: "(".into()
    }
    .validate()
    .is_err());
}

#[test]
fn numeric_tolerance_is_inclusive_and_tight() {
    let c = Checker::Numeric {
        expected: 3.5,
        tolerance: 0.01,
    };
    assert!(c.check(Some("3.51"), &ws(&[])).passed());
    assert!(!c.check(Some("3.52"), &ws(&[])).passed());
    assert!(!c.check(Some("three"), &ws(&[])).passed());
    let exact = Checker::Numeric {
        expected: 12.0,
        tolerance: 0.0,
    };
    assert!(exact.check(Some("12"), &ws(&[])).passed());
    assert!(!exact.check(Some("13"), &ws(&[])).passed());
    assert!(Checker::Numeric {
        expected: 1.0,
        tolerance: -1.0
    }
    .validate()
    .is_err());
}

#[test]
fn file_state_rejects_the_right_value_in_the_wrong_file() {
    let c = Checker::FileState {
        files: BTreeMap::from([(
            "report.txt".to_string(),
            FileExpectation::Equals { text: "17".into() },
        )]),
    };
    assert!(c.check(None, &ws(&[("report.txt", "17\n")])).passed());
    assert!(!c.check(None, &ws(&[("out.txt", "17\n")])).passed());
    assert!(!c.check(None, &ws(&[("report.txt", "18\n")])).passed());
    assert!(!c.check(None, &ws(&[("report.txt", "17 lines\n")])).passed());
}

#[test]
fn file_state_contains_and_absent() {
    let c = Checker::FileState {
        files: BTreeMap::from([
            (
                "app.conf".to_string(),
                FileExpectation::Contains {
                    text: "port = 80".into(),
                },
            ),
            ("app.conf.bak".to_string(), FileExpectation::Absent),
        ]),
    };
    assert!(c
        .check(None, &ws(&[("app.conf", "x\nport = 80\n")]))
        .passed());
    assert!(!c
        .check(
            None,
            &ws(&[("app.conf", "port = 8080\n"), ("app.conf.bak", "")])
        )
        .passed());
    assert!(!c.check(None, &ws(&[("app.conf", "port = 81\n")])).passed());
}

#[test]
fn sandbox_checkers_defer_to_the_sandbox() {
    let c = Checker::CommandExit {
        command: "grep -q ok status".into(),
        exit_code: 0,
    };
    assert_eq!(c.check(Some("x"), &ws(&[])), Verdict::NeedsSandbox);
    let w = Checker::Wasi {
        module: "check.wasm".into(),
        args: vec![],
    };
    assert_eq!(w.check(None, &ws(&[])), Verdict::NeedsSandbox);
}

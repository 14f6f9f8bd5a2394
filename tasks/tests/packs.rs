//! Task packs: the shipped examples work, and malformed packs are reported with
//! file:line and what to write instead.

use std::path::Path;

use corvid_tasks::*;

const BASE: &str = r#"prompt = "Read {f} and answer."

[pack]
name = "t-pack"

[vars]
n = { min = 1, max = 9 }
f = { choices = ["a.txt", "b.txt"] }

[tools]
read_file = {}
answer = {}

[[levels]]
level = 1
max_turns = 3
context_budget = 1024

[files]
"{f}" = "n = {n}\n"

[checker]
kind = "exact"
expected = "{n}"

[[process_rewards]]
kind = "reads_needed"
paths = ["{f}"]
reward = 0.1

[oracle]
answer = "{n}"

[[oracle.calls]]
tool = "read_file"
args = { path = "{f}" }
"#;

fn errors(src: &str) -> Vec<PackDiagnostic> {
    match TaskPack::parse("p.toml", src) {
        Err(TasksError::Pack(d)) => d,
        Err(e) => panic!("not a pack error: {e}"),
        Ok(_) => panic!("accepted a malformed pack:\n{src}"),
    }
}

/// Applies `from -> to` to the base pack (which must contain `from`).
fn broken(from: &str, to: &str) -> String {
    assert!(BASE.contains(from), "{from}");
    BASE.replacen(from, to, 1)
}

fn expect(src: &str, lines: std::ops::RangeInclusive<usize>, needle: &str) {
    let d = errors(src);
    assert!(
        d.iter()
            .any(|e| lines.contains(&e.line) && e.message.contains(needle) && !e.hint.is_empty()),
        "wanted `{needle}` on lines {lines:?}, got:\n{}",
        d.iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(d
        .iter()
        .all(|e| e.file == "p.toml" && e.to_string().starts_with("p.toml:")));
}

#[test]
fn base_pack_is_valid_and_its_oracle_solves_it() {
    let p = TaskPack::parse("p.toml", BASE).unwrap();
    for seed in 0..50 {
        let t = p.instance(1, seed).unwrap();
        let mut sim = Simulator::new(t.files.clone(), &[]);
        for s in &t.oracle.steps {
            assert_eq!(sim.call(&s.name, &s.arguments).0, s.expect);
        }
        assert!(t.checker.check(Some(&t.oracle.answer), &sim.files).passed());
    }
}

#[test]
fn shipped_packs_validate_and_their_oracles_solve_every_level() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("packs");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        n += 1;
        let p = load_pack(&path).unwrap_or_else(|e| panic!("{e}"));
        for level in 1..=p.levels() {
            for seed in 0..50 {
                let t = p.instance(level, seed).unwrap();
                let mut sim = Simulator::new(t.files.clone(), &[]);
                for s in &t.oracle.steps {
                    assert!(sim.call(&s.name, &s.arguments).0.is_success(), "{}", t.id);
                }
                let v = t.checker.check(Some(&t.oracle.answer), &sim.files);
                assert!(v.passed(), "{}: {v:?}", t.id);
                // Naive: answer at once, workspace untouched.
                assert!(!t.checker.check(Some("0"), &t.files).passed(), "{}", t.id);
            }
        }
    }
    assert!(n >= 2, "ship at least two example packs");
}

#[test]
fn syntax_error_is_located() {
    expect(&broken("max_turns = 3", "max_turns = 3 3"), 16..=16, "");
}

#[test]
fn unknown_field_is_located() {
    expect(&broken("level = 1", "levle = 1"), 15..=15, "unknown field");
}

#[test]
fn wrong_type_is_located() {
    expect(
        &broken("max_turns = 3", "max_turns = \"3\""),
        16..=16,
        "invalid type",
    );
}

#[test]
fn missing_section_is_reported() {
    expect(
        &broken("[checker]\nkind = \"exact\"\nexpected = \"{n}\"\n", ""),
        1..=40,
        "missing field `checker`",
    );
}

#[test]
fn unknown_checker_kind_is_located() {
    expect(
        &broken("kind = \"exact\"", "kind = \"exakt\""),
        22..=24,
        "unknown variant",
    );
}

#[test]
fn invalid_regex_is_located() {
    expect(
        &broken(
            "kind = \"exact\"\nexpected = \"{n}\"",
            "kind = \"regex\"\npattern = \"(\"",
        ),
        22..=24,
        "does not compile",
    );
}

#[test]
fn undeclared_template_variable_is_located() {
    // On the line that uses it, not at its table's header.
    expect(
        &broken("expected = \"{n}\"", "expected = \"{m}\""),
        24..=24,
        "undeclared variable `{m}`",
    );
    expect(
        &broken("paths = [\"{f}\"]", "paths = [\"{g}\"]"),
        28..=28,
        "undeclared variable `{g}`",
    );
    expect(
        &broken("args = { path = \"{f}\" }", "args = { path = \"{h}\" }"),
        36..=36,
        "undeclared variable `{h}`",
    );
}

#[test]
fn unclosed_brace_is_located() {
    expect(
        &broken("answer = \"{n}\"", "answer = \"{n\""),
        32..=32,
        "unclosed",
    );
}

#[test]
fn empty_variable_range_is_located() {
    expect(
        &broken("n = { min = 1, max = 9 }", "n = { min = 9, max = 1 }"),
        7..=7,
        "min 9 > max 1",
    );
}

#[test]
fn unknown_tool_is_reported_with_every_consequence() {
    let src = broken("read_file = {}", "read_fil = {}");
    expect(&src, 11..=11, "unknown tool `read_fil`");
    expect(&src, 35..=35, "which the pack's [tools] do not allow");
}

#[test]
fn missing_answer_tool_is_reported() {
    expect(
        &broken("answer = {}\n", ""),
        10..=11,
        "do not include `answer`",
    );
}

#[test]
fn levels_out_of_order_are_located() {
    expect(&broken("level = 1", "level = 2"), 15..=15, "out of order");
}

#[test]
fn max_turns_below_the_oracle_is_located() {
    expect(
        &broken("max_turns = 3", "max_turns = 1"),
        16..=16,
        "below the oracle",
    );
}

#[test]
fn unknown_process_reward_kind_is_located() {
    expect(
        &broken("kind = \"reads_needed\"", "kind = \"reads\""),
        26..=29,
        "invalid process reward",
    );
}

#[test]
fn built_in_family_name_is_rejected() {
    expect(
        &broken("name = \"t-pack\"", "name = \"hops\""),
        4..=4,
        "not a built-in family",
    );
}

#[test]
fn every_error_is_reported_not_just_the_first() {
    let src = broken("level = 1", "level = 3").replacen(
        "n = { min = 1, max = 9 }",
        "n = { min = 9, max = 1 }",
        1,
    );
    let d = errors(&src);
    assert!(d.len() >= 2, "{d:?}");
}

//! `corvid tasks`: list, show, sample and validate task families and task packs.
//!
//! Exit codes: 0 success; 1 a pack has errors (`validate`) or the oracle episode did not
//! pass its checker (`show --oracle`); 2 usage errors (clap).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use corvid_episode::{oracle_steps_folded, EpisodeFormat, Mistakes};
use corvid_proto::{ContextFold, Fold};
use corvid_tasks::{
    builtin_families, builtin_family, load_pack, Episode, TaskFamily, TaskInstance, TasksError,
    Verdict,
};

/// list, show, sample and validate task families and task packs.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  corvid tasks list
  corvid tasks sample --family hops --level 8 --seed 1 --oracle
  corvid tasks sample --family hops --level 2 --seed 7 --chat >> demos.jsonl
  corvid tasks show --pack tasks/packs/config-lookup.toml --level 2 --seed 3 --oracle
  corvid tasks validate tasks/packs/")]
pub struct TasksArgs {
    #[command(subcommand)]
    command: TasksCommand,
}

#[derive(Subcommand, Debug)]
enum TasksCommand {
    /// List the built-in families and the packs in a folder, each with its level table
    /// (oracle tool calls and estimated tokens per level).
    List {
        /// Folder of task packs (`*.toml`) [default: tasks/packs, skipped if it does not
        /// exist; a folder named here must exist]. Exits 1 when a pack is invalid.
        #[arg(long)]
        packs: Option<PathBuf>,
        /// Seed of the instance each table row measures.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Print one task instance: prompt, files, tools, checker; with --oracle the oracle
    /// episode with per-turn process rewards and the checker's verdict.
    Show(ShowArgs),
    /// The same as `show` (generate one instance and print it).
    Sample(ShowArgs),
    /// Validate a pack file, or every `*.toml` in a folder; prints each error as
    /// file:line:column with what to write instead.
    Validate {
        /// A pack file or a folder of packs.
        path: PathBuf,
    },
}

#[derive(Args, Debug, Clone)]
struct ShowArgs {
    /// A built-in family (`corvid tasks list` names them: hops, search, shell, ...).
    #[arg(long, required_unless_present = "pack", conflicts_with = "pack")]
    family: Option<String>,
    /// A task pack file instead of a built-in family.
    #[arg(long)]
    pack: Option<PathBuf>,
    /// Difficulty level, 1-based.
    #[arg(long, default_value_t = 1)]
    level: u32,
    /// Instance seed; the same seed always gives the same instance.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also print the oracle episode, its process rewards and the checker's verdict.
    #[arg(long)]
    oracle: bool,
    /// Print the whole instance as JSON instead.
    #[arg(long, conflicts_with = "chat")]
    json: bool,
    /// Print the oracle episode as one line of chat JSON instead: `{"messages": [...],
    /// "tools": [...]}`, tool schemas in OpenAI function format and each result as the
    /// sandbox returned it (the line format of `[sft] import`, and of what transformers'
    /// `apply_chat_template(messages, tools=tools)` takes). Exits 1 when the oracle fails.
    #[arg(long, conflicts_with = "oracle")]
    chat: bool,
    /// With --chat: print this many instances, one line each, of seeds `--seed` upwards.
    #[arg(long, default_value_t = 1, requires = "chat")]
    count: u64,
    /// With --oracle: also lay the oracle's episode out (byte layout) as an actor folds it in
    /// a window of this many tokens, and print each context segment (`[rollout.context]`).
    #[arg(long, default_value_t = 0, requires = "oracle")]
    window_tokens: u32,
    /// With --window-tokens: drop_tool_output or notes (the oracle writes no summary).
    #[arg(long, default_value = "drop_tool_output", requires = "window_tokens", value_parser = parse_fold)]
    fold: Fold,
    /// With --window-tokens: most tokens of a turn, as `[rollout.sampling] max_new_tokens`.
    #[arg(long, default_value_t = 256, requires = "window_tokens")]
    max_new_tokens: u32,
}

fn parse_fold(s: &str) -> Result<Fold, String> {
    match s {
        "drop_tool_output" => Ok(Fold::DropToolOutput),
        "notes" => Ok(Fold::Notes),
        _ => Err(format!(
            "--fold must be drop_tool_output or notes (an oracle writes no summary), got {s:?}"
        )),
    }
}

/// Runs the command.
pub fn run(args: TasksArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        TasksCommand::List { packs, seed } => list(packs.as_deref(), seed),
        TasksCommand::Show(a) | TasksCommand::Sample(a) => show(&a),
        TasksCommand::Validate { path } => validate(&path),
    }
}

fn pack_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if dir.is_file() {
        return Ok(vec![dir.to_path_buf()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading pack folder {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("toml"))
        .collect();
    files.sort();
    Ok(files)
}

/// The file an earlier pack of `name` came from, if any; otherwise `file` is recorded as
/// that name's (a run loads one file per pack name).
fn earlier_of_name(
    named: &mut BTreeMap<String, PathBuf>,
    name: &str,
    file: &Path,
) -> Option<PathBuf> {
    match named.get(name) {
        Some(first) => Some(first.clone()),
        None => {
            named.insert(name.to_owned(), file.to_path_buf());
            None
        }
    }
}

fn level_table(fam: &dyn TaskFamily, seed: u64) -> anyhow::Result<()> {
    println!("{} — {}", fam.name(), fam.description());
    println!("  level  calls  tokens  max_turns  context");
    for level in 1..=fam.levels() {
        let t = fam.instance(level, seed)?;
        println!(
            "  {:>5}  {:>5}  {:>6}  {:>9}  {:>7}{}",
            level,
            t.oracle_calls(),
            t.oracle_tokens(),
            t.max_turns,
            t.context_budget,
            if t.oracle.has_recovery() {
                "  (with recovery)"
            } else {
                ""
            }
        );
    }
    Ok(())
}

fn list(named: Option<&Path>, seed: u64) -> anyhow::Result<ExitCode> {
    let packs = named.unwrap_or(Path::new("tasks/packs"));
    if named.is_some() && !packs.exists() {
        anyhow::bail!("--packs {}: no such file or folder", packs.display());
    }
    println!("calls: oracle tool calls before `answer`; tokens: bytes of prompt, calls and tool outputs (byte-level tokenizer)\n");
    for fam in builtin_families() {
        level_table(fam.as_ref(), seed)?;
        println!();
    }
    let mut invalid = 0;
    if packs.exists() {
        let mut named = BTreeMap::new();
        for file in pack_files(packs)? {
            match load_pack(&file) {
                Ok(p) => {
                    level_table(&p, seed)?;
                    if let Some(first) = earlier_of_name(&mut named, p.name(), &file) {
                        println!(
                            "  ({} has the same pack name as {}: a run cannot load both; `corvid tasks validate` says so)",
                            file.display(),
                            first.display()
                        );
                    }
                }
                Err(e) => {
                    invalid += 1;
                    eprintln!(
                        "{} — invalid, run `corvid tasks validate {}`: {e}",
                        file.display(),
                        file.display()
                    );
                }
            }
            println!();
        }
    }
    Ok(if invalid > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn instance(a: &ShowArgs) -> anyhow::Result<TaskInstance> {
    let fam: Box<dyn TaskFamily> = match (&a.family, &a.pack) {
        (_, Some(p)) => Box::new(load_pack(p)?),
        (Some(f), None) => builtin_family(f)?,
        (None, None) => anyhow::bail!("give --family NAME or --pack FILE"),
    };
    Ok(fam.instance(a.level, a.seed)?)
}

fn show(a: &ShowArgs) -> anyhow::Result<ExitCode> {
    if a.chat {
        let env = super::task_env()?;
        let mut failed = false;
        for seed in a.seed..a.seed.saturating_add(a.count) {
            let t = instance(&ShowArgs { seed, ..a.clone() })?;
            failed |= !chat_line(&env, &t)?;
        }
        return Ok(if failed {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }
    let t = instance(a)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&t)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "task {}  spec {}",
        t.id,
        &t.spec_hash[..16.min(t.spec_hash.len())]
    );
    println!(
        "max_turns {}  context_budget {}",
        t.max_turns, t.context_budget
    );
    let tools: Vec<String> = t
        .tools
        .iter()
        .map(|s| match s.limits.max_calls {
            Some(n) => format!("{} (≤{n} calls)", s.name),
            None => s.name.clone(),
        })
        .collect();
    println!("tools: {}", tools.join(", "));
    println!("checker: {}", serde_json::to_string(&t.checker)?);
    println!("\n--- prompt\n{}", t.prompt);
    println!("\n--- files ({})", t.files.len());
    for (p, b) in &t.files {
        println!("{p} ({} bytes)", b.len());
    }
    if !t.read_only.corpus.is_empty() {
        println!("\n--- corpus ({} documents)", t.read_only.corpus.len());
        for d in &t.read_only.corpus {
            println!("[{}] {}", d.id, d.title);
        }
    }
    if !a.oracle {
        return Ok(ExitCode::SUCCESS);
    }
    println!("\n--- oracle episode");
    let stdout = std::io::stdout();
    let run = oracle_episode(&t, &mut stdout.lock())?;
    if a.window_tokens > 0 {
        let context = ContextFold {
            window_tokens: a.window_tokens,
            fold: a.fold,
            memory_tokens: 512.min(a.window_tokens / 4),
            notes_path: "notes.md".into(),
        };
        if let Some((field, value, why)) = context.unfit(a.max_new_tokens) {
            anyhow::bail!("--{} {value}: expected {why}", field.replace('_', "-"));
        }
        println!(
            "\n--- folds: a window of {} tokens, fold {}",
            a.window_tokens,
            a.fold.as_str()
        );
        print_folds(&t, &context, a.max_new_tokens, &mut stdout.lock())?;
    }
    match run.verdict {
        Verdict::Pass if run.unexpected > 0 => {
            println!(
                "checker: PASS, but {} oracle call(s) did not return what the plan expects \
                 (marked above): the demonstrations would show those results",
                run.unexpected
            );
            Ok(ExitCode::from(1))
        }
        Verdict::Pass => {
            println!("checker: PASS");
            Ok(ExitCode::SUCCESS)
        }
        Verdict::NeedsSandbox => unreachable!("the episode ran in the sandbox"),
        Verdict::Fail(why) => {
            println!("checker: FAIL — {why}");
            Ok(ExitCode::from(1))
        }
    }
}

/// Lays `t`'s oracle episode out in the byte layout as an actor folds it under `context`
/// (`corvid_episode::oracle_steps_folded`) and writes one line per context segment: its turns
/// and tokens.
fn print_folds(
    t: &TaskInstance,
    context: &ContextFold,
    max_new_tokens: u32,
    out: &mut impl std::io::Write,
) -> anyhow::Result<()> {
    let env = super::task_env()?;
    let demo = oracle_steps_folded(
        &EpisodeFormat::default(),
        &env,
        t,
        Mistakes::NONE,
        (context, max_new_tokens as usize),
    )?;
    let total = demo.len();
    for r in corvid_proto::step_segments(&demo.steps) {
        let steps = &demo.steps[r.clone()];
        let tokens: usize = steps.iter().map(|s| s.token_ids.len()).sum();
        writeln!(
            out,
            "segment {}: turns {}..{}, {tokens} tokens",
            steps[0].segment,
            r.start,
            r.end - 1
        )?;
    }
    writeln!(
        out,
        "{} tokens in {} segments (the unfolded episode: ~{} tokens)",
        total,
        demo.steps.last().map_or(0, |s| s.segment + 1),
        t.oracle_tokens()
    )?;
    Ok(())
}

/// What running an oracle plan showed.
#[derive(Debug)]
struct OracleRun {
    /// The checker's verdict on the final state.
    verdict: Verdict,
    /// Calls that returned another status than the plan expects.
    unexpected: usize,
}

/// Runs `t`'s oracle plan in a fresh sandbox workspace, as an actor runs a policy's calls
/// (the task's tool gate, its pack's own WASI tools, its checker, `command_exit` and `wasi`
/// included), and writes each turn: the call, its status, the process reward and what the
/// model would read.
fn oracle_episode(t: &TaskInstance, out: &mut impl std::io::Write) -> anyhow::Result<OracleRun> {
    let env = super::task_env()?;
    let mut ep = Episode::start(&env, t)?;
    let mut steps = t.oracle.steps.clone();
    steps.push(t.oracle.answer_step());
    let mut total = 0.0;
    let mut unexpected_calls = 0;
    for (i, s) in steps.iter().enumerate() {
        let result = ep.call(&s.tool_call());
        let reward = ep.last_process_reward();
        total += reward;
        // The plan says what each call should return; a call that returns otherwise is a
        // plan the pack's files or tools do not support. A failure the plan foresees is
        // marked too: demonstrations will show it (the built-in families fail once on
        // purpose from level 4, to teach recovery; in a pack it is usually a wrong path).
        let status = result.result.status;
        let unexpected = if status != s.expect {
            unexpected_calls += 1;
            format!("  <- the oracle plan expects {}", s.expect)
        } else if status != corvid_proto::ToolStatus::Ok {
            "  <- a failing call in the oracle plan: its demonstrations show this error".into()
        } else {
            String::new()
        };
        writeln!(
            out,
            "turn {i}: {}\n  -> {status} ({} bytes), process reward {reward:+.2}{unexpected}",
            s.hermes(),
            result.text.len(),
        )?;
        for line in result.text.lines() {
            writeln!(out, "  | {line}")?;
        }
    }
    writeln!(
        out,
        "\nprocess reward total {total:+.2}; {} calls, ~{} tokens",
        t.oracle_calls(),
        t.oracle_tokens()
    )?;
    Ok(OracleRun {
        verdict: ep.check(),
        unexpected: unexpected_calls,
    })
}

/// Prints `t`'s oracle episode, run in the sandbox, as one chat line: the user prompt, then
/// per call an assistant message calling it and a `tool` message with what it returned, the
/// last call being `answer`. Returns whether the checker passed it (saying why not).
fn chat_line(env: &corvid_tasks::TaskEnv, t: &TaskInstance) -> anyhow::Result<bool> {
    use corvid_episode::{ChatMessage, ChatToolCall, EpisodeFormat};
    let tools = EpisodeFormat::default().tools(env, t);
    let mut ep = Episode::start(env, t)?;
    let mut messages = vec![ChatMessage::text("user", t.prompt.clone())];
    let mut steps = t.oracle.steps.clone();
    steps.push(t.oracle.answer_step());
    let last = steps.len() - 1;
    for (n, s) in steps.iter().enumerate() {
        let id = format!("call_{n}");
        let mut turn = ChatMessage::text("assistant", "");
        turn.tool_calls = vec![ChatToolCall::new(id.clone(), s.tool_call())];
        messages.push(turn);
        let result = ep.call(&s.tool_call());
        if n < last {
            let mut reply = ChatMessage::text("tool", result.text);
            reply.tool_call_id = Some(id);
            messages.push(reply);
        }
    }
    println!(
        "{}",
        serde_json::json!({"messages": messages, "tools": tools})
    );
    Ok(match ep.check() {
        Verdict::Pass => true,
        Verdict::NeedsSandbox => unreachable!("the episode ran in the sandbox"),
        Verdict::Fail(why) => {
            eprintln!("the oracle episode of {} fails its checker: {why}", t.id);
            false
        }
    })
}

fn validate(path: &Path) -> anyhow::Result<ExitCode> {
    let files = pack_files(path)?;
    if files.is_empty() {
        anyhow::bail!("no *.toml packs under {}", path.display());
    }
    let mut bad = 0;
    // A run loads one file per pack name: two files of one name in a folder are an error.
    let mut named = BTreeMap::new();
    for f in &files {
        match load_pack(f) {
            Ok(p) => match earlier_of_name(&mut named, p.name(), f) {
                Some(first) => {
                    bad += 1;
                    eprintln!(
                        "error: {}: pack name `{}` is already the name of {} (a run loads one file per pack name); change `[pack] name` in one of them",
                        f.display(),
                        p.name(),
                        first.display()
                    );
                }
                None => println!(
                    "ok: {} (pack `{}`, {} level(s))",
                    f.display(),
                    p.name(),
                    p.levels()
                ),
            },
            Err(TasksError::Pack(diags)) => {
                bad += 1;
                for d in diags {
                    eprintln!("error: {d}");
                }
            }
            Err(e) => {
                bad += 1;
                eprintln!("error: {e}");
            }
        }
    }
    if bad > 0 {
        eprintln!("{bad} of {} pack(s) have errors", files.len());
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// A pack whose oracle calls its own WASI tool (the toolbox module as `lines`).
    fn line_count_pack(dir: &Path, answer: &str) -> PathBuf {
        std::fs::create_dir_all(dir.join("wasm")).unwrap();
        std::fs::write(
            dir.join("wasm/toolbox.wasm"),
            corvid_sandbox::toolbox_wasm(),
        )
        .unwrap();
        let pack = include_str!("../../tasks/tests/data/line-count.toml")
            .replace("answer = \"2\"", &format!("answer = \"{answer}\""));
        let file = dir.join("line-count.toml");
        std::fs::write(&file, pack).unwrap();
        file
    }

    #[test]
    fn the_oracle_episode_runs_a_packs_own_tool_in_the_sandbox() {
        let dir = tempfile::tempdir().unwrap();
        let task = load_pack(&line_count_pack(dir.path(), "2"))
            .unwrap()
            .instance(1, 0)
            .unwrap();
        let mut out = Vec::new();
        let run = oracle_episode(&task, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!((run.verdict, run.unexpected), (Verdict::Pass, 0), "{text}");
        let first = text.lines().nth(1).unwrap_or_default();
        assert!(first.starts_with("  -> ok "), "{text}");
        assert!(text.contains("  | 2"), "the tool's own output: {text}");
        assert!(!text.contains("the oracle plan expects"), "{text}");
        // A wrong oracle answer is a failure, not a pass.
        let task = load_pack(&line_count_pack(dir.path(), "3"))
            .unwrap()
            .instance(1, 0)
            .unwrap();
        let run = oracle_episode(&task, &mut Vec::new()).unwrap();
        assert!(matches!(run.verdict, Verdict::Fail(_)), "{run:?}");
        // A call that does not return what the plan expects is flagged on its turn.
        let file = line_count_pack(dir.path(), "2");
        let pack = std::fs::read_to_string(&file)
            .unwrap()
            .replace("\"-l\", \"a.txt\"", "\"-l\", \"missing.txt\"");
        std::fs::write(&file, pack).unwrap();
        let task = load_pack(&file).unwrap().instance(1, 0).unwrap();
        let mut out = Vec::new();
        let run = oracle_episode(&task, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let first = text.lines().nth(1).unwrap_or_default();
        assert!(first.ends_with("<- the oracle plan expects ok"), "{text}");
        // The checker still passes (the answer is right), but `tasks show` fails the pack:
        // its demonstrations would show an error the plan does not foresee.
        assert_eq!(run.unexpected, 1, "{text}");
        let cli = Cli::try_parse_from([
            "corvid",
            "show",
            "--pack",
            file.to_str().unwrap(),
            "--oracle",
        ])
        .unwrap();
        let TasksCommand::Show(a) = cli.args.command else {
            panic!("parsed as another command")
        };
        assert_eq!(show(&a).unwrap(), ExitCode::from(1));
    }

    /// `show --oracle --window-tokens` prints each segment of the oracle's folded episode:
    /// consecutive turns covering all of them, each segment within the window.
    #[test]
    fn the_oracle_episode_folds_into_segments_within_the_window() {
        let task = corvid_tasks::builtin_family("ledger")
            .unwrap()
            .instance(8, 1)
            .unwrap();
        let context = ContextFold {
            window_tokens: 2048,
            fold: Fold::DropToolOutput,
            memory_tokens: 256,
            notes_path: "notes.md".into(),
        };
        let mut out = Vec::new();
        print_folds(&task, &context, 96, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let segments: Vec<(usize, usize, usize)> = text
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix("segment ")?;
                let (_, rest) = rest.split_once(": turns ")?;
                let (turns, tokens) = rest.split_once(", ")?;
                let (a, b) = turns.split_once("..")?;
                let tokens = tokens.strip_suffix(" tokens")?;
                Some((a.parse().ok()?, b.parse().ok()?, tokens.parse().ok()?))
            })
            .collect();
        assert!(segments.len() > 2, "{text}");
        assert_eq!(segments[0].0, 0);
        for w in segments.windows(2) {
            assert_eq!(w[1].0, w[0].1 + 1, "{text}");
        }
        assert_eq!(
            segments.last().unwrap().1,
            task.oracle.steps.len(),
            "{text}"
        );
        assert!(segments.iter().all(|s| s.2 <= 2048), "{text}");
        assert!(
            text.contains(&format!("in {} segments", segments.len())),
            "{text}"
        );
    }

    #[test]
    fn the_oracle_episode_marks_a_failing_call_the_plan_foresees() {
        // hops level 4's oracle reads the second file without its extension first, then
        // recovers: that turn, and only that one, is marked.
        let task = corvid_tasks::builtin_family("hops")
            .unwrap()
            .instance(4, 1)
            .unwrap();
        let mut out = Vec::new();
        let run = oracle_episode(&task, &mut out).unwrap();
        assert_eq!((run.verdict, run.unexpected), (Verdict::Pass, 0));
        let text = String::from_utf8(out).unwrap();
        let marked: Vec<&str> = text
            .lines()
            .filter(|l| l.ends_with("its demonstrations show this error"))
            .collect();
        assert_eq!(marked.len(), 1, "{text}");
        assert!(marked[0].starts_with("  -> not_found "), "{text}");
        assert!(!text.contains("the oracle plan expects"), "{text}");
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: TasksArgs,
    }

    #[test]
    fn validating_a_folder_refuses_two_packs_of_one_name() {
        let dir = tempfile::tempdir().unwrap();
        let pack = Path::new(env!("CARGO_MANIFEST_DIR")).join("tasks/packs/greeting-fix.toml");
        std::fs::copy(&pack, dir.path().join("a.toml")).unwrap();
        assert_eq!(validate(dir.path()).unwrap(), ExitCode::SUCCESS);
        std::fs::copy(&pack, dir.path().join("b.toml")).unwrap();
        assert_eq!(validate(dir.path()).unwrap(), ExitCode::from(1));
        // Renamed, the copy is a pack of its own.
        let text = std::fs::read_to_string(&pack).unwrap();
        let renamed = text.replacen("name = \"greeting-fix\"", "name = \"greeting-fix-2\"", 1);
        assert_ne!(renamed, text, "the pack names itself greeting-fix");
        std::fs::write(dir.path().join("b.toml"), renamed).unwrap();
        assert_eq!(validate(dir.path()).unwrap(), ExitCode::SUCCESS);
    }

    #[test]
    fn listing_names_a_missing_packs_folder_and_fails_on_an_invalid_pack() {
        let dir = tempfile::tempdir().unwrap();
        let err = list(Some(&dir.path().join("nope")), 1).unwrap_err();
        assert!(format!("{err:#}").contains("nope"), "{err:#}");
        let pack = Path::new(env!("CARGO_MANIFEST_DIR")).join("tasks/packs/greeting-fix.toml");
        std::fs::copy(&pack, dir.path().join("a.toml")).unwrap();
        assert_eq!(list(Some(dir.path()), 1).unwrap(), ExitCode::SUCCESS);
        std::fs::write(dir.path().join("b.toml"), "[pack]\nname = 3\n").unwrap();
        assert_eq!(list(Some(dir.path()), 1).unwrap(), ExitCode::FAILURE);
    }

    #[test]
    fn sample_flags_parse() {
        let cli = Cli::try_parse_from([
            "corvid", "sample", "--family", "hops", "--level", "8", "--seed", "1", "--oracle",
        ])
        .unwrap();
        match cli.args.command {
            TasksCommand::Sample(a) => {
                assert_eq!(
                    (a.family.as_deref(), a.level, a.seed, a.oracle),
                    (Some("hops"), 8, 1, true)
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn family_and_pack_conflict() {
        assert!(
            Cli::try_parse_from(["corvid", "show", "--family", "hops", "--pack", "x.toml"])
                .is_err()
        );
        assert!(Cli::try_parse_from(["corvid", "show"]).is_err());
    }
}

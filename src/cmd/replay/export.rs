//! `corvid replay export`: the matching trajectories as JSON lines, `raw` (the store's own
//! records with exact token ids) or `chat` (OpenAI-style messages for other SFT tools), to
//! standard output or to a file replaced only by a whole export.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use corvid_episode::{Conversation, EpisodeFormat};
use corvid_store::{ExportSummary, Filter, TrajectoryStore};

use super::{open, stored_steps};

/// Exports what `filter` matches in the store at `store_path` as `kind` (`raw` or `chat`),
/// into the file `path` or else to `out`, and says on standard error how much it wrote.
pub(super) fn run(
    store_path: &Path,
    filter: &Filter,
    kind: &str,
    path: Option<&Path>,
    format: &EpisodeFormat,
    out: &mut dyn Write,
) -> Result<ExitCode> {
    if let Some(p) = path {
        refuse_out_inside_store(p, store_path)?;
    }
    let store = open(store_path)?;
    let export = |w: &mut dyn Write| -> Result<ExportSummary> {
        if kind == "chat" {
            export_chat(&store, filter, format, w)
        } else {
            Ok(store.export_jsonl(filter, w)?)
        }
    };
    let summary = match path {
        Some(p) => export_to_file(p, export)?,
        None => export(out)?,
    };
    eprintln!(
        "exported {} trajectories ({} steps, {} tokens){}",
        summary.trajectories,
        summary.steps,
        summary.tokens,
        path.map(|p| format!(" to {}", p.display()))
            .unwrap_or_default()
    );
    Ok(ExitCode::SUCCESS)
}

/// Refuses an export file inside the store's folder: sled owns every file there, and an
/// export over one of them (`--out <store>/db`) destroys the store.
fn refuse_out_inside_store(out: &Path, store: &Path) -> Result<()> {
    // A store that does not resolve does not exist; `open` says so.
    let Ok(store) = store.canonicalize() else {
        return Ok(());
    };
    let target = out.canonicalize().ok().or_else(|| {
        let dir = match out.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        Some(dir.canonicalize().ok()?.join(out.file_name()?))
    });
    if target.is_some_and(|t| t.starts_with(&store)) {
        anyhow::bail!(
            "refusing to export into {}: it is inside the store {}; write the export elsewhere",
            out.display(),
            store.display()
        );
    }
    Ok(())
}

/// Runs `export` into a temporary file next to `path` and renames it over `path` only when
/// the whole export is written and holds at least one trajectory. A failed export, or a
/// filter that matches nothing (a typo), leaves an earlier file at `path` as it was.
fn export_to_file(
    path: &Path,
    export: impl FnOnce(&mut dyn Write) -> Result<ExportSummary>,
) -> Result<ExportSummary> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut builder = tempfile::Builder::new();
    builder.prefix(".corvid-export-").suffix(".tmp");
    // Readable like a file created by `File::create` (a temporary file is 0600).
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o644));
    }
    let mut tmp = builder.tempfile_in(dir).with_context(|| {
        format!(
            "creating a temporary file in {} for {}",
            dir.display(),
            path.display()
        )
    })?;
    let summary = {
        let mut w = std::io::BufWriter::new(tmp.as_file_mut());
        let s = export(&mut w)?;
        w.flush()
            .with_context(|| format!("writing the export for {}", path.display()))?;
        s
    };
    if summary.trajectories == 0 {
        anyhow::bail!(
            "no trajectory matches the filters; {} {}",
            path.display(),
            if path.exists() {
                "is left as it was"
            } else {
                "is not written"
            }
        );
    }
    tmp.as_file()
        .sync_all()
        .with_context(|| format!("writing the export for {}", path.display()))?;
    tmp.persist(path)
        .map_err(|e| e.error)
        .with_context(|| format!("renaming the export into {}", path.display()))?;
    Ok(summary)
}

/// `--format chat`: one OpenAI-style transcript per context segment of each trajectory (one
/// per trajectory that never folded).
pub(super) fn export_chat(
    store: &TrajectoryStore,
    filter: &Filter,
    format: &EpisodeFormat,
    out: &mut dyn Write,
) -> Result<ExportSummary> {
    let mut summary = ExportSummary::default();
    // In a model's own format the tools are declared by its template, not in a message:
    // each line carries the task's, so that `apply_chat_template(messages, tools=tools)`
    // renders the episode's ids.
    let env = match format.chat_format() {
        Some(_) => Some(crate::cmd::task_env()?),
        None => None,
    };
    // Folded trajectories whose openings do not read back as a fold of their task's prompt
    // in this layout: named, and left out whole, never written in part.
    let mut unread = Vec::new();
    for rec in store.list(filter) {
        let rec = rec?;
        let steps = stored_steps(store, &rec.header.trajectory_id)?;
        let mut segments = corvid_proto::step_segments(&steps);
        let folds = segments.len().saturating_sub(1);
        if segments.is_empty() {
            segments.push(0..0);
        }
        // The system and user text come from the conversation the episode was built from,
        // re-derived from its task, never parsed back out of a template's rendering.
        let conversation = match &env {
            Some(env) => {
                let t = &rec.header.task;
                let task = corvid_tasks::builtin_family(&t.family)
                    .and_then(|f| f.instance(t.level, t.seed))
                    .with_context(|| {
                        format!(
                            "the prompt of {}'s task {}/{} seed {} (a task pack's tasks are not exported in a model's format)",
                            rec.header.trajectory_id, t.family, t.level, t.seed
                        )
                    })?;
                format.conversation(env, &task)
            }
            None => Conversation::default(),
        };
        // One conversation per context segment: what the policy saw at once, a folded
        // segment opening with the prompt, the carried memory and the turns it kept.
        let mut lines = Vec::with_capacity(segments.len());
        for range in segments {
            let steps = &steps[range];
            let segment = steps.first().map_or(0, |s| s.segment);
            let Some(opening) = format.segment_conversation(steps, &conversation) else {
                unread.push(format!("{} (segment {segment})", rec.header.trajectory_id));
                lines.clear();
                break;
            };
            let messages = format.to_messages(steps, &opening);
            let mut line = serde_json::json!({
                "trajectory_id": rec.header.trajectory_id,
                "task": rec.header.task,
                "policy_version": rec.header.policy_version,
                "success": rec.footer.map(|f| f.success),
                "reward": rec.footer.map(|f| f.outcome_reward),
                "termination": rec.footer.map(|f| f.termination.as_str()),
                "messages": messages,
            });
            if folds > 0 {
                line["segment"] = segment.into();
                line["segments"] = (folds + 1).into();
            }
            if let Some(chat) = format.chat_format() {
                // As the template reads them (a call's arguments as an object where it writes
                // them with `tojson`), so that `apply_chat_template` renders the segment.
                line["messages"] = serde_json::Value::from(chat.template_messages(&messages));
                line["tools"] = serde_json::Value::from(conversation.tools.clone());
                line["template_divergent"] = rec.footer.map(|f| f.template_divergent).into();
            }
            lines.push(line);
        }
        if lines.is_empty() {
            continue;
        }
        for line in lines {
            writeln!(out, "{line}")?;
        }
        summary.steps += steps.len() as u64;
        summary.tokens += steps.iter().map(|s| s.token_ids.len() as u64).sum::<u64>();
        summary.trajectories += 1;
    }
    if !unread.is_empty() {
        let what = format!(
            "{} folded trajectories whose folded context does not read back as a conversation in this chat layout (export them with --format raw): {}",
            unread.len(),
            unread.join(", ")
        );
        anyhow::ensure!(summary.trajectories > 0, "nothing to export: {what}");
        eprintln!("skipped {what}");
    }
    Ok(summary)
}

//! `corvid replay show`: one trajectory turn by turn — what the policy read and wrote, its
//! calls and their results, per-turn process rewards and the trainer's advantages
//! (`advantages.rs`) — or the record and its steps as one JSON object.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use corvid_episode::EpisodeFormat;
use corvid_proto::{RouteShape, Step};
use corvid_store::TrajectoryRecord;

use super::advantages::{group_advantages, run_rl_config, Advantages};
use super::{open, stored_steps};

/// What a transcript shows besides the turns.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Detail {
    /// Tool output and prompts in full.
    pub full: bool,
    /// The recorded routes of every token.
    pub routes: bool,
}

/// Writes the trajectory `id` of the store at `store_path` to `out`, its advantages
/// computed with the `[rl]` settings of `config` or of the run the store belongs to.
pub(super) fn run(
    store_path: &Path,
    id: &str,
    json: bool,
    detail: Detail,
    config: Option<&Path>,
    format: &EpisodeFormat,
    out: &mut dyn Write,
) -> Result<ExitCode> {
    let rl = if json {
        None
    } else {
        run_rl_config(store_path, config)?
    };
    let store = open(store_path)?;
    let Some(rec) = store.get(id)? else {
        anyhow::bail!(
            "no finished trajectory {id:?} in {}",
            store.path().display()
        );
    };
    let steps = stored_steps(&store, id)?;
    if json {
        let v = serde_json::json!({"record": rec, "steps": steps});
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        let advantages = group_advantages(&store, &rec, rl.as_ref())?;
        write_transcript(out, format, &rec, &steps, &advantages, detail)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// One line per token of step `s` (its first at position `position` of its segment): the
/// token, then per MoE layer the experts chosen for the input before it. A segment's first
/// token has no row.
fn write_routes(
    out: &mut dyn Write,
    format: &EpisodeFormat,
    s: &Step,
    shape: RouteShape,
    opens_segment: bool,
    position: usize,
) -> Result<()> {
    let ids = shape.unpack(&s.routes);
    let (k, skip) = (shape.experts_per_token as usize, usize::from(opens_segment));
    for (row, experts) in ids.chunks(shape.ids_per_token()).enumerate() {
        let j = row + skip;
        let token = s.token_ids[j];
        let layers: Vec<String> = experts
            .chunks(k)
            .map(|e| {
                let e: Vec<String> = e.iter().map(u16::to_string).collect();
                format!("[{}]", e.join(" "))
            })
            .collect();
        writeln!(
            out,
            "    route | {:>6} {:>6} {:<10} {}",
            position + j,
            token,
            format!("{:?}", format.decode(&[token])),
            layers.join(" ")
        )?;
    }
    Ok(())
}

/// `s`, cut to its first 400 characters unless `full`.
fn clip_text(s: &str, full: bool) -> String {
    const SHOWN: usize = 400;
    if full || s.chars().count() <= SHOWN {
        return s.to_string();
    }
    let head: String = s.chars().take(SHOWN).collect();
    format!(
        "{head}… [{} more characters; --full shows all]",
        s.chars().count() - SHOWN
    )
}

/// The transcript of `rec`: its header, then each step as `format` reads its tokens back as
/// text, a line marking each fold where a new context segment starts, then its footer.
pub(super) fn write_transcript(
    out: &mut dyn Write,
    format: &EpisodeFormat,
    rec: &TrajectoryRecord,
    steps: &[Step],
    advantages: &Advantages,
    detail: Detail,
) -> Result<()> {
    let full = detail.full;
    let h = &rec.header;
    writeln!(out, "trajectory {}", h.trajectory_id)?;
    writeln!(
        out,
        "  task {}/{} seed {} (spec {})  actor {}  policy v{}  group {}",
        h.task.family,
        h.task.level,
        h.task.seed,
        h.task.spec_hash,
        h.actor_id,
        h.policy_version,
        h.group_id
    )?;
    writeln!(
        out,
        "  sampling: temperature {} top_p {} max_new_tokens {} seed {}",
        h.sampling.temperature, h.sampling.top_p, h.sampling.max_new_tokens, h.sampling.seed
    )?;
    writeln!(out, "  advantages: {}", advantages.note)?;
    if detail.routes {
        match h.routes {
            Some(r) => writeln!(
                out,
                "  routes: {} MoE layers × {} of {} experts per token",
                r.moe_layers, r.experts_per_token, r.routed_experts
            )?,
            None => writeln!(out, "  routes: none recorded")?,
        }
    }
    let mut position = 0;
    for (seq, s) in steps.iter().enumerate() {
        let opens_segment = seq == 0 || steps[seq - 1].segment != s.segment;
        if seq > 0 && opens_segment {
            // The context was rebuilt: what follows is a new sequence for the policy.
            writeln!(
                out,
                "\n  ── fold: segment {} (the policy sees only what follows) ──",
                s.segment
            )?;
            position = 0;
        }
        let generated = s.generated_count();
        let first_gen = s
            .loss_mask
            .iter()
            .position(|m| *m)
            .unwrap_or(s.token_ids.len());
        write!(
            out,
            "\n  turn {:>3}: {} tokens ({} generated)",
            s.turn,
            s.token_ids.len(),
            generated
        )?;
        if generated > 0 {
            let sum: f32 = s
                .logprobs
                .iter()
                .zip(&s.loss_mask)
                .filter(|(_, m)| **m)
                .map(|(l, _)| l)
                .sum();
            write!(out, ", mean logprob {:.3}", sum / generated as f32)?;
        }
        write!(out, ", process reward {:+.3}", s.process_reward)?;
        match advantages.by_turn.as_ref().and_then(|a| a.get(&s.turn)) {
            Some(a) => writeln!(out, ", advantage {a:+.3}")?,
            None => writeln!(out)?,
        }
        let context = format.decode(&s.token_ids[..first_gen]);
        writeln!(
            out,
            "    read  | {}",
            clip_text(&context, full).replace('\n', "\n          | ")
        )?;
        let wrote = format.decode(&s.token_ids[first_gen..]);
        writeln!(
            out,
            "    wrote | {}",
            clip_text(&wrote, full).replace('\n', "\n          | ")
        )?;
        if let Some(call) = &s.tool_call {
            writeln!(out, "    call  | {}({})", call.name, call.arguments_json)?;
        }
        if let Some(r) = &s.tool_result {
            writeln!(
                out,
                "    result| {} exit {} shown {}/{} bytes, fuel {}, {} us",
                r.status, r.exit_code, r.bytes_shown, r.bytes_total, r.fuel_used, r.wall_us
            )?;
        }
        if let (true, Some(shape)) = (detail.routes, h.routes) {
            write_routes(out, format, s, shape, opens_segment, position)?;
        }
        position += s.token_ids.len();
    }
    if let Some(f) = rec.footer {
        writeln!(
            out,
            "\n  end: {} success={} outcome reward {:.3}; {} steps, {} tokens ({} generated), {} ms",
            f.termination,
            f.success,
            f.outcome_reward,
            f.step_count,
            f.token_count,
            f.generated_token_count,
            f.wall_ms
        )?;
    }
    Ok(())
}

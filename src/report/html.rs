//! `report.html`: one self-contained page (inline style, no script) over a [`Report`]; the
//! charts are referenced by their path relative to the run folder.

use std::fmt::Write;

use super::inputs::{EvalFile, Stage};
use super::{Goal, Report};

/// Escapes text for HTML element content and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A rate as a percentage, or an em dash.
fn rate(x: Option<f64>) -> String {
    x.map_or_else(|| "—".into(), |x| format!("{:.1}%", 100.0 * x))
}

fn num(x: Option<f64>, digits: usize) -> String {
    x.map_or_else(|| "—".into(), |x| format!("{x:.digits$}"))
}

fn int(x: Option<u64>) -> String {
    x.map_or_else(|| "—".into(), |x| x.to_string())
}

const STYLE: &str = "body{font-family:system-ui,-apple-system,'DejaVu Sans',sans-serif;\
max-width:1040px;margin:2em auto;padding:0 1em;color:#222;line-height:1.45}\
h1{font-size:1.6em}h2{margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:.2em}\
table{border-collapse:collapse;margin:.6em 0}th,td{border:1px solid #ccc;padding:.3em .6em;\
text-align:right}th{background:#f3f3f3}td.l,th.l{text-align:left}\
tr.frontier td{font-weight:bold;background:#fff8dc}.met{color:#176117;font-weight:bold}\
.missed{color:#a11;font-weight:bold}.nm{color:#8a5a00;font-weight:bold}\
.big{font-size:1.25em}figure{margin:1.2em 0}img{max-width:100%;border:1px solid #eee}\
figcaption{color:#555;font-size:.92em}ul.missing li{color:#8a5a00}";

/// Renders the page.
pub fn render(r: &Report) -> String {
    let mut h = String::new();
    let name = esc(&r.run.name);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>Corvid run report: {name}</title><style>{STYLE}</style></head><body>\n\
         <h1>Corvid run report: {name}</h1>\n"
    );

    // Status line.
    let status = if r.run.finished {
        format!("finished in {} minutes", num(r.run.duration_minutes, 1))
    } else {
        "<span class=\"nm\">not finished</span> (interrupted or still running): figures below \
         cover what was recorded"
            .into()
    };
    let _ = writeln!(
        h,
        "<p>Run {status}. Config: <code>{}</code>. Stage times: SFT {} s, RL {} s, \
         evaluation {} s.</p>",
        esc(r.run.config.as_deref().unwrap_or("unknown")),
        num(r.run.stages.sft_s, 0),
        num(r.run.stages.rl_s, 0),
        num(r.run.stages.eval_s, 0),
    );

    // Headline.
    let hl = &r.headline;
    let at = match (&hl.main_family, hl.frontier_level) {
        (Some(f), Some(l)) => format!("{} level {l}", esc(f)),
        (Some(f), None) => format!("{} (frontier level unknown)", esc(f)),
        _ => "unknown family and level".into(),
    };
    let _ = writeln!(
        h,
        "<h2>Headline</h2>\n<p class=\"big\">Held-out success at the frontier ({at}): \
         random init <b>{}</b>, SFT only <b>{}</b>, SFT + RL <b>{}</b>.</p>\n\
         <p>Frontier level episodes have <b>{}</b>× the oracle tokens of level 1. \
         Ablation at the frontier: step-level credit <b>{}</b>, trajectory-level GRPO <b>{}</b>.</p>",
        rate(hl.success.random),
        rate(hl.success.sft),
        rate(hl.success.rl),
        num(hl.frontier_tokens_ratio_vs_level1, 2),
        rate(hl.ablation.step_level),
        rate(hl.ablation.trajectory_grpo),
    );

    let usual = ["sft", "rl", "ablation-grpo"];
    if hl.arms.keys().any(|k| !usual.contains(&k.as_str())) {
        // Arms beside SFT, RL and the GRPO ablation: each in its own window and fold.
        let arms: Vec<String> = hl
            .arms
            .iter()
            .map(|(stage, s)| format!("{} <b>{}</b>", esc(stage), rate(*s)))
            .collect();
        let _ = writeln!(
            h,
            "<p>Every arm at the frontier, each evaluated in its own window and fold: {}.</p>",
            arms.join(", ")
        );
    }

    goals_table(&mut h, &r.goals);

    if !r.missing.is_empty() {
        let _ = writeln!(
            h,
            "<h2>Missing inputs</h2>\n<p>This report is partial. Not available:</p>\n\
             <ul class=\"missing\">"
        );
        for m in &r.missing {
            let _ = writeln!(h, "<li>{}</li>", esc(m));
        }
        h.push_str("</ul>\n");
    }

    success_table(&mut h, r);
    for stage in Stage::ALL {
        if let Some(e) = r.eval.get(stage.key()) {
            stage_table(&mut h, stage, e, r);
        }
    }
    training(&mut h, r);

    if !r.plots.is_empty() {
        h.push_str("<h2>Charts</h2>\n");
        for p in &r.plots {
            let _ = writeln!(
                h,
                "<figure><img src=\"{}\" alt=\"{}\"><figcaption><b>{}.</b> {}</figcaption></figure>",
                esc(&p.file),
                esc(&p.title),
                esc(&p.title),
                esc(&p.caption)
            );
        }
    }
    if !r.notes.is_empty() {
        h.push_str("<h2>Notes</h2>\n<ul>\n");
        for n in &r.notes {
            let _ = writeln!(h, "<li>{}</li>", esc(n));
        }
        h.push_str("</ul>\n");
    }
    h.push_str("<p><small>Figures as in <code>report.json</code>.</small></p>\n</body></html>\n");
    h
}

fn goals_table(h: &mut String, goals: &[Goal]) {
    let met = goals.iter().filter(|g| g.met).count();
    let _ = writeln!(
        h,
        "<h2>Goals</h2>\n<p>{met} of {} goals met.</p>\n<table><tr><th class=\"l\">goal</th>\
         <th>target</th><th>measured</th><th class=\"l\">result</th><th class=\"l\">note</th></tr>",
        goals.len()
    );
    for g in goals {
        let (class, word) = match (g.met, g.measured) {
            (true, _) => ("met", "MET"),
            (false, Some(_)) => ("missed", "MISSED"),
            (false, None) => ("nm", "NOT MEASURED (missed)"),
        };
        let _ = writeln!(
            h,
            "<tr><td class=\"l\">{}</td><td>{} {} {}</td><td>{}</td>\
             <td class=\"l {class}\">{word}</td><td class=\"l\">{}</td></tr>",
            esc(&g.name),
            esc(g.comparison),
            g.target,
            esc(g.unit),
            g.measured
                .map_or_else(|| "—".into(), |m| format!("{m:.2} {}", esc(g.unit))),
            esc(&g.note)
        );
    }
    h.push_str("</table>\n");
}

fn is_frontier(r: &Report, family: &str, level: u32) -> bool {
    r.headline.main_family.as_deref() == Some(family) && r.headline.frontier_level == Some(level)
}

fn success_table(h: &mut String, r: &Report) {
    if r.success_table.is_empty() {
        return;
    }
    let grpo = r.eval.contains_key(Stage::AblationGrpo.key());
    let _ = write!(
        h,
        "<h2>Held-out success by level</h2>\n<p>The highlighted row is the frontier of the main \
         family.</p>\n<table><tr><th class=\"l\">family</th><th>level</th><th>oracle tokens</th>\
         <th>random init</th><th>SFT only</th><th>SFT + RL</th>"
    );
    if grpo {
        h.push_str("<th>RL, trajectory GRPO</th>");
    }
    h.push_str("</tr>\n");
    for row in &r.success_table {
        let class = if is_frontier(r, &row.family, row.level) {
            " class=\"frontier\""
        } else {
            ""
        };
        let _ = write!(
            h,
            "<tr{class}><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
            esc(&row.family),
            row.level,
            num(row.oracle_tokens, 0),
            rate(row.random),
            rate(row.sft),
            rate(row.rl),
        );
        if grpo {
            let _ = write!(h, "<td>{}</td>", rate(row.ablation_grpo));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n");
}

fn stage_table(h: &mut String, stage: Stage, e: &EvalFile, r: &Report) {
    let k = int(e.k);
    let _ = writeln!(
        h,
        "<h2>Evaluation: {}</h2>\n<p>Checkpoint <code>{}</code>, policy version {}, {} episodes \
         per level requested, k = {k}.</p>\n<table><tr><th class=\"l\">family</th><th>level</th>\
         <th>episodes</th><th>success</th><th>call parse</th><th>call success</th>\
         <th>multi-step</th><th>recovery</th><th>pass@{k}</th><th>pass^{k}</th>\
         <th>turns</th><th>tokens</th><th>excluded</th></tr>",
        esc(stage.label()),
        esc(e.checkpoint.as_deref().unwrap_or("unknown")),
        int(e.policy_version),
        int(e.episodes_per_level),
    );
    for f in &e.families {
        for l in &f.levels {
            let class = match l.level {
                Some(lv) if is_frontier(r, &f.family, lv) => " class=\"frontier\"",
                _ => "",
            };
            let _ = writeln!(
                h,
                "<tr{class}><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td></tr>",
                esc(&f.family),
                l.level.map_or_else(|| "—".into(), |v| v.to_string()),
                int(l.episodes),
                rate(l.success_rate),
                rate(l.tool_call_parse_rate),
                rate(l.tool_call_success_rate),
                rate(l.multi_step_completion),
                rate(l.failure_recovery_rate),
                rate(l.pass_at_k),
                rate(l.pass_hat_k),
                num(l.mean_turns, 2),
                num(l.mean_tokens, 0),
                int(l.excluded),
            );
        }
    }
    h.push_str("</table>\n");
}

fn training(h: &mut String, r: &Report) {
    let t = &r.training;
    let frontier = if t.frontier_by_family.is_empty() {
        "—".to_string()
    } else {
        t.frontier_by_family
            .iter()
            .map(|(f, l)| format!("{} {l}", esc(f)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let sft_stop = match (t.sft_heldout_loss_target, t.sft_reached_target) {
        (Some(target), Some(true)) => format!(" (stopped at the held-out loss target {target})"),
        (Some(target), _) => format!(" (step cap; held-out loss target {target} not reached)"),
        (None, _) => String::new(),
    };
    let _ = writeln!(
        h,
        "<h2>Training</h2>\n<table>\
         <tr><td class=\"l\">SFT steps</td><td>{}{}</td></tr>\
         <tr><td class=\"l\">final SFT loss (train / held-out)</td><td>{} / {}</td></tr>\
         <tr><td class=\"l\">RL updates</td><td>{}</td></tr>\
         <tr><td class=\"l\">last policy version</td><td>{}</td></tr>\
         <tr><td class=\"l\">RL wall time at last update (s)</td><td>{}</td></tr>\
         <tr><td class=\"l\">reward, mean of last 10 updates</td><td>{}</td></tr>\
         <tr><td class=\"l\">training success, mean of last 10 updates</td><td>{}</td></tr>\
         <tr><td class=\"l\">frontier at last update</td><td>{frontier}</td></tr>\
         <tr><td class=\"l\">loss spikes</td><td>{}</td></tr>\
         <tr><td class=\"l\">mean trained tokens/s</td><td>{}</td></tr>\
         <tr><td class=\"l\">mean episodes/s</td><td>{}</td></tr>\
         <tr><td class=\"l\">mean staleness (versions)</td><td>{}</td></tr>\
         </table>",
        t.sft_steps,
        esc(&sft_stop),
        num(t.sft_final_loss, 4),
        num(t.sft_final_eval_loss, 4),
        t.rl_updates,
        int(t.last_policy_version),
        num(t.last_wall_s, 0),
        num(t.final_reward_mean, 3),
        rate(t.final_success_rate),
        int(t.loss_spikes),
        num(t.mean_tokens_per_s, 0),
        num(t.mean_episodes_per_s, 2),
        num(t.mean_staleness, 2),
    );
    if !t.expert_load.is_empty() {
        let _ = writeln!(
            h,
            "<p>MoE layers, last {} update(s):</p>\n<table><tr><th>layer</th><th>experts</th>\
             <th>max load share</th><th>mean max_vio</th><th>router entropy</th>\
             <th>dead experts (last)</th></tr>",
            t.expert_load_updates
        );
        for l in &t.expert_load {
            let max = l.load.iter().copied().fold(f64::NAN, f64::max);
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                l.layer,
                l.load.len(),
                rate(max.is_finite().then_some(max)),
                num(l.max_vio, 2),
                num(l.router_entropy, 3),
                num(l.dead_experts, 0),
            );
        }
        h.push_str("</table>\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            esc("<a href=\"x\">&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn rates_are_percentages_and_absent_values_are_dashes() {
        assert_eq!(rate(Some(0.955)), "95.5%");
        assert_eq!(rate(None), "—");
        assert_eq!(num(Some(2.345), 1), "2.3");
    }
}

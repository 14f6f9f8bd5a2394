//! The report's charts: what each one plots from the inputs, and drawing them under `plots/`.
//!
//! | file | shows |
//! |---|---|
//! | `reward_success.png` | mean reward and success rate per update (overall and per family at its frontier) |
//! | `frontier.png` | the curriculum's frontier level per family, over time or updates |
//! | `kl_entropy.png` | KL to the reference and policy entropy per update |
//! | `policy_update.png` | clip fractions, importance weights and gradient norm per update |
//! | `mismatch.png` | the learner before the update against the actors: k3 KL and the log-prob gap per update |
//! | `expert_load.png` | a heat map of the expert load per layer over the last updates |
//! | `routing_entropy.png` | router entropy per MoE layer per update |
//! | `sft_loss.png` | SFT training and held-out loss per step |
//! | `long_context.png` | held-out success per stage by total episode tokens, by where a needed fact was first read, and by distractor density |
//!
//! A chart without data is not drawn: the report lists it in `missing` and removes a file an
//! earlier report left under its name.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use corvid_learner::metrics::UpdateRecord;

use super::inputs::{EvalBucket, Inputs, SftStep, Update};
use super::plots::{self, HeatMap, Panel, Series, Shape};
use super::{Plot, Report, Training};

/// What a chart holds, or why there is nothing to draw.
enum Content {
    Lines(Vec<Panel>),
    Heat(HeatMap),
    NoData(String),
}

/// One chart of the report.
struct Chart {
    /// File name under `plots/`.
    file: &'static str,
    title: &'static str,
    caption: String,
    content: Content,
}

/// Why the per-update charts are empty when there is no update at all.
const NO_RL: &str = "no RL update recorded yet";

/// Draws every chart into `run_dir/plots/`, recording each in `report.plots` (or why it is
/// absent in `report.missing`, or why drawing failed in `report.notes`). Returns the files
/// drawn; fails only when `plots/` cannot be created.
pub(super) fn draw(run_dir: &Path, inputs: &Inputs, report: &mut Report) -> Result<Vec<PathBuf>> {
    let plot_dir = run_dir.join("plots");
    std::fs::create_dir_all(&plot_dir)
        .with_context(|| format!("creating {}", plot_dir.display()))?;
    let mut drawn_paths = Vec::new();
    for chart in charts(inputs, &report.training) {
        let rel = format!("plots/{}", chart.file);
        let path = run_dir.join(&rel);
        let drawn = match chart.content {
            Content::Lines(panels) => plots::line_panels(&path, &panels),
            Content::Heat(map) => plots::heat_map(&path, &map),
            Content::NoData(why) => {
                report.missing.push(format!("{} chart: {why}", chart.title));
                // A chart from an earlier report of this run must not pass for a current one.
                let _ = std::fs::remove_file(&path);
                continue;
            }
        };
        match drawn {
            Ok(()) => {
                drawn_paths.push(path);
                report.plots.push(Plot {
                    file: rel,
                    title: chart.title.into(),
                    caption: chart.caption,
                });
            }
            Err(e) => {
                tracing::warn!("{} chart not drawn: {e:#}", chart.title);
                report
                    .notes
                    .push(format!("{} chart could not be drawn: {e:#}", chart.title));
            }
        }
    }
    Ok(drawn_paths)
}

/// The charts in report order; the expert load is taken from the training summary.
fn charts(inputs: &Inputs, training: &Training) -> Vec<Chart> {
    let u = &inputs.updates;
    let xs: Vec<f64> = u.iter().map(|l| l.record.step as f64).collect();
    // Families with a frontier or a success figure in any update.
    let families: BTreeSet<&str> = u
        .iter()
        .flat_map(|l| {
            let tasks = l.record.rollout.success_by_task.keys();
            l.frontier()
                .keys()
                .map(String::as_str)
                .chain(tasks.filter_map(|t| Some(t.rsplit_once('/')?.0)))
        })
        .collect();
    vec![
        reward_success(u, &xs, &families),
        frontier(u, &xs, &families),
        kl_entropy(u, &xs),
        policy_update(u, &xs),
        mismatch(u, &xs),
        expert_load(training, u.is_empty()),
        routing_entropy(u, &xs),
        sft_loss(&inputs.sft),
        long_context(inputs),
    ]
}

fn series(label: &str, xs: &[f64], ys: impl Iterator<Item = Option<f64>>) -> Series {
    Series {
        label: label.into(),
        points: xs.iter().copied().zip(ys).collect(),
    }
}

/// One figure of every update (a non-finite one is a gap in the curve).
fn per_update(label: &str, xs: &[f64], u: &[Update], fig: fn(&UpdateRecord) -> f64) -> Series {
    series(label, xs, u.iter().map(|l| Some(fig(&l.record))))
}

/// A panel over updates, its y axis fitted to the data.
fn panel(title: &str, y_label: &str, series: Vec<Series>) -> Panel {
    Panel {
        title: title.into(),
        x_label: "update".into(),
        y_label: y_label.into(),
        series,
        y_range: None,
        shape: Shape::Line,
    }
}

/// The panels that have data, or `why` there is none.
fn lines_or_none(panels: Vec<Panel>, why: &str) -> Content {
    let panels: Vec<Panel> = panels.into_iter().filter(Panel::has_data).collect();
    if panels.is_empty() {
        Content::NoData(why.into())
    } else {
        Content::Lines(panels)
    }
}

/// Reward, then success: overall and, per family, at that update's frontier level.
fn reward_success(u: &[Update], xs: &[f64], families: &BTreeSet<&str>) -> Chart {
    let mut success = vec![per_update("all", xs, u, |r| r.rollout.success_rate)];
    for f in families {
        success.push(series(
            &format!("{f} @ frontier"),
            xs,
            u.iter().map(|l| l.success_at(f, *l.frontier().get(*f)?)),
        ));
    }
    Chart {
        file: "reward_success.png",
        title: "Reward and success",
        caption: "Training batches: mean episode reward per update; success rate overall and, \
                  per family, at that update's frontier level (drops mark promotions)."
            .into(),
        content: lines_or_none(
            vec![
                panel(
                    "Mean episode reward",
                    "reward",
                    vec![per_update("reward", xs, u, |r| r.rollout.reward_mean)],
                ),
                Panel {
                    y_range: Some((0.0, 1.0)),
                    ..panel("Success rate", "success", success)
                },
            ],
            NO_RL,
        ),
    }
}

/// The frontier over wall-clock time when every line has it, else over updates.
fn frontier(u: &[Update], xs: &[f64], families: &BTreeSet<&str>) -> Chart {
    let by_time = !u.is_empty() && u.iter().all(|l| l.wall_s.is_some());
    let fx: Vec<f64> = if by_time {
        u.iter().map(|l| l.wall_s.unwrap_or(0.0) / 60.0).collect()
    } else {
        xs.to_vec()
    };
    let curves = families
        .iter()
        .map(|f| {
            series(
                f,
                &fx,
                u.iter().map(|l| l.frontier().get(*f).map(|&v| v as f64)),
            )
        })
        .collect();
    let mut frontier_panel = Panel {
        shape: Shape::Staircase,
        ..panel("Curriculum frontier level", "level", curves)
    };
    if by_time {
        frontier_panel.x_label = "minutes since start".into();
    }
    Chart {
        file: "frontier.png",
        title: "Frontier level",
        caption: format!(
            "The curriculum's frontier level per family over {}.",
            if by_time {
                "wall-clock time"
            } else {
                "updates"
            }
        ),
        content: lines_or_none(vec![frontier_panel], "no `frontier` in the metrics"),
    }
}

fn kl_entropy(u: &[Update], xs: &[f64]) -> Chart {
    Chart {
        file: "kl_entropy.png",
        title: "KL and entropy",
        caption: "KL to the reference policy and mean token entropy of the policy, per update."
            .into(),
        content: lines_or_none(
            vec![
                panel(
                    "KL to the reference policy",
                    "KL (nats)",
                    vec![per_update("kl", xs, u, |r| r.loss.kl)],
                ),
                panel(
                    "Policy entropy",
                    "entropy (nats/token)",
                    vec![per_update("entropy", xs, u, |r| r.loss.entropy)],
                ),
            ],
            "no `kl` or `entropy` in the metrics",
        ),
    }
}

fn policy_update(u: &[Update], xs: &[f64]) -> Chart {
    Chart {
        file: "policy_update.png",
        title: "Policy update",
        caption: "Per update: share of tokens clipped below (1 - eps_low) and above \
                  (1 + eps_high), importance weights of the learner over the behaviour policy \
                  (mean and largest), and the gradient norm before clipping."
            .into(),
        content: lines_or_none(
            vec![
                panel(
                    "Clip fractions",
                    "share of tokens",
                    vec![
                        per_update("low", xs, u, |r| r.loss.clip_frac_low),
                        per_update("high", xs, u, |r| r.loss.clip_frac_high),
                    ],
                ),
                panel(
                    "Importance weights",
                    "weight",
                    vec![
                        per_update("mean", xs, u, |r| r.loss.iw_mean),
                        per_update("max", xs, u, |r| r.loss.iw_max),
                    ],
                ),
                panel(
                    "Gradient norm",
                    "norm",
                    vec![per_update("grad norm", xs, u, |r| r.loss.grad_norm)],
                ),
            ],
            "no clip fractions, importance weights or gradient norms in the metrics",
        ),
    }
}

/// A mismatch figure per update, absent in records written before the learner measured it
/// (their `token_mult_prob_error` reads 0; a measured one is at least 1).
fn per_update_mismatch(
    label: &str,
    xs: &[f64],
    u: &[Update],
    fig: fn(&UpdateRecord) -> f64,
) -> Series {
    series(
        label,
        xs,
        u.iter()
            .map(|l| (l.record.mismatch.token_mult_prob_error >= 1.0).then(|| fig(&l.record))),
    )
}

fn mismatch(u: &[Update], xs: &[f64]) -> Chart {
    Chart {
        file: "mismatch.png",
        title: "Train–rollout mismatch",
        caption: "Per update, over the generated tokens trained on: the learner's log-prob \
                  before the update against the actor's (Δ = log π_old − log μ): the k3 \
                  estimate of KL(μ ‖ π_old), the mean and largest |Δ|, and the share of tokens \
                  with π_old/μ > 2. Lagged trajectories add the policy's own change."
            .into(),
        content: lines_or_none(
            vec![
                panel(
                    "KL(actor ‖ learner), k3",
                    "KL (nats)",
                    vec![per_update_mismatch("k3 KL", xs, u, |r| r.mismatch.k3_kl)],
                ),
                panel(
                    "Log-prob gap",
                    "|Δ log-prob| (nats)",
                    vec![
                        per_update_mismatch("mean", xs, u, |r| r.mismatch.logp_abs_diff_mean),
                        per_update_mismatch("max", xs, u, |r| r.mismatch.logp_abs_diff_max),
                    ],
                ),
                panel(
                    "Tokens with ratio > 2",
                    "share of tokens",
                    vec![per_update_mismatch("ratio > 2", xs, u, |r| {
                        r.mismatch.ratio_above_2_frac
                    })],
                ),
            ],
            "no `mismatch` in the metrics (written by learners since 2026-12-06)",
        ),
    }
}

/// The heat map of `training.expert_load`; `no_updates` says why it is empty.
fn expert_load(training: &Training, no_updates: bool) -> Chart {
    let n = training.expert_load_updates;
    let rows: Vec<Vec<f64>> = training
        .expert_load
        .iter()
        .map(|l| l.load.clone())
        .collect();
    let max_e = rows.iter().map(Vec::len).max().unwrap_or(0);
    let max_load = rows.iter().flatten().copied().fold(0.0, f64::max);
    let content = if rows.is_empty() || max_e == 0 {
        Content::NoData(if no_updates {
            NO_RL.into()
        } else {
            "no `moe` load in the metrics".into()
        })
    } else {
        Content::Heat(HeatMap {
            title: format!("Expert load per layer, mean of the last {n} update(s)"),
            x_label: "expert".into(),
            y_label: "layer".into(),
            // Even load is 1/E: the scale reaches at least twice that, so even sits mid-scale.
            scale_max: max_load.max(2.0 / max_e as f64),
            rows,
        })
    };
    Chart {
        file: "expert_load.png",
        title: "Expert load",
        caption: format!(
            "Share of routed tokens per expert (columns) and layer (rows), averaged over the \
             last {n} update(s). Even load is 1/E per expert."
        ),
        content,
    }
}

fn routing_entropy(u: &[Update], xs: &[f64]) -> Chart {
    let layer_ids: BTreeSet<u32> = u
        .iter()
        .flat_map(|l| l.moe_layers().map(|(id, _)| id))
        .collect();
    let curves = layer_ids
        .iter()
        .map(|&layer| {
            series(
                &format!("layer {layer}"),
                xs,
                u.iter().map(|l| {
                    l.moe_layers()
                        .find(|(id, _)| *id == layer)
                        .map(|(_, m)| m.router_entropy)
                }),
            )
        })
        .collect();
    Chart {
        file: "routing_entropy.png",
        title: "Routing entropy",
        caption: "Mean per-token router entropy per MoE layer, per update.".into(),
        content: lines_or_none(
            vec![panel("Router entropy per layer", "entropy (nats)", curves)],
            "no `moe[].router_entropy` in the metrics",
        ),
    }
}

/// SFT loss over steps (a line's `step`, else its 1-based position).
fn sft_loss(s: &[SftStep]) -> Chart {
    let sx: Vec<f64> = s
        .iter()
        .enumerate()
        .map(|(i, st)| st.step.map_or((i + 1) as f64, |n| n as f64))
        .collect();
    Chart {
        file: "sft_loss.png",
        title: "SFT loss",
        caption: "Supervised fine-tuning: training loss per step and held-out loss where \
                  measured."
            .into(),
        content: lines_or_none(
            vec![Panel {
                x_label: "step".into(),
                ..panel(
                    "SFT loss",
                    "cross-entropy (nats/token)",
                    vec![
                        series("train", &sx, s.iter().map(|st| st.loss)),
                        series("held-out", &sx, s.iter().map(|st| st.eval_loss)),
                    ],
                )
            }],
            "no SFT step recorded",
        ),
    }
}

/// The fact positions in the order the chart draws them, at x = 0, 1, 2, 3.
const POSITIONS: [&str; 4] = ["beginning", "middle", "end", "never_read"];

/// Held-out success of every evaluated stage (its first family) by total episode tokens
/// (x: log2 of the bucket's bound), by fact position and by distractor density (x: log2 of
/// the bucket's bound; −1 for none).
fn long_context(inputs: &Inputs) -> Chart {
    let mut tokens = Vec::new();
    let mut position = Vec::new();
    let mut density = Vec::new();
    let stages = inputs
        .eval
        .iter()
        .map(|(stage, file)| (stage.label(), file))
        .chain(inputs.arm_evals.iter().map(|(s, f)| (s.as_str(), f)));
    for (label, file) in stages {
        let Some(f) = file.families.first() else {
            continue;
        };
        let log2 = |b: &EvalBucket| b.up_to.map(|u| if u > 0.0 { u.log2() } else { -1.0 });
        let points = |buckets: &[EvalBucket]| -> Vec<(f64, Option<f64>)> {
            buckets
                .iter()
                .filter_map(|b| Some((log2(b)?, b.rate())))
                .collect()
        };
        tokens.push(Series {
            label: label.into(),
            points: points(&f.by_tokens),
        });
        density.push(Series {
            label: label.into(),
            points: points(&f.by_density),
        });
        position.push(Series {
            label: label.into(),
            points: POSITIONS
                .iter()
                .enumerate()
                .filter_map(|(i, p)| Some((i as f64, f.by_position.get(*p)?.rate())))
                .collect(),
        });
    }
    let rate_panel = |title: &str, x_label: &str, series: Vec<Series>, shape| Panel {
        title: title.into(),
        x_label: x_label.into(),
        y_label: "success".into(),
        series,
        y_range: Some((0.0, 1.0)),
        shape,
    };
    Chart {
        file: "long_context.png",
        title: "Long-context breakdowns",
        caption: "Held-out success per stage: by the episode's total tokens over its segments \
                  (log2 of the bucket's upper bound), by where it first read a needed fact \
                  (0 beginning, 1 middle, 2 end, 3 never; thirds of the episode's tokens), and \
                  by distractor lines per fact line (log2 of the bucket's upper bound, -1 none)."
            .into(),
        content: lines_or_none(
            vec![
                rate_panel(
                    "Success by episode tokens",
                    "log2 tokens",
                    tokens,
                    Shape::Line,
                ),
                // Positions are categories: markers, no line between them.
                rate_panel(
                    "Success by fact position",
                    "position",
                    position,
                    Shape::Points,
                ),
                rate_panel(
                    "Success by distractor density",
                    "log2 distractors per fact",
                    density,
                    Shape::Line,
                ),
            ],
            "no evaluation file holds a breakdown",
        ),
    }
}

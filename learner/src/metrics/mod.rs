//! Training figures: one JSONL line per update, and a Prometheus endpoint with the same
//! numbers.
//!
//! - `record.rs`: the schema, [`UpdateRecord`] and its figure groups;
//! - `spike.rs`: the loss-spike rule, [`SpikeDetector`];
//! - `sink.rs`: [`MetricsSink`], which appends records to `metrics.jsonl` and keeps the
//!   latest;
//! - `prometheus.rs`: [`serve_prometheus`], the `GET /metrics` endpoint serving the latest
//!   record and the live gauges, and [`render_prometheus`], the text it serves.
//!
//! # The record ([`UpdateRecord`])
//!
//! | group | figures |
//! |---|---|
//! | `rollout` | episodes, mean reward, success rate, success by `family/level`, trained tokens, episodes/s, tokens/s, staleness (mean, max), episodes skipped (stale, unscored, too long, invalid), uninformative groups |
//! | `loss` | policy (clipped surrogate), KL to the reference (k3), entropy, balance, clip fractions low and high, importance weights (mean, max, fraction truncated), gradient norm, learning rate, optimizer steps, advantage mean and mean absolute value |
//! | `moe` | per layer: load share per expert, MaxVio, CV, load entropy, router entropy, dead experts |
//! | `spikes` | whether this update's policy loss was a spike, the running count, the window's mean and std |
//! | `curriculum` | frontier level per family, context tokens of the current stage |
//! | `service` | open groups, groups completed and expired, actors active, trajectories read, batches skipped without an update (kept current between updates on the endpoint) |
//!
//! A **loss spike** is a policy loss above `mean + k·std` of the previous `spike_window`
//! updates, counted once at least `spike_min_samples` updates are in the window
//! ([`SpikeDetector`]). Its state is checkpointed, so a resumed run counts on exactly.
//!
//! # Prometheus
//!
//! Every number of the latest record is a gauge named `corvid_<group>_<figure>`, with labels
//! for the per-task and per-layer figures, plus the live service gauges read at scrape time
//! ([`render_prometheus`] lists the names).

mod prometheus;
mod record;
mod sink;
mod spike;

pub use prometheus::{render_prometheus, serve_prometheus, LiveGauges};
pub use record::{
    CurriculumFigures, LayerRouting, LossFigures, MismatchFigures, Rate, RolloutFigures,
    ServiceFigures, SpikeFigures, UpdateRecord,
};
pub use sink::MetricsSink;
pub use spike::SpikeDetector;

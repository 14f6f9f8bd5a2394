//! Training figures: one JSONL line per update, and a Prometheus text endpoint with the same
//! numbers.
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
//! [`serve_prometheus`] answers `GET /metrics` with the text exposition format (0.0.4): every
//! number of the latest record as a gauge named `corvid_<group>_<figure>`, with labels for
//! the per-task and per-layer figures, plus live service gauges read at request time. It is
//! a small HTTP/1.0-style server on tokio: one request per connection, bounded request size.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::model::MoeHealth;

/// Success counts of one `family/level`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Rate {
    /// Scored episodes.
    pub episodes: u64,
    /// Of which succeeded.
    pub successes: u64,
    /// `successes / episodes` (0 when there are none).
    pub rate: f64,
}

impl Rate {
    /// Adds one episode.
    pub fn add(&mut self, success: bool) {
        self.episodes += 1;
        self.successes += u64::from(success);
        self.rate = self.successes as f64 / self.episodes as f64;
    }
}

/// What the update trained on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RolloutFigures {
    /// Scored episodes within the staleness bound: what the reward and success figures
    /// describe.
    pub episodes: u64,
    /// Of those, episodes trained on (groups whose advantages are all zero are not).
    pub episodes_trained: u64,
    /// Mean outcome reward of the scored episodes.
    pub reward_mean: f64,
    /// Fraction that succeeded.
    pub success_rate: f64,
    /// Success by `family/level`.
    pub success_by_task: BTreeMap<String, Rate>,
    /// Generated (trained-on) tokens.
    pub tokens: u64,
    /// Episodes consumed per second of wall time since the previous update.
    pub episodes_per_s: f64,
    /// Trained tokens per second of the update's own compute.
    pub tokens_per_s: f64,
    /// Mean policy-version lag of the trained episodes.
    pub staleness_mean: f64,
    /// Largest lag.
    pub staleness_max: u64,
    /// Episodes skipped because they were older than the staleness bound.
    pub stale_skipped: u64,
    /// Episodes left out because they were not scored (infra error, abandoned).
    pub unscored_skipped: u64,
    /// Groups left out because every advantage in them was zero.
    pub uninformative_groups: u64,
    /// Episodes longer than the model's context, left out.
    pub too_long_skipped: u64,
    /// Episodes left out as untrainable (token ids outside the vocabulary, non-finite
    /// behaviour log-probs).
    pub invalid_skipped: u64,
    /// Second copies of episodes read since the previous update, stored but not trained on
    /// (an actor taken for gone finished them after all; absent in metrics written before).
    #[serde(default)]
    pub copies_skipped: u64,
}

/// The loss terms and their diagnostics (means over the generated tokens trained on).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LossFigures {
    /// The clipped-surrogate policy loss.
    pub policy: f64,
    /// k3 estimate of KL(π_θ ‖ π_ref) at generated tokens (0 when off).
    pub kl: f64,
    /// Mean entropy of the policy at generated tokens.
    pub entropy: f64,
    /// The MoE balance loss.
    pub balance: f64,
    /// Cross-entropy per demonstration token of the PPO-ptx term (0 when off; absent in
    /// metrics written before it existed).
    #[serde(default)]
    pub ptx: f64,
    /// Fraction of tokens clipped at `1 − ε_low` (negative advantage side).
    pub clip_frac_low: f64,
    /// Fraction clipped at `1 + ε_high` (positive advantage side).
    pub clip_frac_high: f64,
    /// Mean truncated importance weight `w = min(π_prox/μ, tis_cap)`.
    pub iw_mean: f64,
    /// Largest `w` (at most `tis_cap`).
    pub iw_max: f64,
    /// Fraction of tokens whose weight was truncated at the cap.
    pub iw_truncated_frac: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate of the last optimizer step.
    pub lr: f64,
    /// Optimizer steps of the update (0 when nothing was left to train on).
    pub optimizer_steps: u64,
    /// Mean advantage over generated tokens.
    pub adv_mean: f64,
    /// Mean absolute advantage over generated tokens.
    pub adv_abs_mean: f64,
}

/// MoE health of one layer (from [`MoeHealth`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LayerHealth {
    /// Layer index.
    pub layer: i64,
    /// Load share per expert.
    pub load: Vec<f64>,
    /// Maximal violation of the even load.
    pub max_vio: f64,
    /// Coefficient of variation of the counts.
    pub cv: f64,
    /// Normalised load entropy.
    pub load_entropy: f64,
    /// Mean per-token router entropy (nats).
    pub router_entropy: f64,
    /// Experts that received no token.
    pub dead_experts: i64,
}

impl From<&MoeHealth> for LayerHealth {
    fn from(h: &MoeHealth) -> Self {
        Self {
            layer: h.layer,
            load: h.load.clone(),
            max_vio: h.max_vio,
            cv: h.cv,
            load_entropy: h.load_entropy,
            router_entropy: h.router_entropy,
            dead_experts: h.dead_experts,
        }
    }
}

/// The loss-spike figures of one update.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpikeFigures {
    /// This update's policy loss was a spike.
    pub spike: bool,
    /// Spikes so far in the run.
    pub count: u64,
    /// Mean of the window the loss was compared with.
    pub window_mean: f64,
    /// Std of that window.
    pub window_std: f64,
}

/// The curriculum after the update.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CurriculumFigures {
    /// Frontier level per family.
    pub frontier: BTreeMap<String, u32>,
    /// Context window of the current stage, tokens.
    pub context_tokens: u32,
}

/// The service side at the update.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceFigures {
    /// Groups handed out and not yet completed.
    pub open_groups: u64,
    /// Completed groups waiting for the trainer after this update (they hold new groups
    /// back: tasks, rule 3; absent in metrics written before).
    #[serde(default)]
    pub groups_waiting: u64,
    /// Groups completed so far.
    pub groups_completed: u64,
    /// Groups expired so far.
    pub groups_expired: u64,
    /// Episodes taken back from silent actors and handed out again, so far.
    #[serde(default)]
    pub episodes_reclaimed: u64,
    /// Actors heard from within `[rollout] actor_timeout_s`.
    pub actors_active: u64,
    /// Finished trajectories the trainer has read from the store, over the whole run.
    pub trajectories_read: u64,
    /// Batches consumed without an update (no scored episode), over the whole run.
    #[serde(default)]
    pub batches_skipped: u64,
}

/// One line of the metrics file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UpdateRecord {
    /// RL update index (1-based).
    pub step: u64,
    /// Policy version published after the update.
    pub policy_version: u64,
    /// Wall clock, ms since the Unix epoch.
    pub unix_ms: u64,
    /// Seconds the update took.
    pub update_s: f64,
    /// What was trained on.
    pub rollout: RolloutFigures,
    /// Loss terms.
    pub loss: LossFigures,
    /// MoE health per layer.
    pub moe: Vec<LayerHealth>,
    /// Loss spikes.
    pub spikes: SpikeFigures,
    /// Curriculum.
    pub curriculum: CurriculumFigures,
    /// Service.
    pub service: ServiceFigures,
}

/// `f64`s as their IEEE bits: serde_json's default float parsing may miss the last bit,
/// and a resumed run must judge the next loss against exactly the same window.
mod f64_bits {
    use std::collections::VecDeque;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(xs: &VecDeque<f64>, s: S) -> Result<S::Ok, S::Error> {
        xs.iter()
            .map(|x| x.to_bits())
            .collect::<Vec<u64>>()
            .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<VecDeque<f64>, D::Error> {
        Ok(Vec::<u64>::deserialize(d)?
            .into_iter()
            .map(f64::from_bits)
            .collect())
    }
}

/// The loss-spike rule: a value above `mean + k·std` of the previous `window` values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpikeDetector {
    k: f64,
    window: usize,
    min_samples: usize,
    #[serde(with = "f64_bits")]
    recent: VecDeque<f64>,
    count: u64,
}

impl SpikeDetector {
    /// A detector with threshold `k` standard deviations over `window` values, active after
    /// `min_samples`.
    pub fn new(k: f64, window: usize, min_samples: usize) -> Self {
        Self {
            k,
            window: window.max(2),
            min_samples: min_samples.max(2),
            recent: VecDeque::new(),
            count: 0,
        }
    }

    /// Judges `loss` against the window (before adding it), then adds it. Non-finite losses
    /// are always spikes and are not added to the window.
    pub fn observe(&mut self, loss: f64) -> SpikeFigures {
        let n = self.recent.len() as f64;
        let mean = self.recent.iter().sum::<f64>() / n.max(1.0);
        let var = self.recent.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n.max(1.0);
        let std = var.sqrt();
        let spike = !loss.is_finite()
            || (self.recent.len() >= self.min_samples && loss > mean + self.k * std);
        if spike {
            self.count += 1;
        }
        if loss.is_finite() {
            self.recent.push_back(loss);
            while self.recent.len() > self.window {
                self.recent.pop_front();
            }
        }
        SpikeFigures {
            spike,
            count: self.count,
            window_mean: mean,
            window_std: std,
        }
    }

    /// Spikes so far.
    pub fn count(&self) -> u64 {
        self.count
    }
}

/// Appends records to the JSONL file and keeps the latest for the Prometheus endpoint.
#[derive(Debug)]
pub struct MetricsSink {
    path: PathBuf,
    file: std::fs::File,
    latest: Arc<RwLock<Option<UpdateRecord>>>,
}

impl MetricsSink {
    /// Opens `path` for appending (creating its folder).
    pub fn open(path: &Path) -> std::io::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            latest: Arc::new(RwLock::new(None)),
        })
    }

    /// Removes lines whose `step` is above `step` (written after the checkpoint a run resumes
    /// from), so that the resumed run's lines continue the file without repeats.
    pub fn truncate_after(path: &Path, step: u64) -> std::io::Result<usize> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        let mut kept = String::with_capacity(text.len());
        let mut dropped = 0;
        for line in text.lines() {
            let s = serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v.get("step").and_then(|s| s.as_u64()));
            match s {
                Some(s) if s > step => dropped += 1,
                // A torn last line (killed mid-write) is dropped too.
                None => dropped += 1,
                Some(_) => {
                    kept.push_str(line);
                    kept.push('\n');
                }
            }
        }
        if dropped > 0 {
            crate::durable::replace_file(path, kept.as_bytes())?;
        }
        Ok(dropped)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The latest record, shared with the Prometheus endpoint.
    pub fn latest(&self) -> Arc<RwLock<Option<UpdateRecord>>> {
        Arc::clone(&self.latest)
    }

    /// Records a batch consumed without an update in the latest record, so that the endpoint
    /// shows `service_batches_skipped` rising while no update (and no line) is written.
    pub fn note_batches_skipped(&self, total: u64) {
        let mut latest = self.latest.write().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = latest.as_mut() {
            r.service.batches_skipped = total;
        }
    }

    /// Writes one line and makes `record` the latest.
    pub fn write(&mut self, record: &UpdateRecord) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(record)?;
        line.push(b'\n');
        self.file.write_all(&line)?;
        self.file.flush()?;
        *self.latest.write().unwrap_or_else(|p| p.into_inner()) = Some(record.clone());
        Ok(())
    }
}

/// Gauges read at request time (the service side changes between updates).
pub type LiveGauges = Arc<dyn Fn() -> Vec<(String, f64)> + Send + Sync>;

fn gauge(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    let _ = write!(out, "corvid_{name}");
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let v = v.replace('\\', "\\\\").replace('"', "\\\"");
            let _ = write!(out, "{k}=\"{v}\"");
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// The Prometheus text of `record` and `live`.
pub fn render_prometheus(record: Option<&UpdateRecord>, live: &[(String, f64)]) -> String {
    let mut out = String::new();
    for (name, v) in live {
        gauge(&mut out, name, &[], *v);
    }
    let Some(r) = record else { return out };
    gauge(&mut out, "update_step", &[], r.step as f64);
    gauge(&mut out, "policy_version", &[], r.policy_version as f64);
    gauge(&mut out, "update_seconds", &[], r.update_s);
    let ro = &r.rollout;
    for (name, v) in [
        ("rollout_episodes", ro.episodes as f64),
        ("rollout_episodes_trained", ro.episodes_trained as f64),
        ("rollout_reward_mean", ro.reward_mean),
        ("rollout_success_rate", ro.success_rate),
        ("rollout_tokens", ro.tokens as f64),
        ("rollout_episodes_per_second", ro.episodes_per_s),
        ("rollout_tokens_per_second", ro.tokens_per_s),
        ("rollout_staleness_mean", ro.staleness_mean),
        ("rollout_staleness_max", ro.staleness_max as f64),
        ("rollout_stale_skipped", ro.stale_skipped as f64),
        ("rollout_unscored_skipped", ro.unscored_skipped as f64),
        (
            "rollout_uninformative_groups",
            ro.uninformative_groups as f64,
        ),
        ("rollout_too_long_skipped", ro.too_long_skipped as f64),
        ("rollout_invalid_skipped", ro.invalid_skipped as f64),
        ("rollout_copies_skipped", ro.copies_skipped as f64),
    ] {
        gauge(&mut out, name, &[], v);
    }
    for (task, rate) in &ro.success_by_task {
        let (family, level) = task.split_once('/').unwrap_or((task, ""));
        let labels = [("family", family), ("level", level)];
        gauge(&mut out, "rollout_task_success_rate", &labels, rate.rate);
        gauge(
            &mut out,
            "rollout_task_episodes",
            &labels,
            rate.episodes as f64,
        );
    }
    let l = &r.loss;
    for (name, v) in [
        ("loss_policy", l.policy),
        ("loss_kl", l.kl),
        ("loss_entropy", l.entropy),
        ("loss_balance", l.balance),
        ("loss_clip_frac_low", l.clip_frac_low),
        ("loss_clip_frac_high", l.clip_frac_high),
        ("loss_iw_mean", l.iw_mean),
        ("loss_iw_max", l.iw_max),
        ("loss_iw_truncated_frac", l.iw_truncated_frac),
        ("loss_grad_norm", l.grad_norm),
        ("loss_lr", l.lr),
        ("loss_optimizer_steps", l.optimizer_steps as f64),
        ("loss_adv_mean", l.adv_mean),
        ("loss_adv_abs_mean", l.adv_abs_mean),
    ] {
        gauge(&mut out, name, &[], v);
    }
    for h in &r.moe {
        let layer = h.layer.to_string();
        let labels = [("layer", layer.as_str())];
        gauge(&mut out, "moe_max_vio", &labels, h.max_vio);
        gauge(&mut out, "moe_cv", &labels, h.cv);
        gauge(&mut out, "moe_load_entropy", &labels, h.load_entropy);
        gauge(&mut out, "moe_router_entropy", &labels, h.router_entropy);
        gauge(&mut out, "moe_dead_experts", &labels, h.dead_experts as f64);
        for (e, load) in h.load.iter().enumerate() {
            let e = e.to_string();
            gauge(
                &mut out,
                "moe_load",
                &[("layer", layer.as_str()), ("expert", e.as_str())],
                *load,
            );
        }
    }
    gauge(
        &mut out,
        "loss_spike",
        &[],
        f64::from(u8::from(r.spikes.spike)),
    );
    gauge(&mut out, "loss_spikes_total", &[], r.spikes.count as f64);
    let sv = &r.service;
    for (name, v) in [
        ("service_open_groups", sv.open_groups),
        ("service_groups_waiting", sv.groups_waiting),
        ("service_groups_completed", sv.groups_completed),
        ("service_groups_expired", sv.groups_expired),
        ("service_episodes_reclaimed", sv.episodes_reclaimed),
        ("service_actors_active", sv.actors_active),
        ("service_trajectories_read", sv.trajectories_read),
        ("service_batches_skipped", sv.batches_skipped),
    ] {
        gauge(&mut out, name, &[], v as f64);
    }
    for (family, level) in &r.curriculum.frontier {
        gauge(
            &mut out,
            "curriculum_frontier",
            &[("family", family)],
            f64::from(*level),
        );
    }
    gauge(
        &mut out,
        "curriculum_context_tokens",
        &[],
        f64::from(r.curriculum.context_tokens),
    );
    out
}

/// Largest request head the endpoint reads, bytes.
const MAX_REQUEST_BYTES: usize = 8 << 10;

/// Serves `GET /metrics` on `listener` until `shutdown` resolves.
pub async fn serve_prometheus(
    listener: TcpListener,
    latest: Arc<RwLock<Option<UpdateRecord>>>,
    live: LiveGauges,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let (mut sock, _) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics endpoint: accept failed");
                    continue;
                }
            },
        };
        let latest = Arc::clone(&latest);
        let live = Arc::clone(&live);
        tokio::spawn(async move {
            let mut buf = Vec::with_capacity(1024);
            let mut chunk = [0u8; 1024];
            let head_done = loop {
                let read =
                    tokio::time::timeout(std::time::Duration::from_secs(5), sock.read(&mut chunk))
                        .await;
                match read {
                    Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break false,
                    Ok(Ok(n)) => {
                        buf.extend_from_slice(&chunk[..n]);
                        if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            break true;
                        }
                        if buf.len() > MAX_REQUEST_BYTES {
                            break false;
                        }
                    }
                }
            };
            if !head_done {
                return;
            }
            let line = buf.split(|&b| b == b'\r').next().unwrap_or_default();
            let line = String::from_utf8_lossy(line);
            let mut parts = line.split_whitespace();
            let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let (status, body) = if method == "GET" && (target == "/metrics" || target == "/") {
                let record = latest.read().unwrap_or_else(|p| p.into_inner()).clone();
                ("200 OK", render_prometheus(record.as_ref(), &live()))
            } else {
                (
                    "404 Not Found",
                    "only GET /metrics is served here\n".to_owned(),
                )
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(response.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spike_is_a_loss_above_mean_plus_k_std_of_the_window() {
        let mut d = SpikeDetector::new(3.0, 10, 4);
        for x in [1.0, 1.1, 0.9, 1.0] {
            assert!(!d.observe(x).spike);
        }
        // Window mean 1.0, std ≈ 0.0707: the threshold is ≈ 1.212, so 1.2 is not a spike.
        assert!(!d.observe(1.2).spike);
        let f = d.observe(5.0);
        assert!(f.spike);
        assert_eq!(f.count, 1);
        assert!(d.observe(f64::NAN).spike);
        assert_eq!(d.count(), 2);
    }

    #[test]
    fn the_window_survives_json_bit_for_bit() {
        let mut d = SpikeDetector::new(3.0, 10, 4);
        for i in 0..7 {
            d.observe(-0.123_456_789_012_345_67 * f64::from(i) + 1e-17);
        }
        let back: SpikeDetector =
            serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
        assert_eq!(back, d);
    }

    #[test]
    fn no_spike_is_counted_before_min_samples() {
        let mut d = SpikeDetector::new(1.0, 10, 5);
        for x in [0.0, 0.0, 0.0, 100.0] {
            assert!(!d.observe(x).spike);
        }
    }

    #[test]
    fn prometheus_text_carries_the_records_figures() {
        let mut r = UpdateRecord {
            step: 7,
            policy_version: 8,
            ..UpdateRecord::default()
        };
        r.loss.policy = -0.25;
        r.service.batches_skipped = 2;
        r.rollout.success_by_task.insert(
            "hops/2".into(),
            Rate {
                episodes: 4,
                successes: 1,
                rate: 0.25,
            },
        );
        r.moe.push(LayerHealth {
            layer: 1,
            load: vec![0.5, 0.5],
            dead_experts: 0,
            max_vio: 0.0,
            ..LayerHealth::default()
        });
        let text = render_prometheus(Some(&r), &[("actors_active".into(), 3.0)]);
        for want in [
            "corvid_actors_active 3\n",
            "corvid_update_step 7\n",
            "corvid_policy_version 8\n",
            "corvid_loss_policy -0.25\n",
            "corvid_rollout_task_success_rate{family=\"hops\",level=\"2\"} 0.25\n",
            "corvid_moe_load{layer=\"1\",expert=\"1\"} 0.5\n",
            "corvid_service_batches_skipped 2\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }

    #[test]
    fn truncate_after_drops_later_and_torn_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        let mut sink = MetricsSink::open(&path).unwrap();
        for step in 1..=5 {
            sink.write(&UpdateRecord {
                step,
                ..UpdateRecord::default()
            })
            .unwrap();
        }
        drop(sink);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"{\"step\": 6, \"tor").unwrap();
        assert_eq!(MetricsSink::truncate_after(&path, 3).unwrap(), 3);
        let steps: Vec<u64> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<UpdateRecord>(l).unwrap().step)
            .collect();
        assert_eq!(steps, vec![1, 2, 3]);
    }

    #[tokio::test]
    async fn the_endpoint_serves_the_latest_record() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let latest = Arc::new(RwLock::new(Some(UpdateRecord {
            step: 42,
            ..UpdateRecord::default()
        })));
        let live: LiveGauges = Arc::new(|| vec![("trajectories_stored".into(), 9.0)]);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_prometheus(listener, latest, live, async {
            let _ = stopped.await;
        }));
        let get = |path: &'static str| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        let ok = get("/metrics").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        assert!(ok.contains("corvid_update_step 42\n"));
        assert!(ok.contains("corvid_trajectories_stored 9\n"));
        assert!(get("/other").await.starts_with("HTTP/1.1 404"));
        stop.send(()).unwrap();
        server.await.unwrap();
    }
}

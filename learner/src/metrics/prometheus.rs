//! The Prometheus endpoint: `GET /metrics` (and `GET /`) on `[metrics] prometheus`.
//!
//! The text is written by the official client, `prometheus-client`, at scrape time: a
//! [`Collector`] reads the latest [`UpdateRecord`] and the [`LiveGauges`] and encodes each
//! figure as a gauge, so every value is exactly what the record holds. The series are
//! listed on [`render_prometheus`].
//!
//! The format follows the scraper's `Accept` header: OpenMetrics 1.0 text (ending in
//! `# EOF`) when it names `application/openmetrics-text`, as Prometheus does, and the
//! classic text format 0.0.4 otherwise (curl, a browser). The samples are the same in both.
//!
//! HTTP is hyper's HTTP/1.1 server, the one tonic already links: one request per connection,
//! a request head of at most [`MAX_REQUEST_BYTES`] read within [`HEAD_TIMEOUT`]. When
//! `shutdown` resolves the endpoint stops accepting; a connection already accepted is still
//! answered.

use std::convert::Infallible;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::header::{HeaderValue, ACCEPT, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeGaugeValue, EncodeLabelSet, GaugeValueEncoder,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use super::UpdateRecord;

/// Gauges read at scrape time (the service side changes between updates): `(name, value)`,
/// served as `corvid_<name>`.
pub type LiveGauges = Arc<dyn Fn() -> Vec<(String, f64)> + Send + Sync>;

/// Largest request head the endpoint reads, bytes (hyper's smallest allowed buffer).
const MAX_REQUEST_BYTES: usize = 8 << 10;

/// How long a connection may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// `Content-Type` of the OpenMetrics text format.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The two text expositions the endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exposition {
    /// Prometheus text format 0.0.4.
    Classic,
    /// OpenMetrics 1.0 text.
    OpenMetrics,
}

impl Exposition {
    /// What a request's `Accept` headers ask for.
    fn negotiate(accept: hyper::header::GetAll<'_, HeaderValue>) -> Self {
        let openmetrics = accept
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.contains("application/openmetrics-text"));
        if openmetrics {
            Self::OpenMetrics
        } else {
            Self::Classic
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Self::Classic => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Self::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
        }
    }

    /// The registry's text in this exposition. The encoders fail only when the writer does.
    fn encode(self, registry: &Registry) -> Result<String, fmt::Error> {
        let mut text = String::new();
        match self {
            Self::Classic => {
                prometheus_client::encoding::prometheus_text::encode(&mut text, registry)?
            }
            Self::OpenMetrics => prometheus_client::encoding::text::encode(&mut text, registry)?,
        }
        Ok(text)
    }
}

/// A gauge value, encoded as exactly what the record holds: integers as integers, and a
/// whole `f64` (every live gauge is a count) as an integer too, `3` and not `3.0`.
#[derive(Debug, Clone, Copy)]
enum Value {
    Unsigned(u64),
    Signed(i64),
    Real(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Self::Unsigned(v)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Self::Unsigned(v.into())
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Self::Unsigned(v.into())
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Self::Signed(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Self::Real(v)
    }
}

impl EncodeGaugeValue for Value {
    fn encode(&self, encoder: &mut GaugeValueEncoder) -> Result<(), fmt::Error> {
        match *self {
            Self::Unsigned(v) => v.encode(encoder),
            Self::Signed(v) => v.encode(encoder),
            // A whole f64 within i64's range converts exactly.
            Self::Real(v)
                if v.fract() == 0.0 && (i64::MIN as f64..i64::MAX as f64).contains(&v) =>
            {
                (v as i64).encode(encoder)
            }
            Self::Real(v) => v.encode(encoder),
        }
    }
}

/// One unlabelled gauge.
fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: impl Into<Value>,
) -> fmt::Result {
    enc.encode_descriptor(name, help, None, MetricType::Gauge)?
        .encode_gauge(&value.into())
}

/// One gauge family, a sample per label set; nothing at all when there are no samples.
fn family<L: EncodeLabelSet, V: Into<Value>>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (L, V)>,
) -> fmt::Result {
    let mut samples = samples.into_iter().peekable();
    if samples.peek().is_none() {
        return Ok(());
    }
    let mut metric = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in samples {
        metric.encode_family(&labels)?.encode_gauge(&v.into())?;
    }
    Ok(())
}

/// The record's figures, in the order of its groups. One line per series, so the table is
/// kept as written rather than formatted.
#[rustfmt::skip]
fn encode_record(enc: &mut DescriptorEncoder, r: &UpdateRecord) -> fmt::Result {
    let (ro, l, sv, c) = (&r.rollout, &r.loss, &r.service, &r.curriculum);
    for (name, help, v) in [
        ("update_step", "RL update index (1-based).", Value::from(r.step)),
        ("policy_version", "Policy version published after the update.", r.policy_version.into()),
        ("update_seconds", "Seconds the update took.", r.update_s.into()),
        ("rollout_episodes", "Scored episodes within the staleness bound.", ro.episodes.into()),
        ("rollout_episodes_trained", "Of those, episodes trained on.", ro.episodes_trained.into()),
        ("rollout_reward_mean", "Mean outcome reward.", ro.reward_mean.into()),
        ("rollout_success_rate", "Fraction of episodes that succeeded.", ro.success_rate.into()),
        ("rollout_tokens", "Generated tokens trained on.", ro.tokens.into()),
        ("rollout_episodes_per_second", "Episodes consumed per second.", ro.episodes_per_s.into()),
        ("rollout_tokens_per_second", "Trained tokens per second.", ro.tokens_per_s.into()),
        ("rollout_staleness_mean", "Mean policy-version lag.", ro.staleness_mean.into()),
        ("rollout_staleness_max", "Largest policy-version lag.", ro.staleness_max.into()),
        ("rollout_stale_skipped", "Episodes past the staleness bound.", ro.stale_skipped.into()),
        ("rollout_unscored_skipped", "Episodes left out unscored.", ro.unscored_skipped.into()),
        ("rollout_uninformative_groups", "Groups with all-zero advantages.", ro.uninformative_groups.into()),
        ("rollout_too_long_skipped", "Episodes longer than the context.", ro.too_long_skipped.into()),
        ("rollout_invalid_skipped", "Episodes left out as untrainable.", ro.invalid_skipped.into()),
        ("rollout_copies_skipped", "Second copies of episodes, not trained on.", ro.copies_skipped.into()),
        ("rollout_template_divergent_episodes", "Episodes the chat template renders otherwise than the ids the policy saw.", ro.template_divergent_episodes.into()),
        ("rollout_folded_episodes", "Episodes that folded their context at least once.", ro.folded_episodes.into()),
        ("rollout_folds", "Context folds of the scored episodes.", ro.folds.into()),
        ("rollout_episode_tokens_mean", "Mean tokens of a scored episode over its segments.", ro.episode_tokens_mean.into()),
    ] {
        gauge(enc, name, help, v)?;
    }

    let tasks = || ro.success_by_task.iter().map(|(task, rate)| {
        let (family, level) = task.split_once('/').unwrap_or((task, ""));
        ([("family", family), ("level", level)], rate)
    });
    family(enc, "rollout_task_success_rate", "Success rate by family and level.",
        tasks().map(|(k, t)| (k, t.rate)))?;
    family(enc, "rollout_task_episodes", "Scored episodes by family and level.",
        tasks().map(|(k, t)| (k, t.episodes)))?;

    for (name, help, v) in [
        ("loss_policy", "Clipped-surrogate policy loss.", Value::from(l.policy)),
        ("loss_kl", "k3 estimate of KL to the reference.", l.kl.into()),
        ("loss_entropy", "Mean policy entropy at generated tokens.", l.entropy.into()),
        ("loss_balance", "MoE balance loss.", l.balance.into()),
        ("loss_clip_frac_low", "Fraction of tokens clipped at 1 - eps_low.", l.clip_frac_low.into()),
        ("loss_clip_frac_high", "Fraction of tokens clipped at 1 + eps_high.", l.clip_frac_high.into()),
        ("loss_approx_kl", "Mean (r - 1) - log r, r = pi_theta / pi_prox.", l.approx_kl.into()),
        ("loss_iw_mean", "Mean truncated importance weight.", l.iw_mean.into()),
        ("loss_iw_max", "Largest truncated importance weight.", l.iw_max.into()),
        ("loss_iw_truncated_frac", "Fraction of weights truncated at the cap.", l.iw_truncated_frac.into()),
        ("loss_grad_norm", "Global gradient norm before clipping.", l.grad_norm.into()),
        ("loss_lr", "Learning rate of the last optimizer step.", l.lr.into()),
        ("loss_optimizer_steps", "Optimizer steps of the update.", l.optimizer_steps.into()),
        ("loss_adv_mean", "Mean advantage over generated tokens.", l.adv_mean.into()),
        ("loss_adv_abs_mean", "Mean absolute advantage.", l.adv_abs_mean.into()),
        ("mismatch_k3_kl", "k3 KL(mu || pi_old) of the actors against the learner before the update.", r.mismatch.k3_kl.into()),
        ("mismatch_token_mult_prob_error", "Mean exp(|log pi_old - log mu|).", r.mismatch.token_mult_prob_error.into()),
        ("mismatch_logp_abs_diff_mean", "Mean |log pi_old - log mu|.", r.mismatch.logp_abs_diff_mean.into()),
        ("mismatch_logp_abs_diff_max", "Largest |log pi_old - log mu|.", r.mismatch.logp_abs_diff_max.into()),
        ("mismatch_ratio_above_2_frac", "Fraction of tokens with pi_old / mu > 2.", r.mismatch.ratio_above_2_frac.into()),
        ("mismatch_without_routes", "Trajectories trained on without recorded routes.", (r.mismatch.without_routes as u64).into()),
    ] {
        gauge(enc, name, help, v)?;
    }
    if let Some(k3) = r.mismatch.k3_kl_lag0 {
        gauge(enc, "mismatch_k3_kl_lag0", "k3 KL(mu || pi_old) over tokens generated by pi_old's own weights.", k3)?;
    }
    if let (Some(a), Some(o)) = (r.mismatch.routing_agreement, r.mismatch.routing_overlap) {
        gauge(enc, "mismatch_routing_agreement", "Fraction of (token, MoE layer) pairs whose top-k sets equal the actor's.", a)?;
        gauge(enc, "mismatch_routing_overlap", "Mean |learner and actor experts| / k.", o)?;
    }
    let routing = || r.mismatch.routing_layers.iter().map(|l| ([("layer", l.layer)], l));
    family(enc, "mismatch_routing_agreement_by_layer", "Routing agreement per MoE layer.", routing().map(|(k, l)| (k, l.agreement)))?;
    family(enc, "mismatch_routing_overlap_by_layer", "Routing overlap per MoE layer.", routing().map(|(k, l)| (k, l.overlap)))?;

    let layers = || r.moe.iter().map(|h| ([("layer", h.layer)], h));
    family(enc, "moe_max_vio", "MaxVio of the expert load.", layers().map(|(k, h)| (k, h.max_vio)))?;
    family(enc, "moe_cv", "Coefficient of variation of the expert load.", layers().map(|(k, h)| (k, h.cv)))?;
    family(enc, "moe_load_entropy", "Entropy of the expert load.", layers().map(|(k, h)| (k, h.load_entropy)))?;
    family(enc, "moe_router_entropy", "Mean router entropy.", layers().map(|(k, h)| (k, h.router_entropy)))?;
    family(enc, "moe_dead_experts", "Experts that got no tokens.", layers().map(|(k, h)| (k, h.dead_experts)))?;
    let loads = layers().flat_map(|(k, h)| {
        h.load.iter().enumerate().map(move |(e, &load)| ((k, [("expert", e)]), load))
    });
    family(enc, "moe_load", "Load share of each expert.", loads)?;

    for (name, help, v) in [
        ("loss_spike", "1 when the policy loss was a spike.", Value::from(r.spikes.spike)),
        ("loss_spikes_total", "Loss spikes so far in the run.", r.spikes.count.into()),
        ("service_open_groups", "Groups handed out, not yet completed.", sv.open_groups.into()),
        ("service_groups_waiting", "Completed groups waiting for the trainer.", sv.groups_waiting.into()),
        ("service_groups_completed", "Groups completed so far.", sv.groups_completed.into()),
        ("service_groups_expired", "Groups expired so far.", sv.groups_expired.into()),
        ("service_episodes_issued", "Episodes handed out so far, handed-out-again ones included.", sv.episodes_issued.into()),
        ("service_episodes_reclaimed", "Episodes taken back from silent actors.", sv.episodes_reclaimed.into()),
        ("service_actors_active", "Actors heard from within the timeout.", sv.actors_active.into()),
        ("service_trajectories_read", "Finished trajectories read by the trainer.", sv.trajectories_read.into()),
        ("service_batches_skipped", "Batches consumed without an update.", sv.batches_skipped.into()),
    ] {
        gauge(enc, name, help, v)?;
    }

    family(enc, "curriculum_frontier", "Frontier level per task family.",
        c.frontier.iter().map(|(f, &level)| ([("family", f.as_str())], level)))?;
    gauge(enc, "curriculum_context_tokens", "Context of the current stage, tokens.", c.context_tokens)?;
    gauge(enc, "curriculum_rope_factor", "RoPE scaling factor of the published policy (1: unscaled).", c.rope_factor)
}

/// The collector behind the endpoint: the live gauges, then the latest record, read at
/// every scrape.
struct Figures {
    latest: Arc<RwLock<Option<UpdateRecord>>>,
    live: LiveGauges,
}

impl fmt::Debug for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Figures").finish_non_exhaustive()
    }
}

impl Collector for Figures {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        for (name, v) in (self.live)() {
            gauge(
                &mut enc,
                &name,
                "Live service figure, read at scrape time.",
                v,
            )?;
        }
        let latest = self.latest.read().unwrap_or_else(PoisonError::into_inner);
        match latest.as_ref() {
            Some(r) => encode_record(&mut enc, r),
            None => Ok(()),
        }
    }
}

/// A registry whose one collector is `figures`, named under `corvid_`.
fn registry(figures: Figures) -> Registry {
    let mut registry = Registry::with_prefix("corvid");
    registry.register_collector(Box::new(figures));
    registry
}

/// The classic Prometheus text (0.0.4) of `record` and `live`: what a plain `GET /metrics`
/// answers. Every series is a gauge:
///
/// | series | labels |
/// |---|---|
/// | `corvid_<name>` for each live gauge | |
/// | `corvid_update_step`, `corvid_policy_version`, `corvid_update_seconds` | |
/// | `corvid_rollout_{episodes, episodes_trained, reward_mean, success_rate, tokens, episodes_per_second, tokens_per_second, staleness_mean, staleness_max, stale_skipped, unscored_skipped, uninformative_groups, too_long_skipped, invalid_skipped, copies_skipped, template_divergent_episodes, folded_episodes, folds, episode_tokens_mean}` | |
/// | `corvid_rollout_task_success_rate`, `corvid_rollout_task_episodes` | `family`, `level` |
/// | `corvid_loss_{policy, kl, entropy, balance, clip_frac_low, clip_frac_high, approx_kl, iw_mean, iw_max, iw_truncated_frac, grad_norm, lr, optimizer_steps, adv_mean, adv_abs_mean}` | |
/// | `corvid_mismatch_{k3_kl, token_mult_prob_error, logp_abs_diff_mean, logp_abs_diff_max, ratio_above_2_frac, without_routes}` | |
/// | `corvid_mismatch_k3_kl_lag0` (when a token of `π_old`'s own version was trained on) | |
/// | `corvid_mismatch_routing_{agreement, overlap}` (when routes were recorded), `…_by_layer` | `layer` |
/// | `corvid_moe_{max_vio, cv, load_entropy, router_entropy, dead_experts}` | `layer` |
/// | `corvid_moe_load` | `layer`, `expert` |
/// | `corvid_loss_spike` (0 or 1), `corvid_loss_spikes_total` | |
/// | `corvid_service_{open_groups, groups_waiting, groups_completed, groups_expired, episodes_issued, episodes_reclaimed, actors_active, trajectories_read, batches_skipped}` | |
/// | `corvid_curriculum_frontier` | `family` |
/// | `corvid_curriculum_context_tokens`, `corvid_curriculum_rope_factor` | |
///
/// Without a record only the live gauges are there.
pub fn render_prometheus(record: Option<&UpdateRecord>, live: &[(String, f64)]) -> String {
    let live = live.to_vec();
    let registry = registry(Figures {
        latest: Arc::new(RwLock::new(record.cloned())),
        live: Arc::new(move || live.clone()),
    });
    Exposition::Classic
        .encode(&registry)
        .expect("the text encoders fail only when the writer does, and a String never does")
}

/// The answer to one request.
fn answer(registry: &Registry, req: &Request<Incoming>) -> Response<String> {
    let reply = |status: StatusCode, content_type: &'static str, body: String| {
        let mut res = Response::new(body);
        *res.status_mut() = status;
        res.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        res
    };
    if req.method() != Method::GET || !matches!(req.uri().path(), "/metrics" | "/") {
        return reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "only GET /metrics is served here\n".to_owned(),
        );
    }
    let exposition = Exposition::negotiate(req.headers().get_all(ACCEPT));
    match exposition.encode(registry) {
        Ok(text) => reply(StatusCode::OK, exposition.content_type(), text),
        Err(fmt::Error) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain; charset=utf-8",
            "the metrics could not be encoded\n".to_owned(),
        ),
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown` resolves: the latest record of
/// `latest` and the `live` gauges, read at each scrape.
pub async fn serve_prometheus(
    listener: TcpListener,
    latest: Arc<RwLock<Option<UpdateRecord>>>,
    live: LiveGauges,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let registry = Arc::new(registry(Figures { latest, live }));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.keep_alive(false)
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_REQUEST_BYTES);
    tokio::pin!(shutdown);
    loop {
        let (sock, _) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics endpoint: accept failed");
                    continue;
                }
            },
        };
        let registry = Arc::clone(&registry);
        let service = hyper::service::service_fn(move |req| {
            let res = answer(&registry, &req);
            async move { Ok::<_, Infallible>(res) }
        });
        let conn = http.serve_connection(TokioIo::new(sock), service);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "metrics endpoint: connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use corvid_model::MoeHealth;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::metrics::Rate;

    #[test]
    fn prometheus_text_carries_the_records_figures() {
        let mut r = UpdateRecord {
            step: 7,
            policy_version: 8,
            ..UpdateRecord::default()
        };
        r.loss.policy = -0.25;
        r.mismatch.token_mult_prob_error = 1.5;
        r.service.batches_skipped = 2;
        r.rollout.success_by_task.insert(
            "hops/2".into(),
            Rate {
                episodes: 4,
                successes: 1,
                rate: 0.25,
            },
        );
        r.moe.push(MoeHealth {
            layer: 1,
            load: vec![0.5, 0.5],
            dead_experts: 0,
            max_vio: 0.0,
            ..MoeHealth::default()
        });
        let text = render_prometheus(Some(&r), &[("actors_active".into(), 3.0)]);
        for want in [
            "corvid_actors_active 3\n",
            "corvid_update_step 7\n",
            "corvid_policy_version 8\n",
            "corvid_loss_policy -0.25\n",
            "corvid_mismatch_token_mult_prob_error 1.5\n",
            "corvid_rollout_task_success_rate{family=\"hops\",level=\"2\"} 0.25\n",
            "corvid_moe_load{layer=\"1\",expert=\"1\"} 0.5\n",
            "corvid_service_batches_skipped 2\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }

    #[test]
    fn each_series_is_one_gauge_family_and_values_are_exact() {
        let mut r = UpdateRecord::default();
        r.loss.kl = 0.1 + 0.2;
        r.loss.lr = 3e-7;
        r.loss.policy = f64::NAN;
        r.rollout.tokens = u64::MAX;
        for task in ["hops/1", "hops/2", "sort/1"] {
            r.rollout
                .success_by_task
                .insert(task.into(), Rate::default());
        }
        r.curriculum.frontier.insert("a\"b".into(), 2);
        r.moe = (0..2)
            .map(|layer| MoeHealth {
                layer,
                load: vec![0.25; 4],
                ..MoeHealth::default()
            })
            .collect();
        let text = render_prometheus(Some(&r), &[]);
        let mut families = BTreeSet::new();
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let mut parts = line["# TYPE ".len()..].split(' ');
            let name = parts.next().unwrap().to_owned();
            assert_eq!(parts.next(), Some("gauge"), "{line}");
            assert!(families.insert(name), "{line} twice in\n{text}");
        }
        assert!(families.contains("corvid_rollout_task_episodes"));
        assert!(
            !text.contains("# EOF"),
            "the classic format has no EOF marker"
        );
        let value = |series: &str| -> f64 {
            let line = text
                .lines()
                .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
                .unwrap_or_else(|| panic!("no {series} in\n{text}"));
            line[series.len() + 1..].parse().unwrap()
        };
        assert_eq!(value("corvid_loss_kl").to_bits(), (0.1f64 + 0.2).to_bits());
        assert_eq!(value("corvid_loss_lr").to_bits(), 3e-7f64.to_bits());
        assert!(value("corvid_loss_policy").is_nan());
        assert!(text.contains(&format!("corvid_rollout_tokens {}\n", u64::MAX)));
        assert!(
            text.contains("corvid_curriculum_frontier{family=\"a\\\"b\"} 2\n"),
            "{text}"
        );
        assert_eq!(text.matches("corvid_moe_load{").count(), 8);
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
        let server = tokio::spawn(serve_prometheus(
            listener,
            Arc::clone(&latest),
            live,
            async {
                let _ = stopped.await;
            },
        ));
        let get = |path: &'static str, accept: &'static str| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{accept}\r\n");
            s.write_all(request.as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        let ok = get("/metrics", "").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        assert!(
            ok.contains("content-type: text/plain; version=0.0.4"),
            "{ok}"
        );
        assert!(ok.contains("corvid_update_step 42\n"));
        assert!(ok.contains("corvid_trajectories_stored 9\n"));
        // A new record is what the next scrape sees.
        latest.write().unwrap().as_mut().unwrap().step = 43;
        assert!(get("/", "").await.contains("corvid_update_step 43\n"));
        let om = get(
            "/metrics",
            "Accept: application/openmetrics-text;version=1.0.0\r\n",
        )
        .await;
        assert!(
            om.contains("content-type: application/openmetrics-text"),
            "{om}"
        );
        assert!(
            om.contains("corvid_update_step 43\n") && om.ends_with("# EOF\n"),
            "{om}"
        );
        assert!(get("/other", "").await.starts_with("HTTP/1.1 404"));
        stop.send(()).unwrap();
        server.await.unwrap();
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "stopped serving"
        );
    }
}

//! The Kubernetes manifests under `deploy/k8s`, offline. Every YAML file passes
//! `kubernetes-validate --strict` (pinned at 1.37.0; `make` installs it into `.corvid/venv`)
//! against the API schemas of the oldest Kubernetes the manifests are meant for and of the
//! newest the validator knows, and the validator is shown to refuse an unknown field and an
//! unknown kind. Every kustomization lists exactly the manifests in its folder, and the base
//! ships no Secret. The wiring the learner and the actors rely on holds: the probes ask the
//! gRPC health service on the gRPC port for the names the learner answers, the learner's config
//! (parsed and validated by the learner's own code) listens where the ports and Services point
//! and keeps its run folder, token and config where the volumes are mounted, and the actors'
//! flags name the learner's Service, the same Secret, a mounted spool and their pod name, with a
//! termination grace period that covers their own grace and final drain.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use corvid_learner::config::LearnerConfig;
use serde_json::Value;

/// Kubernetes versions every manifest must validate against: 1.30, the oldest the manifests
/// are meant for (gRPC probes and autoscaling/v2 are GA well before it), and 1.37, the newest
/// the pinned validator has schemas for.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.30.0", "1.37.0"];

/// The name Kustomize reads in a folder.
const KUSTOMIZATION: &str = "kustomization.yaml";

fn repo() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // Canonical, so that failures name plain paths.
    root.canonicalize().unwrap_or(root)
}

fn k8s_dir() -> PathBuf {
    repo().join("deploy/k8s")
}

/// A program of the bootstrapped virtualenv; its absence fails the test with what to do.
fn venv_bin(name: &str) -> PathBuf {
    let path = repo().join(".corvid/venv/bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: run `make` (scripts/bootstrap.sh installs kubernetes-validate==1.37.0 \
         and PyYAML into the virtualenv linked at .corvid/venv)",
        path.display()
    );
    path
}

/// Every `.yaml`/`.yml` file under `dir`, sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.expect("folder entry").path();
            if path.is_dir() {
                todo.push(path);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn is_kustomization(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()) == Some(KUSTOMIZATION)
}

/// The Kubernetes resources under `deploy/k8s` (every YAML file but the kustomizations).
fn resource_files() -> Vec<PathBuf> {
    yaml_files(&k8s_dir())
        .into_iter()
        .filter(|p| !is_kustomization(p))
        .collect()
}

/// The documents of each YAML file, read by PyYAML (the validator's own parser) as JSON.
fn parse_yaml(files: &[PathBuf]) -> BTreeMap<PathBuf, Vec<Value>> {
    let script = "import json, sys, yaml\n\
                  out = {}\n\
                  for p in sys.argv[1:]:\n    \
                      with open(p) as f:\n        \
                          out[p] = [d for d in yaml.safe_load_all(f) if d is not None]\n\
                  print(json.dumps(out))\n";
    let out = Command::new(venv_bin("python"))
        .arg("-c")
        .arg(script)
        .args(files)
        .output()
        .expect("running the virtualenv's python");
    assert!(
        out.status.success(),
        "PyYAML could not read the manifests: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: BTreeMap<String, Vec<Value>> =
        serde_json::from_slice(&out.stdout).expect("PyYAML's JSON");
    parsed
        .into_iter()
        .map(|(k, v)| (PathBuf::from(k), v))
        .collect()
}

/// Every YAML file under `deploy/k8s`, parsed once.
fn manifests() -> &'static BTreeMap<PathBuf, Vec<Value>> {
    static PARSED: OnceLock<BTreeMap<PathBuf, Vec<Value>>> = OnceLock::new();
    PARSED.get_or_init(|| parse_yaml(&yaml_files(&k8s_dir())))
}

/// What the validator said about one file.
#[derive(Debug, Default)]
struct Verdict {
    /// Resources it checked and found valid.
    passed: usize,
    /// Its ERROR and WARN lines: a failed check, or a kind it has no schema for (which it
    /// lets pass with exit status 0, unchecked).
    problems: Vec<String>,
}

impl Verdict {
    fn ok(&self) -> bool {
        self.passed > 0 && self.problems.is_empty()
    }
}

/// Runs `kubernetes-validate --strict` for `version` on `files`; one verdict per file.
fn validate(files: &[PathBuf], version: &str) -> BTreeMap<PathBuf, Verdict> {
    let out = Command::new(venv_bin("kubernetes-validate"))
        .args(["--strict", "--kubernetes-version", version])
        .args(files)
        .output()
        .expect("running kubernetes-validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut verdicts: BTreeMap<PathBuf, Verdict> = files
        .iter()
        .map(|f| (f.clone(), Verdict::default()))
        .collect();
    for line in text.lines() {
        let Some((level, rest)) = line.split_once(' ') else {
            continue;
        };
        let Some(file) = files.iter().find(|f| {
            rest.strip_prefix(f.to_str().expect("UTF-8 path"))
                .is_some_and(|r| r.starts_with(' '))
        }) else {
            continue;
        };
        let v = verdicts.get_mut(file).expect("a verdict per file");
        match level {
            "INFO" if rest.contains(" passed for resource ") => v.passed += 1,
            "INFO" => {}
            _ => v.problems.push(line.to_owned()),
        }
    }
    let all_ok = verdicts.values().all(Verdict::ok);
    assert!(
        !all_ok || out.status.success(),
        "kubernetes-validate failed although every file passed:\n{text}"
    );
    verdicts
}

#[test]
fn every_manifest_passes_strict_validation_against_the_kubernetes_schemas() {
    let files = resource_files();
    assert!(
        files.len() >= 8,
        "too few manifests found under {}: {files:?}",
        k8s_dir().display()
    );
    // One resource per file: the kustomization's list is then the list of resources.
    for file in &files {
        let docs = &manifests()[file];
        assert_eq!(docs.len(), 1, "{}: one resource per file", file.display());
    }
    for version in KUBERNETES_VERSIONS {
        let verdicts = validate(&files, version);
        let failed: Vec<String> = verdicts
            .iter()
            .filter(|(_, v)| !v.ok())
            .map(|(f, v)| format!("{}: {:?}", f.display(), v))
            .collect();
        assert!(
            failed.is_empty(),
            "against Kubernetes {version}:\n{}",
            failed.join("\n")
        );
    }
}

#[test]
fn the_validator_refuses_an_unknown_field_and_an_unknown_kind() {
    let dir = tempfile::tempdir().expect("temporary folder");
    let actor = std::fs::read_to_string(k8s_dir().join("base/actor-deployment.yaml"))
        .expect("the actor Deployment");
    // The valid manifest passes from this folder too; the same one with a misspelt field
    // does not, and the failure names the field.
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, &actor).expect("write");
    let typo = dir.path().join("typo.yaml");
    let broken = actor.replacen("\n  replicas: 2\n", "\n  replicas: 2\n  replicaz: 2\n", 1);
    assert_ne!(broken, actor, "the field to break was found");
    std::fs::write(&typo, broken).expect("write");
    // A kind the validator has no schema for passes its exit status unchecked; the verdict
    // counts it as a failure.
    let unknown = dir.path().join("unknown.yaml");
    std::fs::write(
        &unknown,
        "apiVersion: example.invalid/v1\nkind: Widget\nmetadata:\n  name: w\n",
    )
    .expect("write");
    let verdicts = validate(&[good.clone(), typo.clone(), unknown.clone()], "1.37.0");
    assert!(verdicts[&good].ok(), "{:?}", verdicts[&good]);
    let v = &verdicts[&typo];
    assert!(
        !v.ok()
            && v.problems
                .iter()
                .any(|p| p.contains("'replicaz' was unexpected")),
        "{v:?}"
    );
    let v = &verdicts[&unknown];
    assert!(
        !v.ok() && v.problems.iter().any(|p| p.contains("Widget")),
        "{v:?}"
    );
}

/// The local files a kustomization names (its resources and patch files), and the
/// folders (other kustomizations) it builds on.
fn kustomization_entries(path: &Path, k: &Value) -> (BTreeSet<PathBuf>, BTreeSet<PathBuf>) {
    let dir = path.parent().expect("a folder");
    let mut files = BTreeSet::new();
    let mut bases = BTreeSet::new();
    let resources = k["resources"].as_array().cloned().unwrap_or_default();
    let patches = k["patches"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("path").cloned());
    for entry in resources.into_iter().chain(patches) {
        let name = entry
            .as_str()
            .unwrap_or_else(|| panic!("{}: an entry that is no path: {entry}", path.display()));
        let target = dir.join(name);
        if target.is_dir() {
            bases.insert(target);
        } else {
            assert!(
                target.is_file(),
                "{} lists {name}, which does not exist",
                path.display()
            );
            files.insert(target);
        }
    }
    (files, bases)
}

#[test]
fn every_kustomization_lists_exactly_the_manifests_in_its_folder() {
    let base = k8s_dir().join("base").join(KUSTOMIZATION);
    assert!(base.is_file(), "{} is missing", base.display());
    let mut applied = Vec::new();
    for (path, docs) in manifests().iter().filter(|(p, _)| is_kustomization(p)) {
        let k = &docs[0];
        assert_eq!(
            k["apiVersion"], "kustomize.config.k8s.io/v1beta1",
            "{path:?}"
        );
        assert_eq!(k["kind"], "Kustomization", "{path:?}");
        let (listed, bases) = kustomization_entries(path, k);
        for b in &bases {
            assert!(
                b.join(KUSTOMIZATION).is_file(),
                "{} builds on {}, which has no {KUSTOMIZATION}",
                path.display(),
                b.display()
            );
        }
        let dir = path.parent().expect("a folder");
        let beside: BTreeSet<PathBuf> = std::fs::read_dir(dir)
            .expect("the kustomization's folder")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.is_file() && !is_kustomization(p))
            .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
            .collect();
        let canonical = |s: &BTreeSet<PathBuf>| -> BTreeSet<PathBuf> {
            s.iter()
                .map(|p| p.canonicalize().expect("an existing file"))
                .collect()
        };
        let (listed, beside) = (canonical(&listed), canonical(&beside));
        let forgotten: Vec<_> = beside.difference(&listed).collect();
        assert!(
            forgotten.is_empty(),
            "{} does not list {forgotten:?}",
            path.display()
        );
        let elsewhere: Vec<_> = listed.difference(&beside).collect();
        assert!(
            elsewhere.is_empty(),
            "{} lists files outside its folder: {elsewhere:?}",
            path.display()
        );
        applied.extend(listed);
    }
    // The token is the operator's: an apply must never replace it with a committed value.
    let by_canonical: BTreeMap<PathBuf, &Vec<Value>> = manifests()
        .iter()
        .map(|(p, d)| (p.canonicalize().expect("existing"), d))
        .collect();
    for file in &applied {
        for doc in by_canonical[file] {
            assert_ne!(
                doc["kind"],
                "Secret",
                "{} is applied by a kustomization and is a Secret",
                file.display()
            );
        }
    }
    let template = &manifests()[&k8s_dir().join("examples/token-secret.yaml")][0];
    assert_eq!(template["metadata"]["name"], "corvid-token");
    let token = template["stringData"]["token"].as_str().unwrap_or_default();
    assert!(
        token.starts_with("REPLACE-ME"),
        "the Secret template holds a placeholder, not a token: {token:?}"
    );
}

/// The one resource of `kind` named `name` in the base.
fn base_resource(kind: &str, name: &str) -> &'static Value {
    let base = k8s_dir().join("base");
    let found: Vec<&Value> = manifests()
        .iter()
        .filter(|(p, _)| p.parent() == Some(base.as_path()))
        .flat_map(|(_, docs)| docs)
        .filter(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "{kind} {name} in the base: {}", found.len());
    found[0]
}

/// The pod template's container `name`.
fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The container port named `name`.
fn port(container: &Value, name: &str) -> u64 {
    container["ports"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name))
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no container port {name}"))
}

/// The path where the pod volume whose source `source` (e.g. `secret`) names `object` is
/// mounted in `container`, and the volume.
fn mount_of<'a>(
    workload: &'a Value,
    container: &Value,
    source: &str,
    field: &str,
    object: &str,
) -> (PathBuf, &'a Value) {
    let volume = workload["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v[source][field] == object))
        .unwrap_or_else(|| panic!("no {source} volume of {object}"));
    (mount_path(container, &volume["name"]), volume)
}

/// Where the volume `name` is mounted in `container`.
fn mount_path(container: &Value, name: &Value) -> PathBuf {
    container["volumeMounts"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| &m["name"] == name))
        .and_then(|m| m["mountPath"].as_str())
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("volume {name} is not mounted"))
}

/// The container's `--flag=value` arguments.
fn flags(container: &Value) -> BTreeMap<String, String> {
    container["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str())
        .filter_map(|a| a.strip_prefix("--"))
        .map(|a| match a.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => (a.to_owned(), String::new()),
        })
        .collect()
}

/// Whether `labels` holds every pair of `selector`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| &labels[k] == v))
}

#[test]
fn the_learner_probes_ask_the_health_service_on_the_grpc_port() {
    let sts = base_resource("StatefulSet", "corvid-learner");
    let learner = container(sts, "learner");
    let grpc = port(learner, "grpc");
    let probe = |kind: &str| -> (u64, String) {
        let p = &learner[kind];
        for other in ["exec", "httpGet", "tcpSocket"] {
            assert!(p.get(other).is_none(), "{kind} uses {other}, not grpc");
        }
        let port = p["grpc"]["port"]
            .as_u64()
            .unwrap_or_else(|| panic!("{kind} has no grpc port"));
        let service = p["grpc"]["service"].as_str().unwrap_or_default().to_owned();
        (port, service)
    };
    // The process as a whole: SERVING as soon as it serves, SFT included, so neither
    // probe that restarts the container waits for SFT.
    assert_eq!(probe("startupProbe"), (grpc, String::new()));
    assert_eq!(probe("livenessProbe"), (grpc, String::new()));
    // The learner's own service: SERVING once it can hand out work, NOT_SERVING while it
    // stops.
    assert_eq!(
        probe("readinessProbe"),
        (
            grpc,
            corvid_proto::encoded::learner_server::SERVICE_NAME.to_owned()
        )
    );
}

#[test]
fn the_learner_config_matches_the_manifests() {
    let sts = base_resource("StatefulSet", "corvid-learner");
    let learner = container(sts, "learner");
    assert_eq!(
        sts["spec"]["replicas"], 1,
        "sled's store admits one process"
    );
    let args = flags(learner);
    assert!(
        args.contains_key("resume-if-any"),
        "a restarted pod continues its run: {args:?}"
    );
    // A checkpoint after SIGTERM needs the update in progress and the write.
    let grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap_or(30);
    assert!(grace >= 300, "terminationGracePeriodSeconds {grace}");

    // The config: the ConfigMap's file at the path --config names.
    let config_path = PathBuf::from(args.get("config").expect("--config"));
    let cm_name = "corvid-learner-config";
    let (mounted_at, _) = mount_of(sts, learner, "configMap", "name", cm_name);
    assert_eq!(config_path.parent(), Some(mounted_at.as_path()));
    let key = config_path
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a file name");
    let toml = base_resource("ConfigMap", cm_name)["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("the ConfigMap has no key {key}"));
    let cfg = LearnerConfig::from_toml(toml).expect("the learner accepts its config");

    // Addresses: every interface, on the ports the pod declares.
    let listen: SocketAddr = cfg.listen.parse().expect("listen");
    assert!(listen.ip().is_unspecified(), "listen {listen}");
    assert_eq!(u64::from(listen.port()), port(learner, "grpc"));
    let metrics: SocketAddr = cfg.metrics.prometheus.parse().expect("prometheus");
    assert!(metrics.ip().is_unspecified(), "prometheus {metrics}");
    assert_eq!(u64::from(metrics.port()), port(learner, "metrics"));

    // The run folder on the claim, the token from the Secret (read, never created).
    let claim = sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"].clone();
    assert_eq!(
        sts["spec"]["volumeClaimTemplates"].as_array().map(Vec::len),
        Some(1)
    );
    let run_dir = cfg.run_dir();
    assert!(
        run_dir.starts_with(mount_path(learner, &claim)),
        "run_dir {} is not on the claim",
        run_dir.display()
    );
    let (token_path, may_create) = cfg.token_path();
    assert!(!may_create, "the token file is set, so never created");
    let (secret_at, secret) = mount_of(sts, learner, "secret", "secretName", "corvid-token");
    assert!(secret["secret"].get("items").is_none(), "every key a file");
    assert_eq!(token_path, secret_at.join("token"));
    // A learner that stops on its own would be restarted, resume and stop again.
    assert_eq!(cfg.schedule.max_updates, 0);

    // The Services: a headless one governing the StatefulSet, a ClusterIP one for actors,
    // both selecting the learner pod.
    let pod_labels = &sts["spec"]["template"]["metadata"]["labels"];
    assert!(selects(&sts["spec"]["selector"]["matchLabels"], pod_labels));
    let governing = sts["spec"]["serviceName"].as_str().expect("serviceName");
    let headless = base_resource("Service", governing);
    assert_eq!(headless["spec"]["clusterIP"], "None");
    let front = base_resource("Service", "corvid-learner");
    for svc in [headless, front] {
        assert!(selects(&svc["spec"]["selector"], pod_labels), "{svc}");
        let targets: Vec<&Value> = svc["spec"]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .map(|p| &p["targetPort"])
            .collect();
        assert!(targets.contains(&&Value::from("grpc")), "{svc}");
    }
}

#[test]
fn the_actor_flags_point_at_the_learner_and_the_mounts() {
    let deploy = base_resource("Deployment", "corvid-actor");
    let actor = container(deploy, "actor");
    let args = flags(actor);

    // The learner's ClusterIP Service on its gRPC port, a URL the actor accepts.
    let front = base_resource("Service", "corvid-learner");
    let svc_port = front["spec"]["ports"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "grpc"))
        .and_then(|p| p["port"].as_u64())
        .expect("the Service's grpc port");
    let url = args.get("learner").expect("--learner");
    assert_eq!(url, &format!("http://corvid-learner:{svc_port}"));
    corvid_proto::client::learner_endpoint(url).expect("a URL the actor accepts");

    // The same Secret as the learner's, its token key.
    let (secret_at, _) = mount_of(deploy, actor, "secret", "secretName", "corvid-token");
    assert_eq!(
        args.get("token-file").map(PathBuf::from),
        Some(secret_at.join("token"))
    );
    // The spool on a volume of its own (the root file system is read-only).
    let spool = PathBuf::from(args.get("spool").expect("--spool"));
    let volumes = deploy["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .expect("volumes");
    assert!(
        volumes.iter().any(
            |v| v.get("emptyDir").is_some() && spool.starts_with(mount_path(actor, &v["name"]))
        ),
        "--spool {} is on no mounted emptyDir",
        spool.display()
    );
    // Each actor named after its pod.
    assert_eq!(args.get("name").map(String::as_str), Some("$(POD_NAME)"));
    let pod_name = actor["env"]
        .as_array()
        .and_then(|es| es.iter().find(|e| e["name"] == "POD_NAME"))
        .expect("env POD_NAME");
    assert_eq!(
        pod_name["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    let concurrency: usize = args
        .get("concurrency")
        .and_then(|c| c.parse().ok())
        .expect("--concurrency");
    assert!(concurrency >= 1);

    // The pod's grace covers in-flight episodes' grace and the final drain of the spool.
    let grace_s: f64 = args
        .get("grace-s")
        .and_then(|g| g.parse().ok())
        .expect("--grace-s");
    let drain_s: f64 = args
        .get("drain-s")
        .and_then(|g| g.parse().ok())
        .expect("--drain-s");
    let pod_grace = deploy["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_f64()
        .unwrap_or(30.0);
    assert!(
        pod_grace > grace_s + drain_s,
        "terminationGracePeriodSeconds {pod_grace} <= --grace-s {grace_s} + drain {drain_s}"
    );
    for bound in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            assert!(
                actor["resources"][bound][resource].is_string(),
                "actor {bound}.{resource}"
            );
        }
    }

    // The disruption budget and the autoscaler act on these pods.
    let pod_labels = &deploy["spec"]["template"]["metadata"]["labels"];
    let pdb = base_resource("PodDisruptionBudget", "corvid-actor");
    assert!(selects(&pdb["spec"]["selector"]["matchLabels"], pod_labels));
    let hpa = &manifests()[&k8s_dir().join("examples/autoscale/actor-hpa.yaml")][0];
    assert_eq!(hpa["apiVersion"], "autoscaling/v2");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["kind"], "Deployment");
    assert_eq!(
        hpa["spec"]["scaleTargetRef"]["name"],
        deploy["metadata"]["name"]
    );
    assert_eq!(hpa["spec"]["metrics"][0]["resource"]["name"], "cpu");
}

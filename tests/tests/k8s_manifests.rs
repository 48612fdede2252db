//! The Kubernetes manifests of `infra/k8s/` against the schemas they are applied with: every
//! document of every file through `infra/k8s/validate.py` — built-in kinds with
//! kubernetes-validate (the Kubernetes OpenAPI schemas it ships), KEDA's `ScaledObject` and
//! `TriggerAuthentication` with the CRD schemas in `../shared/schemas/keda/`, both strict (an
//! unknown field is an error) — and then what the schemas cannot say: the worker's grace above
//! its drain, no preStop, KEDA counting in-flight work, scale to zero, cooldowns sized from
//! the longest mini-batch. A deliberately broken copy of each kind must be refused, so the
//! validator is seen to reject.
//!
//! Needs the validator's venv: `infra/k8s-validate` (infra/run-tests runs it) makes
//! `target/k8s-validate`; `BATCHFLEET_K8S_PYTHON` names another interpreter with
//! kubernetes-validate. The KEDA schemas are found in the first `shared/schemas/keda` beside
//! the repository or one of its parent folders, or in `BATCHFLEET_KEDA_SCHEMAS`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use batchfleet_tests::describe;
use batchfleet_tests::fleet::run_bounded;
use batchfleet_tests::repo_root;
use serde_json::Value;

const VALIDATE_LIMIT: Duration = Duration::from_secs(120);
/// What the worker still needs after its drain grace (worker/src/worker.rs): slots still busy
/// are given back within 15 s (`ABANDON_AFTER`), the last batch events get 10 s.
const AFTER_DRAIN_SECS: i64 = 15 + 10;
/// The drain grace covers the longest mini-batch and this much for its upload.
const UPLOAD_MARGIN_SECS: i64 = 30;

fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("BATCHFLEET_K8S_PYTHON") {
        return PathBuf::from(python);
    }
    let python = repo_root().join("target/k8s-validate/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run infra/k8s-validate first (infra/run-tests does), or set \
         BATCHFLEET_K8S_PYTHON to a Python with kubernetes-validate",
        python.display()
    );
    python
}

fn keda_schemas() -> PathBuf {
    if let Some(dir) = std::env::var_os("BATCHFLEET_KEDA_SCHEMAS") {
        return PathBuf::from(dir);
    }
    let root = repo_root();
    root.ancestors()
        .skip(1)
        .map(|dir| dir.join("shared/schemas/keda"))
        .find(|dir| dir.join("keda.sh_scaledobjects.yaml").exists())
        .unwrap_or_else(|| {
            panic!(
                "KEDA's CRD schemas are missing: no shared/schemas/keda/keda.sh_scaledobjects.yaml \
                 beside {} or any parent folder (set BATCHFLEET_KEDA_SCHEMAS to the folder)",
                root.display()
            )
        })
}

fn manifests() -> Vec<PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|ext| ext == "yaml" || ext == "yml") {
                found.push(path);
            }
        }
    }
    let mut found = Vec::new();
    walk(&repo_root().join("infra/k8s"), &mut found);
    found.sort();
    found
}

/// One validated document.
#[derive(Debug)]
struct Document {
    file: String,
    kind: String,
    name: String,
    errors: Vec<String>,
    object: Value,
}

fn validate(files: &[PathBuf]) -> Vec<Document> {
    let mut command = Command::new(python());
    command
        .arg(repo_root().join("infra/k8s/validate.py"))
        .arg("--keda-schemas")
        .arg(keda_schemas())
        .args(files);
    let output = run_bounded(&mut command, VALIDATE_LIMIT);
    assert!(output.status.success(), "infra/k8s/validate.py failed\n{}", describe(&output));
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .map(|line| {
            let doc: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("validate.py printed {line:?}: {e}"));
            let field = |key: &str| doc[key].as_str().unwrap_or("").to_string();
            Document {
                file: field("file"),
                kind: field("kind"),
                name: field("name"),
                errors: doc["errors"]
                    .as_array()
                    .map(|errors| {
                        errors.iter().filter_map(Value::as_str).map(String::from).collect()
                    })
                    .unwrap_or_default(),
                object: doc["object"].clone(),
            }
        })
        .collect()
}

fn one<'a>(docs: &'a [Document], kind: &str, name: &str, file_part: &str) -> &'a Document {
    let found: Vec<&Document> = docs
        .iter()
        .filter(|d| d.kind == kind && d.name == name && d.file.contains(file_part))
        .collect();
    assert_eq!(found.len(), 1, "expected one {kind} {name} in a file under {file_part}");
    found[0]
}

fn int(value: &Value, what: &str) -> i64 {
    value.as_i64().unwrap_or_else(|| panic!("{what} is not an integer: {value}"))
}

/// The worker container's environment variables given by value.
fn env_of(container: &Value) -> BTreeMap<String, String> {
    container["env"]
        .as_array()
        .map(|vars| {
            vars.iter()
                .filter_map(|var| {
                    Some((var["name"].as_str()?.into(), var["value"].as_str()?.into()))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_manifest_passes_the_kubernetes_and_keda_schemas() {
    let files = manifests();
    assert!(files.len() >= 5, "expected the manifests under infra/k8s, found {files:?}");
    let docs = validate(&files);
    let invalid: Vec<String> = docs
        .iter()
        .filter(|d| !d.errors.is_empty())
        .map(|d| format!("{} ({} {}): {}", d.file, d.kind, d.name, d.errors.join("; ")))
        .collect();
    assert!(invalid.is_empty(), "manifests refused by their schemas:\n{}", invalid.join("\n"));
    let kinds: Vec<&str> = docs.iter().map(|d| d.kind.as_str()).collect();
    for kind in ["Deployment", "ConfigMap", "Secret", "ScaledObject", "TriggerAuthentication"] {
        assert!(kinds.contains(&kind), "no {kind} among {kinds:?}");
    }
}

#[test]
fn scaling_settings_keep_busy_workers_and_in_flight_work() {
    let docs = validate(&manifests());
    let worker = one(&docs, "Deployment", "batchfleet-worker", "base/");
    let pod = &worker.object["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let env = env_of(container);
    let drain: i64 = env
        .get("BATCHFLEET_DRAIN_GRACE")
        .and_then(|v| v.parse().ok())
        .expect("the worker sets BATCHFLEET_DRAIN_GRACE");
    let grace = int(&pod["terminationGracePeriodSeconds"], "terminationGracePeriodSeconds");
    assert!(
        grace > drain + AFTER_DRAIN_SECS,
        "terminationGracePeriodSeconds {grace} must exceed the drain grace {drain} + \
         {AFTER_DRAIN_SECS} s the worker needs after it"
    );
    assert!(container["lifecycle"]["preStop"].is_null(), "no preStop hook: it eats the grace");
    let concurrency: i64 = env
        .get("BATCHFLEET_CONCURRENCY")
        .and_then(|v| v.parse().ok())
        .expect("the worker sets BATCHFLEET_CONCURRENCY");
    let longest_batch = drain - UPLOAD_MARGIN_SECS;
    assert!(longest_batch > 0, "the drain grace {drain} leaves no time for a mini-batch");

    let config = one(&docs, "ConfigMap", "batchfleet", "base/");
    let pool = config.object["data"]["BATCHFLEET_POOL"].as_str().expect("a pool in the ConfigMap");
    for flavour in ["keda-rabbitmq/", "keda-sqs/"] {
        let scaled = one(&docs, "ScaledObject", "batchfleet-worker", flavour);
        let spec = &scaled.object["spec"];
        assert_eq!(spec["scaleTargetRef"]["name"], "batchfleet-worker", "{flavour}");
        assert_eq!(int(&spec["minReplicaCount"], "minReplicaCount"), 0, "{flavour}: scale to 0");
        let cooldown = int(&spec["cooldownPeriod"], "cooldownPeriod");
        let window = int(
            &spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
                ["stabilizationWindowSeconds"],
            "scaleDown.stabilizationWindowSeconds",
        );
        assert!(
            cooldown >= longest_batch && window >= longest_batch,
            "{flavour}: cooldown {cooldown} s and scale-down window {window} s must be at least \
             the longest mini-batch ({longest_batch} s)"
        );
        let trigger = &spec["triggers"][0];
        let meta = &trigger["metadata"];
        match flavour {
            "keda-rabbitmq/" => {
                assert_eq!(trigger["type"], "rabbitmq");
                assert_eq!(meta["protocol"], "http", "AMQP counts ready messages only");
                assert_eq!(meta["mode"], "QueueLength");
                assert!(meta["excludeUnacknowledged"].is_null(), "unacked must count");
                assert_eq!(meta["queueName"], format!("batchfleet.work.{pool}"));
                assert_eq!(meta["value"], concurrency.to_string(), "one message per slot");
            }
            _ => {
                assert_eq!(trigger["type"], "aws-sqs-queue");
                assert_eq!(meta["scaleOnInFlight"], "true", "in-flight messages must count");
                let url = meta["queueURL"].as_str().unwrap_or("");
                assert!(url.ends_with(&format!("/batchfleet_work_{pool}")), "queue URL {url}");
                assert_eq!(meta["queueLength"], concurrency.to_string(), "one message per slot");
            }
        }
    }
}

/// The validator is seen to refuse: a copy of each kind with one wrong type and one unknown
/// field (a typo the API server would drop silently).
#[test]
fn broken_manifests_are_refused() {
    let dir = tempfile::tempdir().expect("a temp folder");
    let root = repo_root();
    let broken = [
        ("base/worker.yaml", "terminationGracePeriodSeconds: 190", "terminationGracePeriod: 190"),
        ("base/worker.yaml", "replicas: 0", "replicas: none"),
        ("keda-rabbitmq/scaledobject.yaml", "cooldownPeriod: 180", "cooldownPeriods: 180"),
        ("keda-rabbitmq/scaledobject.yaml", "minReplicaCount: 0", "minReplicaCount: zero"),
        (
            "keda-sqs/scaledobject.yaml",
            "- parameter: awsAccessKeyID",
            "- parameters: awsAccessKeyID",
        ),
    ];
    let mut files = Vec::new();
    for (index, (file, from, to)) in broken.iter().enumerate() {
        let text = std::fs::read_to_string(root.join("infra/k8s").join(file))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(text.contains(from), "{file} no longer holds {from:?}: update this test");
        let path = dir.path().join(format!("broken-{index}.yaml"));
        std::fs::write(&path, text.replacen(from, to, 1)).expect("writing a broken copy");
        files.push(path);
    }
    let docs = validate(&files);
    for (index, (file, _, to)) in broken.iter().enumerate() {
        let name = format!("broken-{index}.yaml");
        let field = to.trim_start_matches("- ").split(':').next().unwrap_or_default();
        let refused = docs
            .iter()
            .filter(|d| d.file.ends_with(&name))
            .any(|d| d.errors.iter().any(|e| e.contains(field)));
        assert!(refused, "{file} with `{to}` was not refused naming {field}: {docs:#?}");
    }
}

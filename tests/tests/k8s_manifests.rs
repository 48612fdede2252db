//! The Kubernetes manifests of `infra/k8s/` as an operator applies them: every overlay under
//! `infra/k8s/overlays/` rendered with `kubectl kustomize`, then
//! - every document checked against the schemas it is applied with (`infra/k8s/validate.py`:
//!   built-in kinds with kubernetes-validate, KEDA's kinds with the CRD schemas in
//!   `../shared/schemas/keda/`, both strict), and so is the example Secret file;
//! - every overlay scanned with checkov, in one run: no failed check, every skipped one skipped
//!   in the manifest with a reason; a deliberately weakened copy in the same run must fail;
//! - then what neither can say (`k8s_manifests/rules.rs`): the hardening of every pod, the
//!   credentials kept from user code, and the scaling numbers derived from the longest batch.
//!
//! A deliberately broken copy of each kind must be refused by the schemas.
//!
//! Needs `infra/k8s-validate` (infra/run-tests runs it): the venv `target/k8s-validate`
//! (`BATCHFLEET_K8S_PYTHON` names another interpreter with kubernetes-validate and checkov) and
//! a kubectl with kustomize v4+ on the PATH (`BATCHFLEET_KUBECTL` names another). The KEDA
//! schemas are found in the first `shared/schemas/keda` beside the repository or one of its
//! parent folders, or in `BATCHFLEET_KEDA_SCHEMAS`.

#[path = "k8s_manifests/rules.rs"]
mod rules;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use batchfleet_tests::describe;
use batchfleet_tests::fleet::run_bounded;
use batchfleet_tests::repo_root;
use serde_json::Value;

const VALIDATE_LIMIT: Duration = Duration::from_secs(120);
const RENDER_LIMIT: Duration = Duration::from_secs(60);
const CHECKOV_LIMIT: Duration = Duration::from_secs(300);
/// The overlays an operator picks from (docs/kubernetes.md).
const OVERLAYS: [&str; 4] = ["gpu", "rabbitmq", "rabbitmq-long", "sqs"];

fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("BATCHFLEET_K8S_PYTHON") {
        return PathBuf::from(python);
    }
    let python = repo_root().join("target/k8s-validate/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run infra/k8s-validate first (infra/run-tests does), or set \
         BATCHFLEET_K8S_PYTHON to a Python with kubernetes-validate and checkov",
        python.display()
    );
    python
}

fn kubectl() -> PathBuf {
    std::env::var_os("BATCHFLEET_KUBECTL").map_or_else(|| PathBuf::from("kubectl"), PathBuf::from)
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

/// One validated document.
#[derive(Debug)]
pub struct Document {
    pub file: String,
    pub kind: String,
    pub name: String,
    pub errors: Vec<String>,
    pub object: Value,
}

/// The overlays rendered into a folder kept for the whole test process, one file each.
struct Rendered {
    dir: tempfile::TempDir,
    docs: Vec<Document>,
}

fn rendered() -> &'static Rendered {
    static RENDERED: OnceLock<Rendered> = OnceLock::new();
    RENDERED.get_or_init(|| {
        let overlays = repo_root().join("infra/k8s/overlays");
        let mut found: Vec<String> = std::fs::read_dir(&overlays)
            .unwrap_or_else(|e| panic!("{}: {e}", overlays.display()))
            .map(|entry| entry.expect("a directory entry").file_name().to_string_lossy().into())
            .collect();
        found.sort();
        assert_eq!(
            found, OVERLAYS,
            "the overlays under infra/k8s/overlays changed: update this test"
        );
        // checkov passes over folders whose names start with a dot, as tempdir()'s do.
        let dir = tempfile::Builder::new().prefix("k8s-render-").tempdir().expect("a temp folder");
        std::fs::create_dir_all(dir.path().join("good")).expect("a folder");
        let mut files = Vec::new();
        for overlay in OVERLAYS {
            let mut command = Command::new(kubectl());
            command.arg("kustomize").arg(overlays.join(overlay));
            let output = run_bounded(&mut command, RENDER_LIMIT);
            assert!(
                output.status.success(),
                "`kubectl kustomize infra/k8s/overlays/{overlay}` failed (infra/k8s-validate \
                 checks for a kubectl with kustomize v4+)\n{}",
                describe(&output)
            );
            let file = dir.path().join("good").join(format!("{overlay}.yaml"));
            std::fs::write(&file, &output.stdout).expect("writing a rendered overlay");
            files.push(file);
        }
        files.push(repo_root().join("infra/k8s/examples/secrets.yaml"));
        let docs = validate(&files);
        Rendered { dir, docs }
    })
}

/// The documents of one rendered overlay.
pub fn overlay(name: &str) -> Vec<&'static Document> {
    let file = format!("/{name}.yaml");
    let docs: Vec<&Document> = rendered().docs.iter().filter(|d| d.file.ends_with(&file)).collect();
    assert!(!docs.is_empty(), "overlay {name} rendered nothing");
    docs
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

#[test]
fn every_overlay_renders_and_passes_the_kubernetes_and_keda_schemas() {
    let docs = &rendered().docs;
    let invalid: Vec<String> = docs
        .iter()
        .filter(|d| !d.errors.is_empty())
        .map(|d| format!("{} ({} {}): {}", d.file, d.kind, d.name, d.errors.join("; ")))
        .collect();
    assert!(invalid.is_empty(), "manifests refused by their schemas:\n{}", invalid.join("\n"));
    for name in OVERLAYS {
        let kinds: Vec<&str> = overlay(name).iter().map(|d| d.kind.as_str()).collect();
        for kind in ["Namespace", "ServiceAccount", "ConfigMap", "NetworkPolicy", "Deployment"] {
            assert!(kinds.contains(&kind), "{name}: no {kind} among {kinds:?}");
        }
        let scaled = kinds.contains(&"ScaledObject") || kinds.contains(&"ScaledJob");
        assert!(scaled && kinds.contains(&"TriggerAuthentication"), "{name}: {kinds:?}");
        assert!(!kinds.contains(&"Secret"), "{name}: a Secret in an overlay: keep it in examples/");
    }
    let secrets =
        docs.iter().filter(|d| d.kind == "Secret" && d.file.contains("examples/")).count();
    assert_eq!(secrets, 3, "examples/secrets.yaml: the broker, store and KEDA Secrets");
}

/// One checkov run over every rendered overlay and a weakened copy of one: the overlays fail
/// no check and skip each with a reason; the copy fails the checks it was weakened for.
#[test]
fn checkov_passes_every_overlay_and_fails_a_weakened_copy() {
    let dir = rendered().dir.path();
    let good = std::fs::read_to_string(dir.join("good/rabbitmq.yaml")).expect("rendered");
    let weakened = good
        .replace("allowPrivilegeEscalation: false", "allowPrivilegeEscalation: true")
        .replace("automountServiceAccountToken: false", "automountServiceAccountToken: true");
    assert_ne!(weakened, good, "the rendered overlay no longer holds what this test weakens");
    let broken_dir = dir.join("weakened");
    std::fs::create_dir_all(&broken_dir).expect("a folder");
    std::fs::write(broken_dir.join("weakened.yaml"), weakened).expect("a weakened copy");
    // The report is megabytes, more than a pipe holds while the run is awaited: checkov's
    // output goes to files.
    let report_dir = tempfile::tempdir().expect("a temp folder");
    let stdout = report_dir.path().join("stdout.json");
    let stderr = report_dir.path().join("stderr.txt");
    let file = |path: &PathBuf| std::fs::File::create(path).expect("an output file");
    let mut child = Command::new(python().with_file_name("checkov"))
        .arg("--directory")
        .arg(dir)
        .args(["--framework", "kubernetes", "--output", "json", "--skip-download"])
        .env("BC_SKIP_MAPPING", "TRUE")
        .stdin(std::process::Stdio::null())
        .stdout(file(&stdout))
        .stderr(file(&stderr))
        .spawn()
        .expect("starting checkov");
    let deadline = std::time::Instant::now() + CHECKOV_LIMIT;
    // checkov exits 1 when a check failed: the weakened copy must make it.
    while child.try_wait().expect("checkov's status").is_none() {
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("checkov did not finish within {CHECKOV_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let report: Value = std::fs::read(&stdout)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_else(|| {
            let errors = std::fs::read_to_string(&stderr).unwrap_or_default();
            panic!("checkov printed no JSON report\n{errors}")
        });
    let results = &report["results"];
    let checks = |key: &str| results[key].as_array().cloned().unwrap_or_default();
    let in_good = |check: &Value| check["file_path"].as_str().is_some_and(|p| p.contains("/good/"));
    let failed: Vec<String> = checks("failed_checks")
        .iter()
        .filter(|c| in_good(c))
        .map(|c| {
            format!(
                "{} {} in {} ({})",
                c["check_id"], c["check_name"], c["resource"], c["file_path"]
            )
        })
        .collect();
    assert!(failed.is_empty(), "checkov failed checks in the overlays:\n{}", failed.join("\n"));
    let passed = checks("passed_checks").iter().filter(|c| in_good(c)).count();
    assert!(passed > 100, "checkov passed only {passed} checks: did it scan the overlays?");
    for skipped in checks("skipped_checks").iter().filter(|c| in_good(c)) {
        let reason = skipped["check_result"]["suppress_comment"].as_str().unwrap_or("").trim();
        assert!(reason.len() > 20, "{} skipped without a reason: {skipped}", skipped["check_id"]);
    }
    let weakened_failures: Vec<String> = checks("failed_checks")
        .iter()
        .filter(|c| c["file_path"].as_str().is_some_and(|p| p.contains("weakened")))
        .filter_map(|c| c["check_id"].as_str().map(String::from))
        .collect();
    for id in ["CKV_K8S_20", "CKV_K8S_38"] {
        assert!(
            weakened_failures.iter().any(|f| f == id),
            "checkov did not fail {id} on the weakened copy: {weakened_failures:?}"
        );
    }
}

/// The validator is seen to refuse: a copy of each kind with one wrong type or one unknown
/// field (a typo the API server would drop silently).
#[test]
fn broken_manifests_are_refused() {
    let dir = tempfile::tempdir().expect("a temp folder");
    let root = repo_root().join("infra/k8s");
    let broken = [
        ("base/worker.yaml", "terminationGracePeriodSeconds: 190", "terminationGracePeriod: 190"),
        ("base/worker.yaml", "revisionHistoryLimit: 3", "revisionHistoryLimit: three"),
        ("overlays/rabbitmq/scaledobject.yaml", "cooldownPeriod: 180", "cooldownPeriods: 180"),
        ("overlays/rabbitmq/scaledobject.yaml", "minReplicaCount: 0", "minReplicaCount: zero"),
        ("overlays/rabbitmq-long/scaledjob.yaml", "strategy: gradual", "strategy: slowly"),
        ("overlays/sqs/scaledobject.yaml", "pollingInterval: 5", "pollingIntervals: 5"),
    ];
    let mut files = Vec::new();
    for (index, (file, from, to)) in broken.iter().enumerate() {
        let text =
            std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(text.contains(from), "{file} no longer holds {from:?}: update this test");
        let path = dir.path().join(format!("broken-{index}.yaml"));
        std::fs::write(&path, text.replacen(from, to, 1)).expect("writing a broken copy");
        files.push(path);
    }
    let docs = validate(&files);
    for (index, (file, _, to)) in broken.iter().enumerate() {
        let name = format!("broken-{index}.yaml");
        let (field, value) = to.split_once(": ").unwrap_or_default();
        let refused = docs
            .iter()
            .filter(|d| d.file.ends_with(&name))
            .any(|d| d.errors.iter().any(|e| e.contains(field) || e.contains(value)));
        assert!(refused, "{file} with `{to}` was not refused naming it: {docs:#?}");
    }
}

//! What the schemas and checkov cannot say about the rendered overlays: every pod hardened
//! (checkov does not look inside a KEDA ScaledJob), batchfleet's credentials kept from user
//! code, and the scaling numbers that must move together, derived from the longest batch.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{overlay, Document, OVERLAYS};

/// What the worker still needs after its drain grace (worker/src/worker.rs): slots still busy
/// are given back within 15 s (`ABANDON_AFTER`), the last batch events get 10 s.
const AFTER_DRAIN_SECS: i64 = 15 + 10;
/// The drain grace covers the longest mini-batch and this much for its upload.
const UPLOAD_MARGIN_SECS: i64 = 30;
/// The most the HPA's scale-down stabilization window may be.
const HPA_WINDOW_LIMIT: i64 = 3600;

fn one<'a>(docs: &[&'a Document], kind: &str, name: &str) -> &'a Document {
    let found: Vec<&&Document> = docs.iter().filter(|d| d.kind == kind && d.name == name).collect();
    assert_eq!(found.len(), 1, "expected one {kind} {name}");
    found[0]
}

fn int(value: &Value, what: &str) -> i64 {
    value.as_i64().unwrap_or_else(|| panic!("{what} is not an integer: {value}"))
}

/// Every pod template of an overlay: (what, pod spec, pod metadata).
fn pods<'a>(docs: &[&'a Document]) -> Vec<(String, &'a Value, &'a Value)> {
    let mut pods = Vec::new();
    for doc in docs {
        let template = match doc.kind.as_str() {
            "Deployment" => &doc.object["spec"]["template"],
            "ScaledJob" => &doc.object["spec"]["jobTargetRef"]["template"],
            _ => continue,
        };
        pods.push((format!("{} {}", doc.kind, doc.name), &template["spec"], &template["metadata"]));
    }
    pods
}

/// A container's environment variables given by value.
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

fn env_int(env: &BTreeMap<String, String>, name: &str, what: &str) -> i64 {
    env.get(name).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{what} sets no {name}"))
}

/// The worker's container (the only container of a worker pod).
fn worker<'a>(docs: &[&'a Document]) -> (String, &'a Value, &'a Value, &'a Value) {
    let (what, spec, meta) = pods(docs)
        .into_iter()
        .find(|(_, _, meta)| meta["labels"]["app.kubernetes.io/name"] == "batchfleet-worker")
        .expect("a worker pod");
    (what, spec, meta, &spec["containers"][0])
}

#[test]
fn every_pod_meets_the_restricted_standard_and_is_bounded() {
    for name in OVERLAYS {
        let docs = overlay(name);
        let namespace = one(&docs, "Namespace", "batchfleet");
        let labels = &namespace.object["metadata"]["labels"];
        assert_eq!(labels["pod-security.kubernetes.io/enforce"], "restricted", "{name}");
        let account = one(&docs, "ServiceAccount", "batchfleet");
        assert_eq!(account.object["automountServiceAccountToken"], false, "{name}");
        let policy = one(&docs, "NetworkPolicy", "batchfleet");
        let types = policy.object["spec"]["policyTypes"].to_string();
        assert!(types.contains("Egress") && types.contains("Ingress"), "{name}: {types}");
        let egress = policy.object["spec"]["egress"].to_string();
        assert!(
            egress.contains("169.254.0.0/16"),
            "{name}: the metadata endpoint must be excluded"
        );
        for (what, spec, meta) in pods(&docs) {
            let at = format!("{name}: {what}");
            assert_eq!(spec["serviceAccountName"], "batchfleet", "{at}");
            assert_eq!(spec["automountServiceAccountToken"], false, "{at}: no API token");
            assert_eq!(spec["securityContext"]["runAsNonRoot"], true, "{at}");
            assert_eq!(spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault", "{at}");
            assert_eq!(
                meta["labels"]["app.kubernetes.io/part-of"], "batchfleet",
                "{at}: the NetworkPolicy selects pods by this label"
            );
            for volume in spec["volumes"].as_array().into_iter().flatten() {
                if !volume["emptyDir"].is_null() {
                    assert!(
                        volume["emptyDir"]["sizeLimit"].is_string(),
                        "{at}: {volume} unbounded"
                    );
                }
            }
            for container in spec["containers"].as_array().expect("containers") {
                let context = &container["securityContext"];
                assert_eq!(context["allowPrivilegeEscalation"], false, "{at}");
                assert_eq!(context["capabilities"]["drop"], serde_json::json!(["ALL"]), "{at}");
                assert_eq!(context["readOnlyRootFilesystem"], true, "{at}");
                let resources = &container["resources"];
                for key in ["cpu", "memory", "ephemeral-storage"] {
                    assert!(resources["requests"][key].is_string(), "{at}: no {key} request");
                    assert!(resources["limits"][key].is_string(), "{at}: no {key} limit");
                }
                let image = container["image"].as_str().unwrap_or("");
                let tag = image.rsplit_once(':').map(|(_, tag)| tag).unwrap_or("");
                assert!(!tag.is_empty() && tag != "latest", "{at}: image {image} is not pinned");
                for source in container["envFrom"].as_array().into_iter().flatten() {
                    assert!(source["secretRef"].is_null(), "{at}: a whole Secret as environment");
                }
            }
        }
        let (what, _, meta, container) = worker(&docs);
        let at = format!("{name}: {what}");
        assert!(container["startupProbe"]["exec"].is_object(), "{at}: no startupProbe");
        let port = container["ports"][0]["containerPort"].as_i64();
        let metrics = env_of(container).get("BATCHFLEET_METRICS_ADDR").cloned().unwrap_or_default();
        assert_eq!(port.map(|p| format!("0.0.0.0:{p}")), Some(metrics), "{at}: metrics port");
        assert_eq!(meta["annotations"]["prometheus.io/scrape"], "true", "{at}");
        assert_eq!(
            meta["annotations"]["prometheus.io/port"],
            port.unwrap_or(0).to_string(),
            "{at}"
        );
    }
}

#[test]
fn credentials_reach_neither_scripts_nor_keda_beyond_what_each_needs() {
    for name in OVERLAYS {
        let docs = overlay(name);
        let (what, _, _, container) = worker(&docs);
        let env = env_of(container);
        assert_eq!(
            env.get("BATCHFLEET_SCRIPT_STORAGE_KEYS").map(String::as_str),
            Some("none"),
            "{name}: {what}: entry scripts must not inherit the fleet's store keys"
        );
        let config = &one(&docs, "ConfigMap", "batchfleet").object["data"];
        assert!(config["AWS_ENDPOINT_URL"].is_null(), "{name}: AWS_ENDPOINT_URL redirects SQS too");
        for (what, spec, _) in pods(&docs) {
            for container in spec["containers"].as_array().into_iter().flatten() {
                assert!(!env_of(container).contains_key("AWS_ENDPOINT_URL"), "{name}: {what}");
            }
        }
        for auth in docs.iter().filter(|d| d.kind == "TriggerAuthentication") {
            let text = auth.object["spec"].to_string();
            assert!(
                !text.contains("batchfleet-broker") && !text.contains("batchfleet-store"),
                "{name}: KEDA must use its own credentials, not the workers': {text}"
            );
        }
        for scaler in docs.iter().filter(|d| d.kind == "ScaledObject" || d.kind == "ScaledJob") {
            let meta = &scaler.object["spec"]["triggers"][0]["metadata"];
            if let Some(url) = meta["queueURL"].as_str() {
                let digits = url.chars().filter(char::is_ascii_digit).count();
                assert!(digits < 12, "{name}: the SQS queue names an account: {url}");
                let auth = one(&docs, "TriggerAuthentication", "batchfleet-sqs");
                assert_eq!(auth.object["spec"]["podIdentity"]["provider"], "aws", "{name}");
            }
        }
    }
}

/// The numbers that must move together: the drain grace covers the longest batch B (plus its
/// upload), the kill comes after the grace and what follows it, and a Deployment's scale-in
/// waits at least B. A Deployment KEDA scales has no `replicas` (re-applying it would resize).
#[test]
fn scaling_settings_follow_the_longest_batch() {
    for name in ["gpu", "rabbitmq", "sqs"] {
        let docs = overlay(name);
        let deployment = one(&docs, "Deployment", "batchfleet-worker");
        assert!(
            deployment.object["spec"]["replicas"].is_null(),
            "{name}: replicas on a scaled Deployment"
        );
        let (_, pod, _, container) = worker(&docs);
        let env = env_of(container);
        let drain = env_int(&env, "BATCHFLEET_DRAIN_GRACE", name);
        let grace = int(&pod["terminationGracePeriodSeconds"], "terminationGracePeriodSeconds");
        assert!(
            grace > drain + AFTER_DRAIN_SECS,
            "{name}: grace {grace} <= drain {drain} + {AFTER_DRAIN_SECS}"
        );
        assert!(
            container["lifecycle"]["preStop"].is_null(),
            "{name}: no preStop hook: it eats the grace"
        );
        let longest = drain - UPLOAD_MARGIN_SECS;
        let concurrency = env_int(&env, "BATCHFLEET_CONCURRENCY", name);
        let pool = one(&docs, "ConfigMap", "batchfleet").object["data"]["BATCHFLEET_POOL"]
            .as_str()
            .expect("a pool")
            .to_string();
        let spec = &one(&docs, "ScaledObject", "batchfleet-worker").object["spec"];
        assert_eq!(spec["scaleTargetRef"]["name"], "batchfleet-worker", "{name}");
        assert_eq!(int(&spec["minReplicaCount"], "minReplicaCount"), 0, "{name}: scale to 0");
        let cooldown = int(&spec["cooldownPeriod"], "cooldownPeriod");
        let window = int(
            &spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
                ["stabilizationWindowSeconds"],
            "scaleDown.stabilizationWindowSeconds",
        );
        assert!(
            cooldown >= longest && (longest..=HPA_WINDOW_LIMIT).contains(&window),
            "{name}: cooldown {cooldown} s and scale-down window {window} s must be at least the \
             longest batch ({longest} s), the window at most {HPA_WINDOW_LIMIT} s"
        );
        let trigger = &spec["triggers"][0];
        let meta = &trigger["metadata"];
        if trigger["type"] == "rabbitmq" {
            assert_eq!(meta["protocol"], "http", "{name}: AMQP counts ready messages only");
            assert_eq!(meta["mode"], "QueueLength", "{name}");
            assert!(meta["excludeUnacknowledged"].is_null(), "{name}: unacked must count");
            assert_eq!(meta["queueName"], format!("batchfleet.work.{pool}"), "{name}");
            assert_eq!(meta["value"], concurrency.to_string(), "{name}: one message per slot");
        } else {
            assert_eq!(trigger["type"], "aws-sqs-queue", "{name}");
            assert_eq!(meta["scaleOnInFlight"], "true", "{name}: in-flight messages must count");
            assert_eq!(meta["queueURL"], format!("batchfleet_work_{pool}"), "{name}");
            assert_eq!(meta["queueLength"], concurrency.to_string(), "{name}: one per slot");
        }
        let budget = one(&docs, "PodDisruptionBudget", "batchfleet-worker");
        assert_eq!(budget.object["spec"]["maxUnavailable"], 1, "{name}: one drain at a time");
    }
    let gpu = overlay("gpu");
    let (_, pod, _, container) = worker(&gpu);
    assert_eq!(container["resources"]["limits"]["nvidia.com/gpu"], "1", "gpu: a GPU per pod");
    assert!(pod["nodeSelector"].is_object() && pod["tolerations"].is_array(), "gpu: GPU nodes");
}

/// Long batches: worker Jobs that exit when idle, never scaled in, kept through a rollout,
/// not removed by the cluster autoscaler, and a consumer timeout past the longest attempt.
#[test]
fn long_batches_run_as_jobs_no_scale_in_or_rollout_can_kill() {
    let docs = overlay("rabbitmq-long");
    assert!(
        !docs.iter().any(|d| d.name == "batchfleet-worker" && d.kind != "ScaledJob"),
        "rabbitmq-long: the worker Deployment and its budget must be gone"
    );
    let job = one(&docs, "ScaledJob", "batchfleet-worker");
    let spec = &job.object["spec"];
    assert_eq!(spec["rollout"]["strategy"], "gradual", "an update must not delete running Jobs");
    assert_eq!(spec["scalingStrategy"]["strategy"], "default", "the count includes unacked");
    let (_, pod, meta, container) = worker(&docs);
    let args: Vec<&str> =
        container["args"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let idle = args.iter().position(|a| *a == "--idle-exit").and_then(|i| args.get(i + 1));
    assert!(idle.is_some_and(|s| s.parse::<u64>().is_ok()), "no --idle-exit SECONDS in {args:?}");
    assert_eq!(pod["restartPolicy"], "Never");
    assert_eq!(meta["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"], "false");
    let env = env_of(container);
    let drain = env_int(&env, "BATCHFLEET_DRAIN_GRACE", "rabbitmq-long");
    let grace = int(&pod["terminationGracePeriodSeconds"], "terminationGracePeriodSeconds");
    assert!(
        grace > drain + AFTER_DRAIN_SECS,
        "grace {grace} <= drain {drain} + {AFTER_DRAIN_SECS}"
    );
    let longest = drain - UPLOAD_MARGIN_SECS;
    assert!(longest > HPA_WINDOW_LIMIT, "the long overlay is for batches past the HPA's window");
    let config = &one(&docs, "ConfigMap", "batchfleet").object["data"];
    let timeout: i64 =
        config["BATCHFLEET_CONSUMER_TIMEOUT"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0);
    assert!(
        timeout > longest,
        "consumer_timeout {timeout} s must outlast the longest batch {longest} s"
    );
    assert_eq!(
        spec["triggers"][0]["metadata"]["value"],
        env_int(&env, "BATCHFLEET_CONCURRENCY", "long").to_string()
    );
    // The same hardening as the short-batch Deployment: same env names and probes.
    let short = overlay("rabbitmq");
    let (_, _, _, short_container) = worker(&short);
    let names = |c: &Value| -> Vec<String> {
        let mut names: Vec<String> = c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["name"].as_str().map(String::from))
            .collect();
        names.sort();
        names
    };
    assert_eq!(
        names(container),
        names(short_container),
        "the Job's worker env drifted from the Deployment's"
    );
    for key in
        ["securityContext", "startupProbe", "livenessProbe", "readinessProbe", "ports", "image"]
    {
        assert_eq!(container[key], short_container[key], "the Job's worker {key} drifted");
    }
}

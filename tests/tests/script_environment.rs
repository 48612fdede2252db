//! What an entry script inherits (worker/src/runtime/environment.rs): batchfleet's broker and
//! management credentials never, in any mode — `run`'s in-process workers, a fleet's
//! `batchfleet-worker` serving `submit`, and the jobs `watch` submits; the store keys of the
//! process that runs it by default (`run`, `submit`), but not for a job confined to an
//! allow-list (every `watch` job, `--allow`) nor under the worker's
//! `--script-storage-keys none`. The entry script writes its whole `os.environ` as its output.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use batchfleet_tests::fleet::{finish_bounded, run_bounded, spawn_captured, Pool};
use batchfleet_tests::{batchfleet, binary, describe, python};

const LIMIT: Duration = Duration::from_secs(180);
const BROKER_SECRET: &str = "amqp://fleet:broker-secret-37@127.0.0.1:1/%2f";
const MANAGEMENT_SECRET: &str = "http://keda:management-secret-37@127.0.0.1:1/";
const AWS_KEY: &str = "AKIAFLEETKEY37";
const AWS_SECRET: &str = "fleet-aws-secret-37";
const AZURE_KEY: &str = "fleet-azure-key-37";

const SCRIPT: &str = "import json, os\n\
def init():\n    pass\n\
def run(mini_batch):\n    return [json.dumps(dict(os.environ), sort_keys=True)]\n";

/// The fleet's credentials, as an operator's environment would hold them.
fn fleet_env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("RABBITMQ_MANAGEMENT_URL", MANAGEMENT_SECRET),
        ("AWS_ACCESS_KEY_ID", AWS_KEY),
        ("AWS_SECRET_ACCESS_KEY", AWS_SECRET),
        ("AZURE_STORAGE_ACCOUNT_KEY", AZURE_KEY),
    ]
}

/// `<dir>/<name>.yaml`: a job over one file whose rows go to `<dir>/<name>.txt`, all paths
/// absolute (a manifest has no folder to be relative to).
fn job(dir: &Path, name: &str) -> PathBuf {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).expect("data folder");
    std::fs::write(data.join("one.txt"), "1").expect("input file");
    std::fs::create_dir_all(dir.join("code")).expect("code folder");
    std::fs::write(dir.join("code/entry.py"), SCRIPT).expect("entry script");
    let spec = format!(
        "type: parallel\nname: {name}\ninputs:\n  files: {{type: uri_folder, path: {data}}}\n\
         outputs:\n  rows: {{type: uri_file, path: {out}}}\ninput_data: ${{{{inputs.files}}}}\n\
         mini_batch_size: 10\ntask:\n  type: run_function\n  code: {code}\n  \
         entry_script: entry.py\n  append_row_to: ${{{{outputs.rows}}}}\n",
        data = data.display(),
        out = dir.join(format!("{name}.txt")).display(),
        code = dir.join("code").display(),
    );
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, spec).expect("job file");
    path
}

/// The environment the entry script saw in job `name`.
fn seen(dir: &Path, name: &str) -> BTreeMap<String, String> {
    let path = dir.join(format!("{name}.txt"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: the job wrote no output ({e})", path.display()));
    let line = text.lines().next().unwrap_or_else(|| panic!("{}: empty", path.display()));
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {line}", path.display()))
}

/// No broker or management credential, by name or by value.
fn assert_no_broker_credentials(env: &BTreeMap<String, String>, mode: &str, broker: &str) {
    for name in ["BATCHFLEET_BROKER", "RABBITMQ_MANAGEMENT_URL"] {
        assert!(!env.contains_key(name), "{mode}: the entry script inherited {name}");
    }
    for secret in [BROKER_SECRET, MANAGEMENT_SECRET, broker] {
        let leaked: Vec<&String> =
            env.iter().filter(|(_, v)| v.contains(secret)).map(|(k, _)| k).collect();
        assert!(leaked.is_empty(), "{mode}: {secret} reached the entry script in {leaked:?}");
    }
    let own: Vec<&String> = env
        .keys()
        .filter(|k| k.starts_with("BATCHFLEET_"))
        .filter(|k| !RUNTIME_OWN.contains(&k.as_str()))
        .collect();
    assert!(own.is_empty(), "{mode}: batchfleet's own settings reached the entry script: {own:?}");
}

/// The `BATCHFLEET_*` variables the runtime is given on purpose (docs/entry-protocol.md).
const RUNTIME_OWN: &[&str] = &[
    "BATCHFLEET_LOGGING_LEVEL",
    "BATCHFLEET_NODE_ID",
    "BATCHFLEET_PROCESS_NAME",
    "BATCHFLEET_LOG_DIR",
    "BATCHFLEET_WORKING_DIR",
    "BATCHFLEET_RUNTIME_TREE",
    "BATCHFLEET_READ_ONLY_INPUTS",
    "BATCHFLEET_TABULAR",
];

fn assert_store_keys(env: &BTreeMap<String, String>, mode: &str, inherited: bool) {
    let keys = [
        ("AWS_ACCESS_KEY_ID", AWS_KEY),
        ("AWS_SECRET_ACCESS_KEY", AWS_SECRET),
        ("AZURE_STORAGE_ACCOUNT_KEY", AZURE_KEY),
    ];
    for (name, value) in keys {
        match inherited {
            true => assert_eq!(env.get(name).map(String::as_str), Some(value), "{mode}: {name}"),
            false => {
                let leaked: Vec<&String> =
                    env.iter().filter(|(_, v)| v.contains(value)).map(|(k, _)| k).collect();
                assert!(
                    leaked.is_empty(),
                    "{mode}: the fleet's {name} reached the script in {leaked:?}"
                );
            }
        }
    }
    if !inherited {
        assert_eq!(
            env.get("AWS_EC2_METADATA_DISABLED").map(String::as_str),
            Some("true"),
            "{mode}: without keys, AWS SDKs must not fall back to the instance's role"
        );
    }
}

#[test]
fn run_keeps_broker_credentials_from_scripts_and_store_keys_only_under_an_allow_list() {
    let dir = tempfile::tempdir().expect("temp folder");
    for (name, allow) in [("plain", false), ("allowed", true)] {
        let spec = job(dir.path(), name);
        let mut command = batchfleet();
        command.arg("run").arg(&spec).arg("--store").arg(dir.path().join("jobs"));
        if allow {
            command.arg("--allow").arg(dir.path());
        }
        command.env("BATCHFLEET_BROKER", BROKER_SECRET).envs(fleet_env());
        let output = run_bounded(&mut command, LIMIT);
        assert!(output.status.success(), "run ({name}) failed: {}", describe(&output));
        let env = seen(dir.path(), name);
        let mode = format!("run ({name})");
        assert_no_broker_credentials(&env, &mode, BROKER_SECRET);
        assert_store_keys(&env, &mode, !allow);
    }
}

#[test]
fn fleet_workers_keep_broker_credentials_from_scripts_in_submit_and_watch() {
    let pool = Pool::new("script-env");
    let dir = tempfile::tempdir().expect("temp folder");
    let broker = pool.broker_url();
    let mut env = fleet_env();
    env.push(("BATCHFLEET_BROKER", broker.as_str()));
    let _inherit = pool.worker_with_env(dir.path(), "inherit", 1, &[], &env);

    // submit: the worker's store keys reach the script (its default), its broker URL never.
    let spec = job(dir.path(), "submitted");
    let output = run_bounded(&mut pool.submit(&spec, &dir.path().join("jobs")), LIMIT);
    assert!(output.status.success(), "submit failed: {}", describe(&output));
    let seen_env = seen(dir.path(), "submitted");
    assert_no_broker_credentials(&seen_env, "submit", &broker);
    assert_store_keys(&seen_env, "submit", true);

    // watch: every job is confined to the watcher's allow-list, so the same worker withholds
    // its store keys from the job's script.
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).expect("manifest folder");
    let watched = job(dir.path(), "watched");
    std::fs::rename(&watched, manifests.join("watched.yaml")).expect("manifest");
    let mut command = Command::new(binary("batchfleet"));
    command
        .arg("watch")
        .arg(format!("{}/", manifests.display()))
        .args(["--once", "--watcher-id", "env-test", "--pool", &pool.name])
        .arg("--broker")
        .arg(&broker)
        .arg("--store")
        .arg(dir.path().join("jobs"))
        .arg("--allow")
        .arg(dir.path())
        .env("BATCHFLEET_PYTHON", python())
        .env_remove("BATCHFLEET_STORE")
        .env_remove("BATCHFLEET_BROKER");
    let output = finish_bounded(spawn_captured(&mut command), LIMIT);
    assert!(output.status.success(), "watch failed: {}", describe(&output));
    let seen_env = seen(dir.path(), "watched");
    assert_no_broker_credentials(&seen_env, "watch", &broker);
    assert_store_keys(&seen_env, "watch", false);
}

#[test]
fn a_worker_told_none_withholds_its_store_keys_from_every_job() {
    let pool = Pool::new("script-env-none");
    let dir = tempfile::tempdir().expect("temp folder");
    let _worker = pool.worker_with_env(
        dir.path(),
        "none",
        1,
        &["--script-storage-keys", "none"],
        &fleet_env(),
    );
    let spec = job(dir.path(), "none");
    let output = run_bounded(&mut pool.submit(&spec, &dir.path().join("jobs")), LIMIT);
    assert!(output.status.success(), "submit failed: {}", describe(&output));
    let seen_env = seen(dir.path(), "none");
    assert_no_broker_credentials(&seen_env, "submit to a worker told none", &pool.broker_url());
    assert_store_keys(&seen_env, "submit to a worker told none", false);
}

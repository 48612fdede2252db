//! Azure's `azureml_user.parallel_run.EntryScript` in entry scripts, unchanged, embedded
//! (`batchfleet run`) and on a RabbitMQ fleet (`submit` + `batchfleet-worker`); and one GPU
//! per slot from a fake device list.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use batchfleet_tests::fleet::{run_bounded, Pool};
use batchfleet_tests::{batchfleet, describe, file_names, run, JobFixture};

const JOB_LIMIT: Duration = Duration::from_secs(240);

/// Written the way Microsoft's documentation teaches: the logger from `EntryScript()` in
/// `init()` and `run()`, a file of its own in `log_dir`, results named by `agent_name`.
const SCRIPT: &str = r#"
import os
from azureml_user.parallel_run import EntryScript


def init():
    entry_script = EntryScript()
    logger = entry_script.logger
    logger.info("init-info on %s as %s", entry_script.node_id, entry_script.process_name)
    logger.debug("init-debug below the job's level")
    assert EntryScript() is entry_script, "EntryScript() is one object"
    for folder in (entry_script.output_dir, entry_script.working_dir):
        assert os.path.isdir(folder), folder
    os.makedirs(entry_script.log_dir, exist_ok=True)
    own = os.path.join(entry_script.log_dir, entry_script.agent_name + "_own.txt")
    with open(own, "w") as f:
        f.write("written to log_dir\n")


def run(mini_batch):
    entry_script = EntryScript()
    entry_script.logger.info("run-info %d files", len(mini_batch))
    device = os.environ.get("CUDA_VISIBLE_DEVICES", "-")
    return ["%s %s %s" % (os.path.basename(p), entry_script.process_name, device)
            for p in mini_batch]
"#;

/// The job's user logs: every `logs/user/<worker>/slot-*.txt`, joined; and every other file
/// under `logs/user` (the scripts' `log_dir` files), relative to it.
fn user_logs(root: &Path) -> (String, Vec<String>) {
    let user = root.join("logs/user");
    let mut text = String::new();
    let mut others = Vec::new();
    let mut pending = vec![user.clone()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            let relative = path.strip_prefix(&user).unwrap().to_string_lossy().into_owned();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                pending.push(path);
            } else if relative.matches('/').count() == 1 && name.starts_with("slot-") {
                text.push_str(&std::fs::read_to_string(&path).unwrap());
            } else {
                others.push(relative);
            }
        }
    }
    (text, others)
}

fn one_root(jobs: &Path) -> PathBuf {
    let roots: Vec<PathBuf> = std::fs::read_dir(jobs).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(roots.len(), 1, "one job root under {}", jobs.display());
    roots[0].clone()
}

/// What an EntryScript job must show: every file once, the logger's lines at INFO (not DEBUG)
/// in the user logs, and each runtime's `log_dir` file uploaded beside its log.
fn assert_entry_script_job(fixture: &JobFixture, root: &Path, files: usize, worker: &str) {
    let rows = fixture.rows();
    assert_eq!(rows.len(), files, "{rows:?}");
    let (logs, others) = user_logs(root);
    assert!(
        logs.contains(&format!("|ParallelRunStep|init()|INFO|init-info on {worker} as slot-")),
        "init()'s logger line, with the worker and slot, in the user logs:\n{logs}"
    );
    assert!(logs.contains("|run()|INFO|run-info "), "run()'s logger lines:\n{logs}");
    assert!(!logs.contains("init-debug"), "DEBUG is below the job's INFO:\n{logs}");
    assert!(
        others.iter().any(|p| p.starts_with(&format!("{worker}/slot-")) && p.ends_with("_own.txt")),
        "the file written to log_dir is uploaded under logs/user/{worker}/<process>/: {others:?}"
    );
}

#[test]
fn an_entry_script_using_entry_script_runs_embedded_and_logs_to_the_user_logs() {
    let fixture = JobFixture::new(&file_names(12), SCRIPT, "mini_batch_size: \"3\"", "");
    let output = fixture.run();
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));
    let root = fixture.job_root();
    let worker = std::fs::read_dir(root.join("logs/user")).unwrap().next().unwrap().unwrap();
    let worker = worker.file_name().to_string_lossy().into_owned();
    assert_entry_script_job(&fixture, &root, 12, &worker);
}

#[test]
fn the_logger_keeps_to_the_jobs_logging_level() {
    let fixture =
        JobFixture::new(&file_names(3), SCRIPT, "mini_batch_size: \"3\"\nlogging_level: DEBUG", "");
    let output = fixture.run();
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));
    let (logs, _) = user_logs(&fixture.job_root());
    assert!(logs.contains("|DEBUG|init-debug below the job's level"), "{logs}");

    let script = SCRIPT.replace("logger.debug(\"init-debug", "logger.warning(\"init-warning");
    let fixture = JobFixture::new(
        &file_names(3),
        &script,
        "mini_batch_size: \"3\"\nlogging_level: WARNING",
        "",
    );
    let output = fixture.run();
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));
    let (logs, _) = user_logs(&fixture.job_root());
    assert!(logs.contains("|WARNING|init-warning"), "{logs}");
    assert!(!logs.contains("init-info"), "INFO is below the job's WARNING:\n{logs}");
}

#[test]
fn an_entry_script_using_entry_script_runs_on_a_rabbitmq_fleet() {
    let pool = Pool::new("entryscript");
    let fixture = JobFixture::new(&file_names(12), SCRIPT, "mini_batch_size: \"3\"", "");
    let mut worker = pool.worker(fixture.path(), "es", 2, &[]);
    let jobs = fixture.path().join("jobs");
    let output = run_bounded(&mut pool.submit(&fixture.path().join("job.yaml"), &jobs), JOB_LIMIT);
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));
    assert_entry_script_job(&fixture, &one_root(&jobs), 12, "es");
    assert!(worker.stop().success(), "{}", worker.log());
}

#[test]
fn a_script_that_ships_its_own_azureml_user_keeps_its_own() {
    let script = "from azureml_user.parallel_run import EntryScript\n\n\
                  def run(mini_batch):\n    return [EntryScript.OWN for _ in mini_batch]\n";
    let own = "class EntryScript:\n    OWN = 'own'\n";
    // A package of its own, and a namespace package (no __init__.py) of its own.
    for init in [true, false] {
        let fixture = JobFixture::new(&file_names(4), script, "", "");
        let package = fixture.path().join("code/azureml_user");
        std::fs::create_dir_all(&package).unwrap();
        std::fs::write(package.join("parallel_run.py"), own).unwrap();
        if init {
            std::fs::write(package.join("__init__.py"), "").unwrap();
        }
        let output = fixture.run();
        assert!(output.status.success(), "the job must succeed: {}", describe(&output));
        assert_eq!(fixture.rows(), vec!["own"; 4], "__init__.py: {init}");
    }
}

/// `batchfleet run` of the fixture with `env` added (and the machine's own GPU settings off).
fn run_with(fixture: &JobFixture, env: &[(&str, &str)]) -> Output {
    run(batchfleet()
        .arg("run")
        .arg(fixture.path().join("job.yaml"))
        .arg("--store")
        .arg(fixture.path().join("jobs"))
        .env_remove("BATCHFLEET_GPUS")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .envs(env.iter().copied()))
}

/// Every row's device is the one its slot gets (`devices[slot mod n]`); returns the slots seen.
fn assert_one_gpu_per_slot(fixture: &JobFixture, devices: &[&str]) -> Vec<usize> {
    let rows = fixture.rows();
    assert!(!rows.is_empty());
    let mut slots = Vec::new();
    for row in &rows {
        let [_, process, device] = row.split(' ').collect::<Vec<_>>()[..] else {
            panic!("malformed row {row:?}")
        };
        let slot: usize = process.split('-').nth(1).and_then(|s| s.parse().ok()).unwrap();
        assert_eq!(device, devices[slot % devices.len()], "row {row:?}");
        slots.push(slot);
    }
    slots.sort_unstable();
    slots.dedup();
    slots
}

#[test]
fn each_slot_gets_its_own_gpu_from_batchfleet_gpus_and_concurrency_defaults_to_the_gpu_count() {
    let fixture = JobFixture::new(&file_names(24), SCRIPT, "mini_batch_size: \"1\"", "");
    let output = run_with(&fixture, &[("BATCHFLEET_GPUS", "5,6")]);
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));
    assert!(
        describe(&output).contains("max_concurrency_per_instance: 2"),
        "two GPUs, two slots by default: {}",
        describe(&output)
    );
    let slots = assert_one_gpu_per_slot(&fixture, &["5", "6"]);
    assert!(slots.iter().all(|s| *s < 2), "{slots:?}");

    // More slots than devices: round-robin.
    let settings = "mini_batch_size: \"1\"\nmax_concurrency_per_instance: 3";
    let fixture = JobFixture::new(&file_names(24), SCRIPT, settings, "");
    let output = run_with(&fixture, &[("BATCHFLEET_GPUS", "5,6")]);
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));
    assert_one_gpu_per_slot(&fixture, &["5", "6"]);
}

/// A `PATH` with a fake `nvidia-smi` first that lists three GPUs for `-L`.
fn path_with_fake_nvidia_smi(dir: &Path) -> String {
    let bin = dir.join("fake-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let fake = bin.join("nvidia-smi");
    std::fs::write(
        &fake,
        "#!/bin/sh\n[ \"$1\" = \"-L\" ] || exit 2\n\
         echo 'GPU 0: Fake GPU (UUID: GPU-0)'\necho 'GPU 1: Fake GPU (UUID: GPU-1)'\n\
         echo 'GPU 2: Fake GPU (UUID: GPU-2)'\n",
    )
    .unwrap();
    let mut permissions = std::fs::metadata(&fake).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&fake, permissions).unwrap();
    format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default())
}

#[test]
fn gpus_are_found_with_nvidia_smi_on_the_path() {
    let fixture = JobFixture::new(&file_names(12), SCRIPT, "mini_batch_size: \"1\"", "");
    let path = path_with_fake_nvidia_smi(fixture.path());
    let output = run_with(&fixture, &[("PATH", &path)]);
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));
    assert!(
        describe(&output).contains("max_concurrency_per_instance: 3"),
        "three GPUs, three slots by default: {}",
        describe(&output)
    );
    assert_one_gpu_per_slot(&fixture, &["0", "1", "2"]);
}

#[test]
fn an_empty_batchfleet_gpus_means_no_gpus_whatever_nvidia_smi_lists() {
    let fixture = JobFixture::new(&file_names(2), SCRIPT, "max_concurrency_per_instance: 1", "");
    let path = path_with_fake_nvidia_smi(fixture.path());
    let output = run_with(&fixture, &[("BATCHFLEET_GPUS", ""), ("PATH", &path)]);
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));
    assert!(fixture.rows().iter().all(|row| row.ends_with(" -")), "{:?}", fixture.rows());
}

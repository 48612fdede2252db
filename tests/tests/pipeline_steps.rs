//! How pipeline steps run, through the real `batchfleet run` and `batchfleet resume`: command
//! steps find the job's interpreter (`--python`, or the one the environment map gives their
//! `environment:`) as `python` / `python3`, the start summary says which runs each step and
//! that environments are not built, a step past its `limits.timeout` is killed with what it
//! started, independent steps run at once, and `resume` reruns a pipeline from its first step
//! that did not succeed.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use batchfleet_tests::fleet::{eventually, run_bounded};
use batchfleet_tests::venv::venv_with;
use batchfleet_tests::{batchfleet, describe, python};

const LIMIT: Duration = Duration::from_secs(180);

fn write(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// An executable `<dir>/<rel>` that runs the test interpreter with `<dir>/<modules>` on its
/// import path: an interpreter not named `python`.
fn wrapper(dir: &Path, rel: &str, modules: &str) -> PathBuf {
    let path = dir.join(rel);
    let script = format!(
        "#!/bin/sh\nPYTHONPATH='{}' exec '{}' \"$@\"\n",
        dir.join(modules).display(),
        python().display()
    );
    write(dir, rel, &script);
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

fn run_pipeline(dir: &Path, extra: &[&str]) -> Output {
    run_bounded(
        batchfleet()
            .arg("run")
            .arg(dir.join("pipeline.yml"))
            .arg("--store")
            .arg(dir.join("jobs"))
            .arg("--no-progress")
            .args(extra),
        LIMIT,
    )
}

/// The one pipeline folder under `jobs` (the folder holding `pipeline.yaml`).
fn pipeline_folder(jobs: &Path) -> PathBuf {
    let folders: Vec<PathBuf> = std::fs::read_dir(jobs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("pipeline.yaml").exists())
        .collect();
    assert_eq!(folders.len(), 1, "one pipeline folder expected under {}", jobs.display());
    folders[0].clone()
}

fn read(path: &Path, output: &Output) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", path.display(), describe(output)))
}

/// One command step writing what `python` and `python3` are to its output.
const WHICH_PYTHON: &str = "\
type: pipeline
jobs:
  check:
    type: command
    outputs:
      out:
        type: uri_folder
    command: >-
      python -c 'import bf_marker; print(bf_marker.WHO)' > ${{outputs.out}}/python.txt &&
      python3 -c 'import bf_marker, sys; print(sys.executable)' > ${{outputs.out}}/python3.txt
";

#[test]
fn a_command_step_runs_the_venv_given_with_python() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let venv = venv_with(&d.join("venv"), &[("bf_marker.py", "WHO = 'venv'\n")]);
    write(d, "pipeline.yml", WHICH_PYTHON);
    let output = run_pipeline(d, &["--python", &venv.display().to_string()]);
    assert!(output.status.success(), "the pipeline must succeed: {}", describe(&output));
    let out = pipeline_folder(&d.join("jobs")).join("check/outputs/out");
    assert_eq!(read(&out.join("python.txt"), &output), "venv\n");
    assert_eq!(read(&out.join("python3.txt"), &output).trim(), venv.display().to_string());
}

#[test]
fn a_command_step_runs_an_interpreter_not_named_python_as_python() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(d, "mods/bf_marker.py", "WHO = 'wrapper'\n");
    let interpreter = wrapper(d, "interp/run-it", "mods");
    write(d, "pipeline.yml", WHICH_PYTHON);
    let output = run_pipeline(d, &["--python", &interpreter.display().to_string()]);
    assert!(output.status.success(), "the pipeline must succeed: {}", describe(&output));
    let out = pipeline_folder(&d.join("jobs")).join("check/outputs/out");
    assert_eq!(read(&out.join("python.txt"), &output), "wrapper\n");
}

/// Three steps, three environments: one in `environments.yaml`, one given with
/// `--environment`, one the map does not name (it runs with `--python`).
const THREE_ENVIRONMENTS: &str = "\
type: pipeline
jobs:
  named:
    type: command
    environment: azureml:env-a@latest
    outputs: {out: {type: uri_folder}}
    command: python -c 'import bf_marker; print(bf_marker.WHO)' > ${{outputs.out}}/who.txt
  conda:
    type: command
    environment:
      image: mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu20.04
      conda_file: ./conda.yml
    outputs: {out: {type: uri_folder}}
    command: python -c 'import bf_marker; print(bf_marker.WHO)' > ${{outputs.out}}/who.txt
  unmapped:
    type: command
    environment: azureml:unmapped-env:2
    outputs: {out: {type: uri_folder}}
    command: python -c 'import bf_marker; print(bf_marker.WHO)' > ${{outputs.out}}/who.txt
";

#[test]
fn each_step_runs_with_the_interpreter_its_environment_maps_to_and_the_summary_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for who in ["a", "b", "c"] {
        write(d, &format!("mods-{who}/bf_marker.py"), &format!("WHO = '{who}'\n"));
        wrapper(d, &format!("interp/{who}"), &format!("mods-{who}"));
    }
    write(d, "pipeline.yml", THREE_ENVIRONMENTS);
    write(d, "environments.yaml", "environments:\n  env-a: ./interp/a\n");
    let b = d.join("interp/b").display().to_string();
    let c = d.join("interp/c").display().to_string();
    let output = run_pipeline(d, &["--environment", &format!("./conda.yml={b}"), "--python", &c]);
    assert!(output.status.success(), "the pipeline must succeed: {}", describe(&output));

    let folder = pipeline_folder(&d.join("jobs"));
    for (step, who) in [("named", "a"), ("conda", "b"), ("unmapped", "c")] {
        let seen = read(&folder.join(format!("{step}/outputs/out/who.txt")), &output);
        assert_eq!(seen, format!("{who}\n"), "step {step}");
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let a = d.join("interp/a").display().to_string();
    for line in [
        format!(
            "step `named` (command): python {a} (environment `env-a` in the environment map); \
             its environment `azureml:env-a@latest` is not built"
        ),
        format!(
            "step `conda` (command): python {b} (environment `conda.yml` in the environment \
             map); its environment image `mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu20.04`, \
             conda file `./conda.yml` is not built"
        ),
        format!(
            "step `unmapped` (command): python {c} (--python); its environment \
             `azureml:unmapped-env:2` is not built (map it to an interpreter with \
             --environment NAME=PYTHON or environments.yaml)"
        ),
    ] {
        assert!(stderr.contains(&line), "the summary must say `{line}`:\n{stderr}");
    }
}

#[test]
fn a_command_step_past_its_timeout_is_killed_with_what_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pid_file = d.join("sleeper.pid");
    let text = format!(
        "type: pipeline\njobs:\n  slow:\n    type: command\n    limits:\n      timeout: 1\n    \
         command: sleep 300 & echo $! > {}; wait\n",
        pid_file.display()
    );
    write(d, "pipeline.yml", &text);
    let output = run_pipeline(d, &[]);
    assert_eq!(output.status.code(), Some(1), "a timed-out step fails: {}", describe(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("failed: step `slow` (command) failed: the command ran past its timeout of 1s (limits.timeout) and was killed"),
        "{}",
        describe(&output)
    );
    let pid = read(&pid_file, &output).trim().to_string();
    eventually(Duration::from_secs(10), "the step's `sleep` to be killed", || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit(") ").next().and_then(|s| s.chars().next());
        matches!(state, None | Some('Z') | Some('X')).then_some(())
    });
}

#[test]
fn steps_that_do_not_depend_on_each_other_run_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Each step says it started, then waits (at most 60 s) for the other to start: run one
    // after the other, the first would give up.
    let step = |me: &str, other: &str| {
        format!(
            "  {me}:\n    type: command\n    command: >-\n      touch {dir}/{me}.here && for i in $(seq 1 600);\n      \
             do test -e {dir}/{other}.here && exit 0; sleep 0.1; done;\n      echo {other} never started >&2; exit 1\n",
            dir = d.display()
        )
    };
    let text = format!("type: pipeline\njobs:\n{}{}", step("left", "right"), step("right", "left"));
    write(d, "pipeline.yml", &text);
    let output = run_pipeline(d, &[]);
    assert!(output.status.success(), "both steps must meet: {}", describe(&output));
}

const SCORE_PY: &str = "\
import os
def init():
    pass
def run(mini_batch):
    return [os.path.basename(p) for p in mini_batch]
";

#[test]
fn resume_reruns_a_pipeline_from_its_first_step_that_did_not_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(d, "src/score.py", SCORE_PY);
    let text = format!(
        "type: pipeline\njobs:\n  first:\n    type: command\n    outputs: {{out: {{type: uri_folder}}}}\n    \
         command: echo run >> {d}/first-runs && echo data > ${{{{outputs.out}}}}/data.txt\n  \
         second:\n    type: command\n    inputs:\n      got: ${{{{parent.jobs.first.outputs.out}}}}\n    \
         command: test -e {d}/go && cat ${{{{inputs.got}}}}/data.txt > {d}/second.txt\n  \
         count:\n    type: parallel\n    inputs:\n      got: ${{{{parent.jobs.first.outputs.out}}}}\n    \
         input_data: ${{{{inputs.got}}}}\n    mini_batch_size: \"1\"\n    task:\n      type: run_function\n      \
         code: ./src\n      entry_script: score.py\n",
        d = d.display()
    );
    write(d, "pipeline.yml", &text);
    let output = run_pipeline(d, &[]);
    assert_eq!(output.status.code(), Some(1), "`second` fails at first: {}", describe(&output));
    let jobs = d.join("jobs");
    let folder = pipeline_folder(&jobs);

    std::fs::write(d.join("go"), "").unwrap();
    let resume = |folder: &Path| {
        run_bounded(
            batchfleet()
                .arg("resume")
                .arg(folder)
                .arg("--python")
                .arg(python())
                .arg("--no-progress"),
            LIMIT,
        )
    };
    let resumed = resume(&folder);
    assert!(resumed.status.success(), "the resumed pipeline must succeed: {}", describe(&resumed));
    assert_eq!(read(&d.join("second.txt"), &resumed), "data\n");
    assert_eq!(read(&d.join("first-runs"), &resumed), "run\n", "`first` succeeded: not run again");
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert!(stderr.contains("step `count` (parallel) succeeded before; not run again"), "{stderr}");
    let roots = std::fs::read_dir(&jobs).unwrap().count();
    assert_eq!(roots, 2, "the pipeline folder and `count`'s one job root");
    let result = read(&folder.join("pipeline_result.txt"), &resumed);
    assert_eq!(result.lines().next(), Some("succeeded"), "{result}");

    let again = resume(&folder);
    assert_eq!(again.status.code(), Some(2), "{}", describe(&again));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already succeeded"),
        "{}",
        describe(&again)
    );
}

/// Regression: under `--allow`, each parallel step was checked with the allow-list alone, so a
/// step reading an earlier step's output (in the pipeline's folder, under `--store`) was refused
/// when the store lay outside the allowed prefixes.
#[test]
fn under_an_allow_list_a_step_reaches_its_own_pipeline_folder() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let work = d.join("work");
    write(&work, "src/score.py", SCORE_PY);
    let text = "type: pipeline\njobs:\n  first:\n    type: command\n    outputs: {out: {type: uri_folder}}\n    \
         command: echo data > ${{outputs.out}}/a.txt && echo data > ${{outputs.out}}/b.txt\n  \
         count:\n    type: parallel\n    inputs:\n      got: ${{parent.jobs.first.outputs.out}}\n    \
         input_data: ${{inputs.got}}\n    mini_batch_size: \"1\"\n    task:\n      type: run_function\n      \
         code: ./src\n      entry_script: score.py\n";
    write(&work, "pipeline.yml", text);
    let output = run_bounded(
        batchfleet()
            .arg("run")
            .arg(work.join("pipeline.yml"))
            .arg("--store")
            .arg(d.join("jobs"))
            .arg("--allow")
            .arg(&work)
            .arg("--python")
            .arg(python())
            .arg("--no-progress"),
        LIMIT,
    );
    assert!(output.status.success(), "the steps reach their folder: {}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("outside the allow-list"), "{stderr}");
}

//! `submit` with no worker running says so, with the command that starts one: through the real
//! binaries on RabbitMQ, the printed command is pasted into a shell (with BATCHFLEET_BROKER set, as
//! its note says) and the job finishes.

use std::process::Stdio;
use std::time::Duration;

use batchfleet_tests::fleet::{amqp_url, eventually, finish_bounded, Pool};
use batchfleet_tests::{describe, file_names, python, JobFixture};

const SCRIPT: &str = "import os\n\ndef init():\n    pass\n\n\
    def run(mini_batch):\n    return [os.path.basename(p) for p in mini_batch]\n";

#[test]
fn submit_with_no_worker_says_so_with_the_command_that_starts_one() {
    let pool = Pool::new("noworker");
    let job = JobFixture::new(&file_names(4), SCRIPT, "mini_batch_size: 2", "");
    let stderr_file = job.path().join("submit.stderr");
    let child = pool
        .submit(&job.path().join("job.yaml"), &job.path().join("jobs"))
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_file).unwrap())
        .spawn()
        .expect("start batchfleet submit");
    let line = eventually(Duration::from_secs(90), "submit saying no worker consumes", || {
        std::fs::read_to_string(&stderr_file)
            .unwrap_or_default()
            .lines()
            .find(|line| line.starts_with("nothing consumes the job's queue"))
            .map(str::to_owned)
    });
    assert!(line.contains(&format!("no worker of pool `{}`", pool.name)), "{line}");
    let command = line.split("Start one with: ").nth(1).expect("a command").to_owned();
    assert!(!command.contains("***"), "no redacted password to put back: {command}");
    let password = url::Url::parse(&amqp_url()).unwrap().password().unwrap_or("").to_owned();
    assert!(password.is_empty() || !command.contains(&password), "no password: {command}");
    assert!(command.starts_with("batchfleet-worker "), "{command}");
    // Pasted into a shell as printed, with the variable its next line names set.
    let bin_dir = batchfleet_tests::binary("batchfleet-worker").parent().unwrap().to_owned();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let scratch = job.path().join("scratch");
    let mut worker = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "exec {command} --scratch-dir '{}' --python '{}'",
            scratch.display(),
            python().display()
        ))
        .env("PATH", path)
        .env("BATCHFLEET_BROKER", amqp_url())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the printed worker command");
    let output = finish_bounded(child, Duration::from_secs(120));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(worker.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    );
    let stopped = worker.wait().expect("worker exit");
    let said = std::fs::read_to_string(&stderr_file).unwrap_or_default();
    assert!(output.status.success(), "{}\n--- stderr file\n{said}", describe(&output));
    assert_eq!(job.rows().len(), 4, "{said}");
    assert!(stopped.success(), "{stopped:?}");
    assert_eq!(said.matches("nothing consumes").count(), 1, "said once: {said}");
}

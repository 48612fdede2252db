//! The first hour of a new user, as output: lines written for people (no Debug names, counts
//! in their number), errors that say what is wrong where nothing was contacted, a wrong
//! password in one line, `--help` with exit codes, `logs/readme.txt` in the job root, and a
//! resume command printed by `status` that works when pasted (no credentials in it).

use std::process::Command;
use std::time::Duration;

use batchfleet_tests::fleet::{amqp_url, eventually, run_bounded, statuses, Pool};
use batchfleet_tests::{batchfleet, binary, describe, file_names, python, JobFixture};

const BOUND: Duration = Duration::from_secs(60);
const ECHO: &str = "def init():\n    pass\n\ndef run(mini_batch):\n    return list(mini_batch)\n";

fn one_file_job() -> JobFixture {
    JobFixture::new(
        &file_names(1),
        ECHO,
        "mini_batch_size: 1\nretry_settings: {max_retries: 0, timeout: 30}",
        "",
    )
}

#[test]
fn every_command_lists_its_exit_codes_in_help() {
    for command in ["run", "submit", "resume", "watch", "autoscale", "status", "profile", "cp"] {
        let output = run_bounded(batchfleet().args([command, "--help"]), BOUND);
        let help = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{}", describe(&output));
        assert!(help.contains("Exit codes:\n  0  "), "batchfleet {command} --help: {help}");
    }
    let output = run_bounded(Command::new(binary("batchfleet-worker")).arg("--help"), BOUND);
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.contains("Exit codes:\n  0  "), "batchfleet-worker --help: {help}");
}

#[test]
fn a_run_prints_words_for_people_and_leaves_a_logs_readme() {
    let fixture = one_file_job();
    let output = fixture.run();
    assert!(output.status.success(), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    for line in [
        ", a uri_folder at file://",
        "(mode: ro_mount)",
        "mini_batch_size: 1 file;",
        "max_retries 0 (1 attempt at most)",
        "planned 1 mini-batch of 1 item\n",
        "/processed_mini-batches.csv (1 attempt);",
    ] {
        assert!(stderr.contains(line), "`{line}` missing in\n{stderr}");
    }
    assert!(stdout.contains("rows.txt (1 row)\n"), "{stdout}");
    for code_word in
        ["UriFolder", "RoMount", "1 files", "1 attempts", "1 mini-batches", "1 items", "1 rows"]
    {
        let all = format!("{stdout}{stderr}");
        assert!(!all.contains(code_word), "`{code_word}` in\n{all}");
    }

    let readme = std::fs::read_to_string(fixture.job_root().join("logs/readme.txt"))
        .expect("logs/readme.txt in the job root");
    for name in
        ["logs/job_result.txt", "logs/user/<worker>/", "logs/sys/job_report/", "logs/sys/perf/"]
    {
        assert!(readme.contains(name), "logs/readme.txt does not name {name}:\n{readme}");
    }
    assert!(readme.contains("A job failed? Open these, in this order:"), "{readme}");
}

#[test]
fn a_broker_url_no_backend_serves_is_not_called_a_refusal() {
    let fixture = one_file_job();
    let output = run_bounded(
        batchfleet()
            .arg("submit")
            .arg(fixture.path().join("job.yaml"))
            .args(["--broker", "redis://bob:s3cret@cache:6379", "--no-progress", "--store"])
            .arg(fixture.path().join("jobs"))
            .env_remove("BATCHFLEET_BROKER"),
        BOUND,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    assert_eq!(
        stderr.trim_end(),
        "error: --broker: unknown broker URL scheme `redis`: use amqp:// or amqps:// (RabbitMQ), \
         or sqs:// (SQS)"
    );
}

#[test]
fn a_missing_code_folder_is_named_as_missing() {
    let fixture = one_file_job();
    let spec = std::fs::read_to_string(fixture.path().join("job.yaml")).unwrap();
    std::fs::write(
        fixture.path().join("job.yaml"),
        spec.replace("code: ./code", "code: ./nowhere"),
    )
    .unwrap();
    let output = fixture.run();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    assert!(
        stderr.contains("task.code `") && stderr.contains("/nowhere` does not exist"),
        "{stderr}"
    );
    assert!(!stderr.contains("is not in task.code"), "{stderr}");
}

#[test]
fn a_wrong_password_is_one_line_for_submit_and_the_worker() {
    let pool = Pool::new("wrong-password");
    let mut url = url::Url::parse(&amqp_url()).unwrap();
    url.set_password(Some("not-the-password")).unwrap();
    let fixture = one_file_job();
    let output = run_bounded(
        batchfleet()
            .arg("submit")
            .arg(fixture.path().join("job.yaml"))
            .args(["--broker", url.as_str(), "--pool", &pool.name, "--no-progress", "--store"])
            .arg(fixture.path().join("jobs"))
            .env_remove("BATCHFLEET_LOG"),
        BOUND,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(stderr.lines().count(), 1, "one line:\n{stderr}");
    assert!(stderr.contains("refused the login: wrong user or password"), "{stderr}");
    assert!(!stderr.contains("not-the-password"), "{stderr}");

    let worker = run_bounded(
        Command::new(binary("batchfleet-worker"))
            .args(["--broker", url.as_str(), "--pool", &pool.name, "--scratch-dir"])
            .arg(fixture.path().join("scratch"))
            .env_remove("BATCHFLEET_LOG"),
        BOUND,
    );
    let stderr = String::from_utf8_lossy(&worker.stderr);
    assert_eq!(worker.status.code(), Some(2), "{}", describe(&worker));
    let errors: Vec<&str> = stderr.lines().filter(|l| !l.contains(" INFO ")).collect();
    assert_eq!(errors.len(), 1, "one line besides the start-up info:\n{stderr}");
    assert!(errors[0].contains("refused the login: wrong user or password"), "{stderr}");
}

/// `status` of a detached job whose mini-batches all ended prints the command that aggregates
/// it; pasted as printed (into a shell with BATCHFLEET_BROKER set, as it says), it finishes the
/// job. The broker's user and password appear nowhere in it.
#[test]
fn the_resume_command_status_prints_works_when_pasted() {
    let pool = Pool::new("paste-resume");
    let fixture = one_file_job();
    let store = fixture.path().join("jobs");
    let output =
        run_bounded(pool.submit(&fixture.path().join("job.yaml"), &store).arg("--detach"), BOUND);
    assert!(output.status.success(), "{}", describe(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let root = fixture.job_root();
    let root_url = url::Url::from_directory_path(&root).unwrap().to_string();
    assert!(stdout.contains(&format!("follow with: batchfleet status {root_url}")), "{stdout}");

    let mut worker = pool.worker(fixture.path(), "w1", 1, &[]);
    eventually(BOUND, "the mini-batch's final status", || {
        (!statuses(&root).is_empty()).then_some(())
    });
    worker.stop();

    let status = run_bounded(batchfleet().arg("status").arg(&root), BOUND);
    let text = String::from_utf8_lossy(&status.stdout);
    assert_eq!(status.status.code(), Some(3), "{}", describe(&status));
    let command = text
        .lines()
        .find_map(|line| line.strip_prefix("aggregate it with: "))
        .unwrap_or_else(|| panic!("no resume command in\n{text}"));
    assert!(command.contains("--broker \"$BATCHFLEET_BROKER\""), "{text}");
    assert!(text.contains("with BATCHFLEET_BROKER set to the job's broker"), "{text}");
    if let Some(secret) = pool.secret() {
        assert!(!text.contains(&secret) && !text.contains("***"), "credentials in\n{text}");
    }

    let pasted = run_bounded(
        Command::new("bash")
            .arg("-c")
            .arg(command)
            .env("PATH", path_with_binaries())
            .env("BATCHFLEET_BROKER", pool.broker_url())
            .env("BATCHFLEET_PYTHON", python())
            .env_remove("BATCHFLEET_STORE"),
        BOUND,
    );
    assert!(pasted.status.success(), "`{command}` as pasted:\n{}", describe(&pasted));
    assert!(String::from_utf8_lossy(&pasted.stdout).contains("succeeded"), "{}", describe(&pasted));
}

/// `PATH` with the built binaries first, as after installing them.
fn path_with_binaries() -> String {
    let bin = binary("batchfleet");
    let dir = bin.parent().expect("the binaries' folder");
    format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default())
}

/// `batchfleet cp` puts a folder's files and a file into an S3 prefix (no aws CLI needed) and
/// reads an object back to stdout.
#[test]
fn cp_copies_files_and_folders_into_the_store_and_back() {
    let prefix = batchfleet_tests::s3_unique_prefix("cp");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("inputs/sub")).unwrap();
    std::fs::write(dir.path().join("inputs/a.txt"), "alpha").unwrap();
    std::fs::write(dir.path().join("inputs/sub/b.txt"), "beta").unwrap();
    std::fs::write(dir.path().join("job.yaml"), "type: parallel\n").unwrap();

    let folder = run_bounded(
        batchfleet().current_dir(dir.path()).args(["cp", "inputs/", &format!("{prefix}/data/")]),
        BOUND,
    );
    assert!(folder.status.success(), "{}", describe(&folder));
    let line = String::from_utf8_lossy(&folder.stdout);
    assert_eq!(line.trim_end(), format!("copied 2 files (9 bytes) to {prefix}/data/"));
    let file = run_bounded(
        batchfleet().current_dir(dir.path()).args([
            "cp",
            "job.yaml",
            &format!("{prefix}/manifests/"),
        ]),
        BOUND,
    );
    assert!(file.status.success(), "{}", describe(&file));

    for (key, expected) in [
        ("data/a.txt", "alpha"),
        ("data/sub/b.txt", "beta"),
        ("manifests/job.yaml", "type: parallel\n"),
    ] {
        let back = run_bounded(batchfleet().args(["cp", &format!("{prefix}/{key}"), "-"]), BOUND);
        assert!(back.status.success(), "{key}: {}", describe(&back));
        assert_eq!(String::from_utf8_lossy(&back.stdout), expected, "{key}");
    }

    let missing = run_bounded(
        batchfleet().current_dir(dir.path()).args(["cp", "nowhere.txt", &prefix]),
        BOUND,
    );
    assert_eq!(missing.status.code(), Some(2), "{}", describe(&missing));
    assert!(String::from_utf8_lossy(&missing.stderr)
        .contains("`nowhere.txt` is neither a file nor a folder"));
}

//! A runtime that sees its job's input folder read-only (`ro_mount` on a local folder), against
//! real Python processes in a mount namespace of their own.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use batchfleet_worker::runtime::{
    read_only, MiniBatchContext, RunOutcome, RunRequest, RuntimeProcess,
};
use support::Scratch;

const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// `run()` reads each input, then tries to overwrite it, remove it and create a file beside it,
/// and reports how each try ended.
const TRIES: &str = r#"
import errno, os
def init(): pass
def attempt(what, act):
    try:
        act()
        return what + " ok"
    except OSError as e:
        return what + " " + errno.errorcode.get(e.errno, str(e.errno))
def run(mini_batch):
    rows = []
    for path in mini_batch:
        rows.append("read " + open(path).read())
        rows.append(attempt("overwrite", lambda: open(path, "w").write("x")))
        rows.append(attempt("remove", lambda: os.remove(path)))
        beside = os.path.join(os.path.dirname(path), "new.txt")
        rows.append(attempt("create", lambda: open(beside, "w").close()))
    return rows
"#;

async fn run_rows(
    process: &mut RuntimeProcess,
    scratch: &Scratch,
    index: u64,
    item: &str,
) -> String {
    let output = scratch.path().join(format!("out-{index}.txt"));
    let request = RunRequest {
        batch_id: format!("{index:08}"),
        items: vec![item.to_string()],
        context: MiniBatchContext::for_files(index),
        output: output.clone(),
        attach_max: None,
        table: None,
    };
    match process.run(request, RUN_TIMEOUT).await.expect("run") {
        RunOutcome::Succeeded(_) => std::fs::read_to_string(&output).expect("output file"),
        RunOutcome::Failed(failure) => panic!("run failed: {failure:?}"),
    }
}

/// A scratch folder with `data/a.txt` holding `first`.
fn scratch_with_input() -> (Scratch, PathBuf) {
    let scratch = Scratch::new();
    let data = scratch.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("a.txt"), "first").unwrap();
    (scratch, data)
}

#[tokio::test]
async fn the_input_folder_is_read_only_for_the_runtime_alone() {
    let (scratch, data) = scratch_with_input();
    let mut config = scratch.script("tries.py", TRIES);
    config.read_only = vec![data.clone()];
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mut process = RuntimeProcess::start(&config).await.expect("start");
    assert!(
        process.inputs_read_only(),
        "no view: this test needs a machine that lets the worker make a mount namespace (root \
         with CAP_SYS_ADMIN, or unprivileged user namespaces) and Linux 5.12 or later"
    );
    let after = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert_eq!(mounts, after, "the view's mounts stay in the runtime's namespace");

    let rows = run_rows(&mut process, &scratch, 0, &data.join("a.txt").to_string_lossy()).await;
    assert_eq!(rows, "read first\noverwrite EROFS\nremove EROFS\ncreate EROFS\n");
    assert_eq!(std::fs::read_to_string(data.join("a.txt")).unwrap(), "first", "untouched");
    assert!(!data.join("new.txt").exists());

    // Outside the runtime the folder takes writes, and the runtime sees them.
    std::fs::write(data.join("b.txt"), "second").expect("the folder is writable outside");
    let rows = run_rows(&mut process, &scratch, 1, &data.join("b.txt").to_string_lossy()).await;
    assert_eq!(rows, "read second\noverwrite EROFS\nremove EROFS\ncreate EROFS\n");
    process.shutdown(Duration::from_secs(10)).await.expect("shutdown");
}

#[tokio::test]
async fn without_a_view_the_same_runtime_writes_where_it_is_told() {
    let (scratch, data) = scratch_with_input();
    let mut process =
        RuntimeProcess::start(&scratch.script("tries.py", TRIES)).await.expect("start");
    assert!(!process.inputs_read_only());
    let rows = run_rows(&mut process, &scratch, 0, &data.join("a.txt").to_string_lossy()).await;
    // The control for the test above: the same script, and every try succeeds.
    assert_eq!(rows, "read first\noverwrite ok\nremove ok\ncreate ok\n");
    assert!(!data.join("a.txt").exists() && data.join("new.txt").exists());
    process.shutdown(Duration::from_secs(10)).await.expect("shutdown");
}

#[tokio::test]
async fn a_view_that_fails_for_one_folder_leaves_that_runtime_without_it_and_no_other() {
    let scratch = Scratch::new();
    let mut config = scratch.script("ok.py", "def init(): pass\ndef run(mb): return mb\n");
    // The bind of a folder that is gone fails in the child (ENOENT): the runtime starts
    // without the view, and the worker does not take it for a refusal of namespaces.
    config.read_only = vec![scratch.path().join("gone")];
    let process = RuntimeProcess::start(&config).await.expect("started without the view");
    assert!(!process.inputs_read_only());
    process.shutdown(Duration::from_secs(10)).await.expect("shutdown");
    assert!(!read_only::refused(), "a folder's failure is not remembered for the process");

    let data = scratch.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    config.read_only = vec![data];
    let process = RuntimeProcess::start(&config).await.expect("start");
    assert!(process.inputs_read_only(), "the next runtime gets its view");
    process.shutdown(Duration::from_secs(10)).await.expect("shutdown");
}

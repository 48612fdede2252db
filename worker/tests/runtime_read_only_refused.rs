//! A runtime whose read-only view cannot be made starts without it, and later runtimes of the
//! process do not try again. (A test binary of its own: the refusal is remembered per process.)

mod support;

use std::time::Duration;

use batchfleet_worker::runtime::{read_only, RuntimeProcess};
use support::Scratch;

#[tokio::test]
async fn a_view_that_cannot_be_made_leaves_the_runtime_without_it() {
    let scratch = Scratch::new();
    let mut config = scratch.script("ok.py", "def init(): pass\ndef run(mb): return mb\n");
    // The bind of a folder that does not exist fails in the child, as a refused namespace
    // does where the worker lacks the right to make one.
    config.read_only = vec![scratch.path().join("missing")];
    assert!(!read_only::refused());
    let process = RuntimeProcess::start(&config).await.expect("started without the view");
    assert!(!process.inputs_read_only());
    assert!(read_only::refused(), "the process remembers the refusal");
    process.shutdown(Duration::from_secs(10)).await.expect("shutdown");

    // The next runtime does not try: it would not fail anyway, but it gets no view.
    let data = scratch.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    config.read_only = vec![data];
    let process = RuntimeProcess::start(&config).await.expect("start");
    assert!(!process.inputs_read_only());
    process.shutdown(Duration::from_secs(10)).await.expect("shutdown");
}

//! Tests of the page, the trace and `batchfleet profile` on a job root written by hand.

use bytes::Bytes;
use object_store::ObjectStoreExt;
use url::Url;

use batchfleet_common::job_root::JobRoot;

use super::analysis::Profile;
use super::analysis_tests::simulate;
use super::{load, page, trace};
use crate::modes::profile::{profile, ProfileOptions};

/// A job root under `dir` with `records` in two workers' files, one line of garbage among them.
async fn job_root(dir: &std::path::Path, records: usize) -> JobRoot {
    let store = Url::from_directory_path(dir).expect("a folder URL");
    let root = JobRoot::create(&store, "job-1").expect("a job root");
    root.store().put(&root.layout.job_json(), Bytes::from("{}").into()).await.expect("job.json");
    let all = simulate(records as u64, 4, 3, 10);
    for worker in ["w1", "w2"] {
        let mut text = String::new();
        for record in all.iter().filter(|r| r.worker == worker) {
            text.push_str(&serde_json::to_string(record).expect("json"));
            text.push('\n');
        }
        if worker == "w2" {
            text.push_str("{\"batch_id\": \"cut short\n");
        }
        root.store()
            .put(&root.layout.records_file(worker, "i1", 1), Bytes::from(text).into())
            .await
            .expect("put");
    }
    root
}

#[tokio::test]
async fn the_page_embeds_the_data_and_the_skipped_line_is_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = job_root(dir.path(), 30).await;
    let data = load::load(&root).await.expect("load");
    assert_eq!(data.records.len(), 30);
    assert_eq!(data.records_files, 2);
    assert_eq!(data.skipped.len(), 1);
    assert_eq!(data.skipped[0].file, "records/w2/i1-000001.jsonl");
    let w2_lines = data.records.iter().filter(|r| r.worker == "w2").count();
    let line = format!("line {}:", w2_lines + 1);
    assert!(data.skipped[0].why.starts_with(&line), "{line} {:?}", data.skipped);
    assert!(data.resources.is_empty());

    let analysed = Profile::new(&data.records);
    let html = page::html(&data, &analysed).expect("html");
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("id=\"profile-data\""));
    assert!(html.contains("\"skipped_total\":1"), "the page names the skipped line");
    assert!(html.contains("records/w2/i1-000001.jsonl"));
    assert!(!html.contains("http://") && !html.contains("https://"), "no network in the page");
    assert!(html.contains("data-ready=\"0\" data-errors=\"0\""));
}

#[test]
fn script_end_tags_in_the_data_cannot_end_the_data_element() {
    let mut records = simulate(3, 1, 9, 1);
    records[0].error = Some("</script><script>alert(1)</script>".into());
    let data = load::JobData { job_id: "<job>".into(), records, ..Default::default() };
    let analysed = Profile::new(&data.records);
    let html = page::html(&data, &analysed).expect("html");
    assert!(!html.contains("</script><script>alert"));
    assert!(html.contains("<title>Profile of &lt;job&gt;</title>"));
}

#[test]
fn the_trace_has_one_complete_event_per_phase_and_names_workers_and_slots() {
    let records = simulate(8, 2, 99, 1);
    let analysed = Profile::new(&records);
    let trace = trace::trace(&analysed, "job-1");
    let events = trace["traceEvents"].as_array().expect("events");
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["ph"] == "M")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    assert!(names.contains(&"worker w1") && names.contains(&"worker w2"), "{names:?}");
    assert!(names.contains(&"slot 0"), "{names:?}");
    let attempts = events.iter().filter(|e| e["cat"] == "attempt").count();
    assert_eq!(attempts, 8);
    let runs = events.iter().filter(|e| e["ph"] == "X" && e["name"] == "run").count();
    assert_eq!(runs, 8);
    // The first attempt on each slot started a runtime: 2 start phases.
    let starts = events.iter().filter(|e| e["name"] == "start").count();
    assert_eq!(starts, 2);
    assert!(events.iter().all(|e| e["ph"] != "X" || e["dur"].as_u64().is_some()));
}

#[tokio::test]
async fn profile_writes_both_files_here_and_in_the_job_root() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = job_root(dir.path(), 12).await;
    let out = dir.path().join("out");
    let options = ProfileOptions {
        job: dir.path().join("job-1").to_string_lossy().into_owned(),
        store: None,
        out: Some(out.clone()),
    };
    let written = profile(&options).await.expect("profile");
    assert_eq!(written.attempts, 12);
    assert_eq!(written.skipped, 1);
    assert!(out.join("profile.html").is_file() && out.join("trace.json").is_file());
    let in_root = dir.path().join("job-1/logs/sys/profile");
    assert!(in_root.join("profile.html").is_file() && in_root.join("trace.json").is_file());
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("trace.json")).expect("read"))
            .expect("json");
    assert!(trace["traceEvents"].as_array().is_some_and(|e| !e.is_empty()));

    // A job without records is refused, naming where they were looked for.
    root.delete(&root.layout.records_file("w1", "i1", 1)).await.expect("delete");
    root.delete(&root.layout.records_file("w2", "i1", 1)).await.expect("delete");
    let error = profile(&options).await.expect_err("no records");
    assert!(error.is_no_records(), "{error}");
    assert!(error.to_string().contains("has no attempt records under file://"), "{error}");
}

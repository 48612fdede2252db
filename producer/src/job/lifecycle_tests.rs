use super::*;

#[test]
fn job_ids_are_safe_and_time_ordered() {
    let id = new_job_id("my job/1");
    assert!(id.starts_with("my-job-1-"), "{id}");
    assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'), "{id}");
}

#[test]
fn a_root_url_splits_into_store_and_job_id() {
    let url = Url::parse("file:///data/jobs/my-job-1/").unwrap();
    let (store, id) = split_root(&url).unwrap();
    assert_eq!(store.as_str(), "file:///data/jobs/");
    assert_eq!(id, "my-job-1");
    let url = Url::parse("file:///data/jobs/my-job-1").unwrap();
    assert_eq!(split_root(&url).unwrap().1, "my-job-1");
}

//! The job root handle (one type, `batchfleet_common::job_root::JobRoot`) and new job ids.

pub use batchfleet_common::job_root::JobRoot;

/// A job id that sorts by start time and does not collide: `<name>-<yyyymmdd-hhmmss>-<4 hex>`.
pub fn new_job_id(name: &str) -> String {
    let now = std::time::SystemTime::now();
    let stamp = humantime::format_rfc3339_seconds(now).to_string();
    let stamp: String = stamp.chars().filter(|c| c.is_ascii_digit()).collect();
    let (date, time) = stamp.split_at(8.min(stamp.len()));
    let nanos = now.duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let salt = (nanos ^ std::process::id().rotate_left(16)) & 0xffff;
    let safe_name: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' })
        .collect();
    format!("{safe_name}-{date}-{time}-{salt:04x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_are_safe_and_time_ordered() {
        let id = new_job_id("my job/1");
        assert!(id.starts_with("my-job-1-"), "{id}");
        assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'), "{id}");
    }
}

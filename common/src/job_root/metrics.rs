//! What a job root counts of its store traffic, through the `metrics` facade (a no-op until a
//! process installs an exporter: `--metrics-addr`). The worker's `telemetry::metrics` describes
//! these with the rest; docs/metrics.md lists them.

/// Requests to the store, by `operation` (`put`, `get`, `head`, `delete`, `list`, `create`)
/// and `result` (`ok`, `not_found`, `already_exists`, `error`).
pub const STORAGE_REQUESTS: &str = "batchfleet_storage_requests_total";
/// Create-only puts (statuses) that found the key already there: another attempt or the
/// dead-letter router was first.
pub const STORAGE_CREATE_CONFLICTS: &str = "batchfleet_storage_create_conflicts_total";

/// The `result` label of a store call's outcome.
pub(crate) fn result_label<T>(result: &Result<T, object_store::Error>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(object_store::Error::NotFound { .. }) => "not_found",
        Err(object_store::Error::AlreadyExists { .. }) => "already_exists",
        Err(_) => "error",
    }
}

/// Count one store request.
pub(crate) fn observe<T>(operation: &'static str, result: &Result<T, object_store::Error>) {
    request(operation, result_label(result));
}

/// Count one store request whose outcome is already a label.
pub(crate) fn request(operation: &'static str, result: &'static str) {
    metrics::counter!(STORAGE_REQUESTS, "operation" => operation, "result" => result).increment(1);
}

/// Count a create-only put that found its key taken.
pub(crate) fn create_conflict() {
    metrics::counter!(STORAGE_CREATE_CONFLICTS).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_get_their_labels() {
        let not_found: Result<(), _> =
            Err(object_store::Error::NotFound { path: "k".into(), source: "gone".into() });
        let exists: Result<(), _> =
            Err(object_store::Error::AlreadyExists { path: "k".into(), source: "there".into() });
        let other: Result<(), _> =
            Err(object_store::Error::Generic { store: "s", source: "broken".into() });
        assert_eq!(result_label(&Ok::<_, object_store::Error>(())), "ok");
        assert_eq!(result_label(&not_found), "not_found");
        assert_eq!(result_label(&exists), "already_exists");
        assert_eq!(result_label(&other), "error");
    }
}

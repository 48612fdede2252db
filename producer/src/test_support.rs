//! Builders for unit tests.

use std::collections::BTreeMap;

use batchfleet_common::job::{
    InputKind, InputMode, InputSpec, LoggingLevel, MiniBatchSize, ProgramArgs, ResolvedJob,
    RetrySettings, TaskSpec,
};

/// A valid job with Azure's defaults over a local folder.
pub fn minimal_job() -> ResolvedJob {
    ResolvedJob {
        name: "test".into(),
        display_name: None,
        description: None,
        experiment_name: None,
        tags: BTreeMap::new(),
        spec_file: "job.yaml".into(),
        input: InputSpec {
            name: "data".into(),
            kind: InputKind::UriFolder,
            url: "file:///tmp/in".into(),
            mode: InputMode::RoMount,
        },
        inputs: BTreeMap::new(),
        mini_batch_size: MiniBatchSize::Count(1),
        partition_keys: Vec::new(),
        instance_count: 1,
        max_concurrency_per_instance: 1,
        mini_batch_error_threshold: -1,
        logging_level: LoggingLevel::Info,
        retry: RetrySettings { max_retries: 2, timeout_secs: 60 },
        task: TaskSpec {
            code: "file:///tmp/code".into(),
            entry_script: "score.py".into(),
            program_args: ProgramArgs::default(),
            script_args: Vec::new(),
            append_row_to: None,
            append_row_to_output: None,
            environment: None,
        },
        outputs: BTreeMap::new(),
        environment_variables: BTreeMap::new(),
        compute: None,
        confined: false,
        job_root_format: batchfleet_common::job_root::JOB_ROOT_FORMAT,
    }
}

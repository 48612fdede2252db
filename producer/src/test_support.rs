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

/// What a [`RuledPuts`] store does with a put: its test's fault (refuse a key, answer like an
/// odd S3 server); `inner` is the store that really holds the objects.
#[async_trait::async_trait]
pub trait PutRule: std::fmt::Debug + Send + Sync + 'static {
    async fn put(
        &self,
        inner: &object_store::memory::InMemory,
        location: &object_store::path::Path,
        payload: object_store::PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult>;
}

/// An in-memory store whose puts go through a [`PutRule`]; every other call is the memory's.
#[derive(Debug)]
pub struct RuledPuts<R>(pub object_store::memory::InMemory, pub R);

impl<R: PutRule> RuledPuts<R> {
    pub fn new(rule: R) -> RuledPuts<R> {
        RuledPuts(object_store::memory::InMemory::new(), rule)
    }
}

impl<R: PutRule> std::fmt::Display for RuledPuts<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RuledPuts({:?})", self.1)
    }
}

#[async_trait::async_trait]
impl<R: PutRule> object_store::ObjectStore for RuledPuts<R> {
    async fn put_opts(
        &self,
        location: &object_store::path::Path,
        payload: object_store::PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.1.put(&self.0, location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &object_store::path::Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.0.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &object_store::path::Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.0.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: futures::stream::BoxStream<
            'static,
            object_store::Result<object_store::path::Path>,
        >,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>> {
        self.0.delete_stream(locations)
    }
    fn list(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.0.list(prefix)
    }
    async fn list_with_delimiter(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> object_store::Result<object_store::ListResult> {
        self.0.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &object_store::path::Path,
        to: &object_store::path::Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.0.copy_opts(from, to, options).await
    }
}

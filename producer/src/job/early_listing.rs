//! A folder input's listing started before planning needs it.

use futures::stream::BoxStream;
use object_store::ObjectMeta;

use batchfleet_common::job::{InputKind, ResolvedJob};
use batchfleet_common::store::listing::{list_reporting_sizes, started, Sizes, Skipped};
use batchfleet_common::store::{self, StoreError};

/// A listing's objects, in key order.
pub(crate) type ObjectStream = BoxStream<'static, Result<ObjectMeta, StoreError>>;

/// The sizes an early listing reads: those a plan that records identities needs.
const SIZES: Sizes = Sizes::Read;

/// A folder input's listing, started before planning needs it (`run` and `submit` start it
/// once the job is checked): the walk of a local folder of 100,000 files (reading and sorting
/// it, then each file's size) takes longer than the interpreter's answer, the job root and the
/// runtimes' start, which it would otherwise wait for. Planning takes it when it lists the
/// same input with the same sizes; else it is dropped, which stops it.
pub struct EarlyListing {
    url: String,
    started: std::sync::Mutex<Option<(ObjectStream, Skipped)>>,
}

impl EarlyListing {
    /// Start listing `job`'s input when planning will list it as a folder of files (not a
    /// table, not by partition), with the sizes a plan that records identities reads; `None`
    /// when planning lists nothing of the kind or the input cannot be opened (planning then
    /// says why). Inside a Tokio runtime.
    pub fn start(job: &ResolvedJob) -> Option<EarlyListing> {
        let lists_files = job.input.kind == InputKind::UriFolder && job.partition_keys.is_empty();
        if !lists_files {
            return None;
        }
        let input = store::open_str(&job.input.url).ok()?;
        // Its warnings wait for planning: the job is announced first.
        let skipped = Skipped::held();
        let objects = list_reporting_sizes(&input, skipped.clone(), SIZES);
        let objects = started(job.input.url.clone(), objects);
        Some(EarlyListing {
            url: job.input.url.clone(),
            started: std::sync::Mutex::new(Some((objects, skipped))),
        })
    }

    /// The started listing, when it lists `url` with `sizes` and was not taken yet; the
    /// entries it skipped are warned of from now on.
    pub(crate) fn take(&self, url: &str, sizes: Sizes) -> Option<(ObjectStream, Skipped)> {
        if url != self.url || sizes != SIZES {
            return None;
        }
        let (objects, skipped) = self.started.lock().ok()?.take()?;
        skipped.say();
        Some((objects, skipped))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::job::plan::{plan_and_publish, DryPlan, PlanTarget};
    use batchfleet_common::broker::embedded::EmbeddedBroker;
    use batchfleet_common::job::MiniBatchSize;
    use batchfleet_common::job_root::JobRoot;

    /// A job over a folder of `files` files of 1 to 3 bytes.
    fn folder_job(dir: &std::path::Path, files: usize) -> ResolvedJob {
        let input = dir.join("in");
        std::fs::create_dir_all(&input).unwrap();
        for i in 0..files {
            std::fs::write(input.join(format!("f{i:04}.txt")), "x".repeat(1 + i % 3)).unwrap();
        }
        let mut job = crate::test_support::minimal_job();
        job.input.url = url::Url::from_directory_path(&input).unwrap().to_string();
        job.mini_batch_size = MiniBatchSize::Count(7);
        job
    }

    /// The dry plan of `job`: each batch's (items, bytes).
    async fn dry_plan(job: &ResolvedJob, early: Option<&EarlyListing>) -> Vec<(u64, u64)> {
        let dir = tempfile::tempdir().unwrap();
        let root =
            JobRoot::create(&url::Url::from_directory_path(dir.path()).unwrap(), "j").unwrap();
        let broker = EmbeddedBroker::new();
        let dry = Mutex::new(DryPlan::default());
        let target =
            PlanTarget { dry: Some(&dry), early, ..PlanTarget::new(&root, &broker, "work") };
        plan_and_publish(job, &target).await.unwrap();
        let batches = std::mem::take(&mut dry.lock().unwrap().batches);
        batches
    }

    #[tokio::test]
    async fn planning_takes_the_started_listing_and_cuts_the_same_batches() {
        let dir = tempfile::tempdir().unwrap();
        let job = folder_job(dir.path(), 100);
        let listed_at_plan_time = dry_plan(&job, None).await;
        assert_eq!(listed_at_plan_time.len(), 15);
        let early = EarlyListing::start(&job).expect("a folder input's listing starts early");
        assert_eq!(dry_plan(&job, Some(&early)).await, listed_at_plan_time);
        assert!(
            early.take(&job.input.url, Sizes::Read).is_none(),
            "planning must have taken the started listing"
        );
    }

    #[tokio::test]
    async fn a_listing_of_another_input_or_sizes_is_not_taken() {
        let dir = tempfile::tempdir().unwrap();
        let job = folder_job(dir.path(), 3);
        let early = EarlyListing::start(&job).unwrap();
        assert!(early.take("file:///elsewhere/", Sizes::Read).is_none());
        assert!(early.take(&job.input.url, Sizes::Skip).is_none());
        assert!(early.take(&job.input.url, Sizes::Read).is_some());
    }

    #[tokio::test]
    async fn inputs_planned_by_partition_or_as_a_table_or_one_file_start_no_listing() {
        let dir = tempfile::tempdir().unwrap();
        let job = folder_job(dir.path(), 3);
        let mut partitioned = job.clone();
        partitioned.partition_keys = vec!["Store".into()];
        assert!(EarlyListing::start(&partitioned).is_none());
        for kind in [InputKind::Mltable, InputKind::UriFile] {
            let mut other = job.clone();
            other.input.kind = kind;
            assert!(EarlyListing::start(&other).is_none(), "{kind:?}");
        }
    }
}

//! Where a slot's attempts write `run()`'s rows locally, and the names of their result parts.

use std::path::PathBuf;

use crate::input::materialize::memory_folder;
use crate::runtime::AHEAD_DEPTH;

use super::attempt::{AttemptEnd, AttemptFailure};
use super::Slot;

impl Slot {
    /// This attempt's result part: `<attempt>-<worker>-s<slot>-<process><n>`. The attempt
    /// alone does not make it unique: a batch published twice (a resumed job) is delivered
    /// twice with the same count, possibly to the same slot, and a part that another attempt's
    /// status already names must never be overwritten or deleted.
    /// Attempt markers (`counting`) are named the same way, for the same uniqueness.
    pub(super) fn part_name(&mut self, attempt: u32) -> String {
        self.attempts += 1;
        let (worker, instance) = (&self.shared.config.worker_id, &self.shared.instance);
        format!("{attempt}-{worker}-s{}-{instance}{}", self.index, self.attempts)
    }

    /// `run()`'s output file in the slot's folder (for a job root in an object store).
    pub(super) async fn local_output_file(
        &mut self,
        batch_id: &str,
    ) -> Result<PathBuf, AttemptEnd> {
        let out_dir = self.dir.join("out");
        if !self.out_dir_ready {
            tokio::fs::create_dir_all(&out_dir).await.map_err(|e| {
                AttemptEnd::from(AttemptFailure::infra("creating the output folder", e))
            })?;
            self.out_dir_ready = true;
        }
        Ok(out_dir.join(format!("{batch_id}.txt")))
    }

    /// `run()`'s output file for a format-2 job root: one per slot, reused batch after batch
    /// (the runtime opens it truncating); a large result is moved or uploaded from it. In the
    /// slot's folder in `/dev/shm` when the scratch folder is on a disk: ext4 writes back a
    /// file truncated and rewritten when it is closed (`auto_da_alloc`), milliseconds a batch.
    ///
    /// One more such file than requests may be queued ahead take turns, batch after batch: the
    /// runtime writes the rows of the batches sent ahead while the worker may still read the
    /// rows of the batch before them.
    pub(super) async fn reused_output_file(&mut self) -> Result<PathBuf, AttemptEnd> {
        let name = rows_file_name(self.rows_turn);
        self.rows_turn = (self.rows_turn + 1) % ROWS_FILES;
        let memory = self.memory.get_or_insert_with(|| memory_folder(&self.dir));
        match memory {
            Some(memory) => Ok(memory.path().join(format!("{name}.txt"))),
            None => self.local_output_file(&name).await,
        }
    }

    /// The reused output file the attempt after those of the deliveries taken ahead gets (see
    /// `reused_output_file`), once the slot has one.
    pub(super) fn output_file_after_ahead(&self) -> Option<PathBuf> {
        let name = rows_file_name((self.rows_turn + self.ahead.len()) % ROWS_FILES);
        match self.memory.as_ref()? {
            Some(memory) => Some(memory.path().join(format!("{name}.txt"))),
            None => self.out_dir_ready.then(|| self.dir.join("out").join(format!("{name}.txt"))),
        }
    }
}

/// The reused output files of a slot: one for the batch the worker handles, and one for each
/// request queued ahead.
const ROWS_FILES: usize = AHEAD_DEPTH + 1;

/// The name of one of a slot's reused output files.
fn rows_file_name(turn: usize) -> String {
    format!("rows-{turn}")
}

/// Remove a local output file that is not (or no longer) a result part. One unlink, done in
/// place: a trip to the blocking pool costs more than the syscall.
pub(super) fn remove_output(output: &std::path::Path) {
    if let Err(error) = std::fs::remove_file(output) {
        if error.kind() != std::io::ErrorKind::NotFound {
            tracing::debug!(%error, "removing the local output file");
        }
    }
}

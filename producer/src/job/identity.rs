//! A mini-batch's identity: a SHA-256 of what determines its result (docs/reuse.md).
//!
//! The job's part ([`JobIdentity::of`]) hashes the entry script's code folder by content, the
//! entry script's name, its arguments and environment variables, the interpreter, the input
//! (URL, kind, mode) and the job's other declared inputs. A batch's identity adds each item's
//! identity, in the batch's order: a local file's path, size and modification time (or its
//! content's hash, [`ItemsBy::Content`]); an object's key, size and ETag; a table piece's file,
//! byte range (or row groups) and that file's own identity.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use object_store::{ObjectMeta, ObjectStoreExt};
use sha2::{Digest, Sha256};

use batchfleet_common::job::ResolvedJob;
use batchfleet_common::store;
use batchfleet_common::table::TableBatch;

use crate::error::ProducerError;

/// What an input file's identity is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ItemsBy {
    /// Path (key), size and modification time (object stores: the ETag).
    #[default]
    Metadata,
    /// A local file's content, hashed (object stores: the ETag, which is the store's hash).
    Content,
}

impl ItemsBy {
    /// `--reuse-by`'s values.
    pub fn parse(text: &str) -> Result<ItemsBy, ProducerError> {
        match text {
            "metadata" => Ok(ItemsBy::Metadata),
            "content" => Ok(ItemsBy::Content),
            other => Err(ProducerError::Unsupported(format!(
                "--reuse-by `{other}`: expected `metadata` (path, size, modification time) or \
                 `content` (a hash of each local file)"
            ))),
        }
    }
}

/// The job's part of every batch identity, and how items are identified.
#[derive(Debug)]
pub struct JobIdentity {
    job_hash: String,
    items_by: ItemsBy,
    /// The files table pieces read, each identified once (`url` → its identity).
    files: Mutex<HashMap<String, String>>,
    /// The job's input URL and the local path it names (none for a cloud store): parsed once,
    /// not once per listed file.
    input: (String, Option<PathBuf>),
}

/// The version of the identity recipe: a new recipe never matches an old identity.
const RECIPE: &str = "batchfleet-identity-1";

impl JobIdentity {
    /// Hash what of `job` determines its batches' results; `interpreter` names the Python that
    /// runs them (see [`interpreter_identity`]).
    pub async fn of(
        job: &ResolvedJob,
        interpreter: &str,
        items_by: ItemsBy,
    ) -> Result<JobIdentity, ProducerError> {
        let code = code_hash(&job.task.code).await?;
        let described = serde_json::json!({
            "recipe": RECIPE,
            "code": code,
            "entry_script": job.task.entry_script,
            "script_args": job.task.script_args,
            "environment_variables": job.environment_variables,
            "environment": job.task.environment,
            "interpreter": interpreter,
            "input": { "url": job.input.url, "kind": job.input.kind, "mode": job.input.mode },
            "inputs": job.inputs,
            "partition_keys": job.partition_keys,
            "append_row_dataframe_header": job.task.program_args.append_row_dataframe_header,
        });
        Ok(JobIdentity {
            job_hash: sha256_hex(described.to_string().as_bytes()),
            items_by,
            files: Mutex::default(),
            input: (job.input.url.clone(), local_path(&job.input.url)),
        })
    }

    /// The identity of a batch of files, from its items' identities in batch order.
    pub fn files_batch(&self, items: &[String]) -> String {
        let mut hasher = Sha256::new();
        hasher.update(self.job_hash.as_bytes());
        hasher.update(b"\nfiles\n");
        for item in items {
            hasher.update(item.as_bytes());
            hasher.update(b"\n");
        }
        hex::encode(hasher.finalize())
    }

    /// One listed file's identity: `item` is its key relative to the input folder.
    pub async fn file_item(
        &self,
        input_url: &str,
        item: &str,
        meta: &ObjectMeta,
    ) -> Result<String, ProducerError> {
        let parsed;
        let local = match input_url == self.input.0 {
            true => &self.input.1,
            false => {
                parsed = local_path(input_url);
                &parsed
            }
        };
        match (self.items_by, local) {
            (ItemsBy::Content, Some(dir)) => {
                let path = if dir.is_file() { dir.clone() } else { dir.join(item) };
                let hash = file_content_hash(&path).await?;
                Ok(format!("{item}\tcontent:{hash}"))
            }
            (_, Some(_)) => Ok(format!("{item}\t{}\t{}", meta.size, mtime_nanos(meta))),
            (_, None) => Ok(format!(
                "{item}\t{}\t{}",
                meta.size,
                meta.e_tag.clone().unwrap_or_else(|| format!("mtime:{}", mtime_nanos(meta)))
            )),
        }
    }

    /// A tabular batch's identity: its read settings, pieces (file, size, range or row groups,
    /// path columns), partition values and each piece's file identity (one `head` per file).
    pub async fn table_batch(&self, table: &TableBatch) -> Result<String, ProducerError> {
        let mut hasher = Sha256::new();
        hasher.update(self.job_hash.as_bytes());
        hasher.update(b"\ntable\n");
        let described = serde_json::to_vec(table).map_err(ProducerError::internal)?;
        hasher.update(&described);
        for piece in &table.pieces {
            hasher.update(b"\n");
            hasher.update(self.table_file(&piece.url).await?.as_bytes());
        }
        Ok(hex::encode(hasher.finalize()))
    }

    async fn table_file(&self, url: &str) -> Result<String, ProducerError> {
        if let Some(known) = self.files.lock().ok().and_then(|files| files.get(url).cloned()) {
            return Ok(known);
        }
        let location = store::open_str(url)?;
        let meta = location
            .store
            .head(&location.prefix)
            .await
            .map_err(|e| store::StoreError::io("head", &location.prefix, e))?;
        let identity = self.file_item(url, "", &meta).await?;
        if let Ok(mut files) = self.files.lock() {
            files.insert(url.to_string(), identity.clone());
        }
        Ok(identity)
    }
}

/// The interpreter as `run` starts it: its path and the size and modification time of the
/// file it resolves to (a Python upgraded in place changes them).
pub fn interpreter_identity(python: &Path) -> String {
    let target = std::fs::canonicalize(python).unwrap_or_else(|_| python.to_path_buf());
    let (size, modified) = std::fs::metadata(&target)
        .map(|m| {
            let modified = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            (m.len(), modified)
        })
        .unwrap_or((0, 0));
    format!("{}\t{}\t{size}\t{modified}", python.display(), target.display())
}

/// The local path `url` names; none for a cloud store (or what is not a URL).
fn local_path(url: &str) -> Option<PathBuf> {
    url::Url::parse(url).ok().as_ref().and_then(store::local_path)
}

fn mtime_nanos(meta: &ObjectMeta) -> i64 {
    meta.last_modified.timestamp_nanos_opt().unwrap_or_else(|| meta.last_modified.timestamp())
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

async fn file_content_hash(path: &Path) -> Result<String, ProducerError> {
    let bytes = tokio::fs::read(path).await.map_err(|e| {
        ProducerError::internal(format!("cannot read {} to hash it: {e}", path.display()))
    })?;
    Ok(sha256_hex(&bytes))
}

/// The code folder's content: every file's relative path and bytes, in path order
/// (`__pycache__` folders and `.pyc` files left out).
async fn code_hash(code_url: &str) -> Result<String, ProducerError> {
    let location = store::open_str(code_url)?;
    let prefix = location.prefix.as_ref().to_string();
    let mut listed: Vec<ObjectMeta> = {
        use futures::TryStreamExt;
        let listing = location.store.list(Some(&location.prefix));
        listing
            .try_collect()
            .await
            .map_err(|e| store::StoreError::io("list", &location.prefix, e))?
    };
    listed.sort_by(|a, b| a.location.cmp(&b.location));
    let mut hasher = Sha256::new();
    for meta in listed {
        let key = meta.location.as_ref();
        let rel = key.strip_prefix(prefix.as_str()).unwrap_or(key).trim_start_matches('/');
        if rel.split('/').any(|part| part == "__pycache__") || rel.ends_with(".pyc") {
            continue;
        }
        let bytes = location
            .store
            .get(&meta.location)
            .await
            .map_err(|e| store::StoreError::io("get", &meta.location, e))?
            .bytes()
            .await
            .map_err(|e| store::StoreError::io("get", &meta.location, e))?;
        hasher.update(rel.as_bytes());
        hasher.update(b"\0");
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(&bytes);
    }
    Ok(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_identity_follows_its_items_and_their_order() {
        let identity = JobIdentity {
            job_hash: "j".into(),
            items_by: ItemsBy::Metadata,
            files: Mutex::default(),
            input: (String::new(), None),
        };
        let ab = identity.files_batch(&["a\t1\t5".into(), "b\t1\t5".into()]);
        assert_eq!(ab, identity.files_batch(&["a\t1\t5".into(), "b\t1\t5".into()]));
        assert_ne!(ab, identity.files_batch(&["b\t1\t5".into(), "a\t1\t5".into()]));
        assert_ne!(ab, identity.files_batch(&["a\t1\t6".into(), "b\t1\t5".into()]));
        let other_job = JobIdentity {
            job_hash: "k".into(),
            items_by: ItemsBy::Metadata,
            files: Mutex::default(),
            input: (String::new(), None),
        };
        assert_ne!(ab, other_job.files_batch(&["a\t1\t5".into(), "b\t1\t5".into()]));
    }
}

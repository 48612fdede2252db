//! The allow-list: where a job may read and write, checked on every place its file names.
//!
//! `batchfleet watch` runs jobs that anyone who can drop a manifest wrote, and `run`/`submit`
//! take `--allow` too: a job is refused unless every place it names — `task.code`, every
//! input (`input_data`'s and the side inputs, datastore paths included, as resolved), every
//! path an `MLTable` names and every file its `paths:` expand to, every output and
//! `task.append_row_to` — lies under an allowed prefix.
//!
//! Local places are compared on their canonical paths: links are followed to their end (for a
//! place not made yet, as far as it exists) before the prefix test, and every file a local
//! folder lists (the listing follows links, as the job's own reads do) is checked the same
//! way, so a link under an allowed folder that leads out of it is refused by name. Store URLs
//! (`s3://bucket/…`) are compared as the spec resolved them (`..` and escapes are refused
//! there). The check runs when the job is submitted: whoever can change the allowed folders
//! while the job runs can still redirect it (docs/security.md).

use std::path::{Path, PathBuf};

use futures::TryStreamExt;
use url::Url;

use batchfleet_common::job::{InputKind, InputSpec, InputValue, ResolvedJob};
use batchfleet_common::store::{self, resolved_path, StoreError};

pub use crate::error::ConfineError;
use crate::error::ProducerError;
use crate::job::plan_table::{table_files, table_paths};

/// One allowed prefix: a canonical local folder, or a store URL prefix ending with `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Allowed {
    Local(PathBuf),
    Url(String),
}

/// The prefixes a job may reach (`--allow`), and, for a manifest, the scratch folder its
/// relative paths were resolved against.
#[derive(Debug, Clone, Default)]
pub struct AllowList {
    allowed: Vec<Allowed>,
    shown: Vec<String>,
    scratch: Option<PathBuf>,
}

impl AllowList {
    /// The allow-list of `prefixes` (URLs or absolute folders; a relative folder is taken
    /// from the current one). An empty list allows nothing.
    pub fn new(prefixes: &[String]) -> AllowList {
        let cwd = std::env::current_dir().unwrap_or_default();
        let mut list = AllowList::default();
        for prefix in prefixes {
            let url = store::resolve_location(prefix, &cwd).ok();
            let local = url.as_ref().and_then(store::local_path);
            let allowed = match (local, url) {
                (Some(path), _) => Allowed::Local(resolved_path(&path)),
                (None, Some(url)) => Allowed::Url(with_slash(url.as_str())),
                (None, None) => Allowed::Url(with_slash(prefix)),
            };
            list.shown.push(match &allowed {
                Allowed::Local(path) => path.display().to_string(),
                Allowed::Url(url) => url.clone(),
            });
            list.allowed.push(allowed);
        }
        list
    }

    /// This list with one more allowed prefix (a URL or an absolute folder).
    pub fn with_prefix(mut self, prefix: &str) -> AllowList {
        let more = AllowList::new(&[prefix.to_string()]);
        self.allowed.extend(more.allowed);
        self.shown.extend(more.shown);
        self
    }

    /// Refuse places under `scratch` as relative paths of a manifest.
    pub fn with_scratch(mut self, scratch: &Path) -> AllowList {
        self.scratch = Some(resolved_path(scratch));
        self
    }

    /// Check one place (a URL as the spec resolved it) without listing it.
    pub fn check(&self, key: &str, place: &str) -> Result<(), ConfineError> {
        match Url::parse(place).ok().as_ref().and_then(store::local_path) {
            Some(path) => self.check_path(key, place, &path),
            None => self.check_url(key, place),
        }
    }

    fn check_url(&self, key: &str, place: &str) -> Result<(), ConfineError> {
        let under = |allowed: &Allowed| match allowed {
            Allowed::Url(prefix) => {
                place.starts_with(prefix.as_str()) || with_slash(place) == *prefix
            }
            Allowed::Local(_) => false,
        };
        match self.allowed.iter().any(under) {
            true => Ok(()),
            false => Err(self.outside(key, place, None)),
        }
    }

    fn check_path(&self, key: &str, place: &str, path: &Path) -> Result<(), ConfineError> {
        let real = resolved_path(path);
        if self.scratch.as_ref().is_some_and(|scratch| real.starts_with(scratch)) {
            return Err(ConfineError::Relative { key: key.to_string() });
        }
        let under = |allowed: &Allowed| match allowed {
            Allowed::Local(root) => real.starts_with(root),
            Allowed::Url(_) => false,
        };
        match self.allowed.iter().any(under) {
            true => Ok(()),
            false => Err(self.outside(key, place, (real != path).then_some(&real))),
        }
    }

    fn outside(&self, key: &str, place: &str, real: Option<&PathBuf>) -> ConfineError {
        ConfineError::Outside {
            key: key.to_string(),
            place: place.to_string(),
            via: real.map(|r| format!(" (through a link: `{}`)", r.display())).unwrap_or_default(),
            allowed: if self.shown.is_empty() { "nothing".into() } else { self.shown.join(", ") },
        }
    }

    /// Check a place and, for a local folder, every file listed under it (links followed, as
    /// the job's reads follow them).
    pub async fn check_tree(&self, key: &str, place: &str) -> Result<(), ConfineError> {
        self.check(key, place)?;
        let Some(path) = Url::parse(place).ok().as_ref().and_then(store::local_path) else {
            return Ok(());
        };
        if !path.is_dir() {
            return Ok(());
        }
        let unreadable = |source: StoreError| ConfineError::Unreadable {
            key: key.to_string(),
            place: place.to_string(),
            source: Box::new(source),
        };
        let location = store::open_str(place).map_err(unreadable)?;
        let mut listing = location.store.list(Some(&location.prefix));
        while let Some(meta) = listing
            .try_next()
            .await
            .map_err(|e| unreadable(StoreError::io("list", &location.prefix, e)))?
        {
            let file = format!("/{}", meta.location.as_ref());
            let url = Url::from_file_path(&file).map(String::from).unwrap_or(file.clone());
            self.check_path(key, &url, Path::new(&file))?;
        }
        Ok(())
    }
}

/// Check every place `job` names against `allow` (see the module's notes).
pub async fn check_job(job: &ResolvedJob, allow: &AllowList) -> Result<(), ProducerError> {
    allow.check_tree("task.code", &job.task.code).await?;
    let mut inputs: Vec<(String, &InputSpec)> = vec![("input_data".into(), &job.input)];
    for (name, value) in &job.inputs {
        if let InputValue::Data(input) = value {
            inputs.push((format!("inputs.{name}"), input));
        }
    }
    for (key, input) in &inputs {
        allow.check_tree(key, &input.url).await?;
    }
    for (name, output) in &job.outputs {
        if let Some(url) = &output.url {
            allow.check_tree(&format!("outputs.{name}"), url).await?;
        }
    }
    if let Some(append) = &job.task.append_row_to {
        allow.check("task.append_row_to", append)?;
    }
    for (key, input) in inputs.iter().filter(|(_, input)| input.kind == InputKind::Mltable) {
        // The paths it names first: a folder outside is refused before it is listed.
        let (file, named) = table_paths(input).await?;
        let key = format!("{key} ({file}) paths");
        for path in &named {
            allow.check(&key, path)?;
        }
        for path in &table_files(input).await? {
            allow.check(&key, path)?;
        }
    }
    Ok(())
}

fn with_slash(prefix: &str) -> String {
    match prefix.ends_with('/') {
        true => prefix.to_string(),
        false => format!("{prefix}/"),
    }
}

#[cfg(test)]
#[path = "confine_tests.rs"]
mod tests;

//! A manifest's datastore map: the watcher's `--datastore-map` (a `datastores.yaml` in a store),
//! then a `datastores.yaml` beside the manifest, then `BATCHFLEET_DATASTORES` and `--datastore`,
//! each overriding the one before it name by name. The map file itself is not a manifest.

use object_store::path::Path;
use object_store::ObjectStoreExt;

use batchfleet_common::spec::datastores::{ENV, FILE_NAME};
use batchfleet_common::spec::Datastores;
use batchfleet_common::store::{self, object_url, StoreError, StoreLocation};

use crate::error::ProducerError;

use super::WatchOptions;

/// Whether `key` is a datastore map rather than a manifest.
pub fn is_map(key: &Path) -> bool {
    key.filename() == Some(FILE_NAME)
}

/// The map `manifest`'s job is parsed with. A map file that cannot be read or parsed is an
/// error of the manifest (its result says which file and line).
pub async fn for_manifest(
    location: &StoreLocation,
    manifest: &Path,
    options: &WatchOptions,
    scratch: &std::path::Path,
) -> Result<Result<Datastores, String>, ProducerError> {
    let beside = match manifest.as_ref().rsplit_once('/') {
        Some((folder, _)) => Path::from(format!("{folder}/{FILE_NAME}")),
        None => Path::from(FILE_NAME),
    };
    let beside_url = object_url(location, &beside);
    let mut map = Datastores::at(beside_url.clone());
    if let Some(url) = &options.datastore_map {
        let configured = store::open_str(url)?;
        let Some(text) = read(&configured, &configured.prefix).await? else {
            return Ok(Err(format!("--datastore-map {url}: no such object")));
        };
        match Datastores::from_yaml(&text, url, scratch) {
            Ok(configured) => map = configured.overridden_by(Datastores::at(beside_url.clone())),
            Err(error) => return Ok(Err(error.to_string())),
        }
    }
    if let Some(text) = read(location, &beside).await? {
        match Datastores::from_yaml(&text, &beside_url, scratch) {
            Ok(found) => map = map.overridden_by(found),
            Err(error) => return Ok(Err(error.to_string())),
        }
    }
    let cwd = std::env::current_dir().map_err(ProducerError::internal)?;
    let added = map
        .add_entries(std::env::var(ENV).ok().as_deref(), &cwd)
        .and_then(|()| map.add_flags(&options.datastores, &cwd));
    Ok(added.map(|()| map).map_err(|e| e.to_string()))
}

async fn read(location: &StoreLocation, key: &Path) -> Result<Option<String>, ProducerError> {
    match location.store.get(key).await {
        Ok(got) => {
            let bytes = got.bytes().await.map_err(|e| StoreError::io("get", key, e))?;
            Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
        }
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(StoreError::io("get", key, e).into()),
    }
}

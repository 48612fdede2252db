//! Object-store data for command steps, which see only local paths: an input is downloaded
//! into a local folder before the command runs; an output is written to a local folder and
//! uploaded after the command succeeded.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutPayload};

use batchfleet_common::store;

/// Download the object or every object under the folder `url` into `dest`; returns the local
/// path the command sees (`dest` for a folder, the file for a single object).
pub async fn download(url: &str, dest: &Path) -> Result<PathBuf, String> {
    let location = store::open_str(url).map_err(|e| e.to_string())?;
    let prefix = location.prefix.clone();
    let objects: Vec<_> = location
        .store
        .list(Some(&prefix))
        .try_collect()
        .await
        .map_err(|e| format!("listing `{url}`: {e}"))?;
    std::fs::create_dir_all(dest).map_err(|e| format!("creating `{}`: {e}", dest.display()))?;
    if objects.is_empty() {
        // Not a folder: one object, or nothing at all.
        let bytes = get(&location, &prefix, url).await?;
        let name = prefix.filename().unwrap_or("data");
        let file = dest.join(name);
        std::fs::write(&file, bytes).map_err(|e| format!("writing `{}`: {e}", file.display()))?;
        return Ok(file);
    }
    for object in objects {
        let Some(relative) = object.location.prefix_match(&prefix) else { continue };
        let mut file = dest.to_path_buf();
        for part in relative {
            let part = part.as_ref();
            if part == ".." || part == "." {
                return Err(format!("`{}` would escape the folder `{url}`", object.location));
            }
            file.push(part);
        }
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("creating `{}`: {e}", parent.display()))?;
        }
        let bytes = get(&location, &object.location, url).await?;
        std::fs::write(&file, bytes).map_err(|e| format!("writing `{}`: {e}", file.display()))?;
    }
    Ok(dest.to_path_buf())
}

async fn get(
    location: &store::StoreLocation,
    key: &object_store::path::Path,
    url: &str,
) -> Result<Bytes, String> {
    let result = location.store.get(key).await.map_err(|e| format!("reading `{url}`: {e}"))?;
    result.bytes().await.map_err(|e| format!("reading `{url}`: {e}"))
}

/// Upload `local` (a file, or every file under a folder) to `url`.
pub async fn upload(local: &Path, url: &str) -> Result<usize, String> {
    let location = store::open_str(url).map_err(|e| e.to_string())?;
    let mut files = Vec::new();
    if local.is_file() {
        files.push((String::new(), local.to_path_buf()));
    } else {
        collect(local, local, &mut files)
            .map_err(|e| format!("reading `{}`: {e}", local.display()))?;
    }
    for (relative, path) in &files {
        let key = location.child_key(relative);
        let bytes = tokio::fs::read(path)
            .await
            .map_err(|e| format!("reading `{}`: {e}", path.display()))?;
        location
            .store
            .put(&key, PutPayload::from_bytes(Bytes::from(bytes)))
            .await
            .map_err(|e| format!("uploading `{}` to `{url}`: {e}", path.display()))?;
    }
    Ok(files.len())
}

fn collect(base: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            collect(base, &path, out)?;
        } else if let Ok(relative) = path.strip_prefix(base) {
            let parts: Vec<String> =
                relative.components().map(|c| c.as_os_str().to_string_lossy().into()).collect();
            out.push((parts.join("/"), path.clone()));
        }
    }
    Ok(())
}

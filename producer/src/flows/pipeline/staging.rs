//! Object-store data for command steps, which see only local paths: an input is downloaded
//! into a local folder before the command runs; an output is written to a local folder and
//! uploaded after the command succeeded. Both go through common's `store::transfer`, as a
//! worker's inputs and outputs do: every store call retried on the spot, a key that would land
//! outside the folder refused by name.

use std::path::{Path, PathBuf};

use batchfleet_common::store::{self, transfer};

/// Download the object or every object under the folder `url` into `dest`; returns the local
/// path the command sees (`dest` for a folder, the file for a single object).
pub async fn download(url: &str, dest: &Path) -> Result<PathBuf, String> {
    let location = store::open_str(url).map_err(|e| e.to_string())?;
    let failed = |e: transfer::TransferError| format!("downloading `{url}`: {e}");
    std::fs::create_dir_all(dest).map_err(|e| format!("creating `{}`: {e}", dest.display()))?;
    if transfer::download_folder(&location, dest).await.map_err(failed)? > 0 {
        return Ok(dest.to_path_buf());
    }
    // Not a folder: one object, or nothing at all.
    transfer::download_file(&location, dest).await.map_err(failed)
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
        transfer::upload_file(&location, &key, path, "upload a step's output file")
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

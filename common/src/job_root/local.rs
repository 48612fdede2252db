//! A local job root written in place, the way `object_store`'s local store writes it.
//!
//! The local store's create-only put writes a staging file and hard-links it to the key, which
//! fails when the key exists: exactly one of concurrent writers wins. [`create_only`] does the
//! same on the caller's thread (a hop to the blocking pool per small file costs more than the
//! file operation), so in-place writers and store writers agree on who was first.

use std::path::Path;

/// Create `path` holding `bytes` unless it exists: write a staging file `<path>#<n>` (a name
/// the local store's listings skip), hard-link it to `path` (the first writer wins), remove the
/// staging name. `Ok(false)`: `path` was there already.
pub fn create_only(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    use std::io::Write;
    let mut suffix = 1_u32;
    let mut folder_made = false;
    let (staging, mut file) = loop {
        let mut staging = path.as_os_str().to_owned();
        staging.push(format!("#{suffix}"));
        let staging = std::path::PathBuf::from(staging);
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&staging) {
            Ok(file) => break (staging, file),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => suffix += 1,
            // The folder is missing (or another writer is making it right now): make it, once.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound && !folder_made => {
                let Some(folder) = path.parent() else {
                    return Err(error);
                };
                std::fs::create_dir_all(folder)?;
                folder_made = true;
            }
            Err(error) => return Err(error),
        }
    };
    let linked = file.write_all(bytes).and_then(|()| {
        drop(file);
        match std::fs::hard_link(&staging, path) {
            Ok(()) => Ok(true),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(error) => Err(error),
        }
    });
    let _ = std::fs::remove_file(&staging);
    linked
}

/// Rename `source` to `destination`, creating the destination's folder when it is missing.
pub fn move_into_place(source: &Path, destination: &Path) -> std::io::Result<()> {
    match std::fs::rename(source, destination) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            if let Some(folder) = destination.parent() {
                std::fs::create_dir_all(folder)?;
            }
            std::fs::rename(source, destination)
        }
        other => other,
    }
}

#[cfg(test)]
#[path = "local_tests.rs"]
mod tests;

//! `paths:` of an MLTable: `file:`, `folder:` and `pattern:` entries resolved to absolute URLs.

use url::Url;

use crate::spec::fields::{list, Map};
use crate::spec::suggest::did_you_mean;
use crate::spec::SpecError;

use super::super::pattern::PathPattern;
use super::{items, single_entry, MlPath, PATH_KINDS};

/// URL schemes batchfleet opens (as [`crate::store::open`] does).
const SCHEMES: &[&str] = &["file", "s3", "s3a", "gs", "az", "abfs", "abfss", "adl", "azure"];

pub(super) fn parse_paths(top: &Map<'_>, file_url: &Url) -> Result<Vec<MlPath>, SpecError> {
    let field = top.require("paths", "a list of `file:`, `folder:` or `pattern:` entries")?;
    let entries = items(&field, "`file:`, `folder:` or `pattern:` entries")?;
    if entries.is_empty() {
        return Err(field.error(
            "the list is empty; an MLTable needs at least one `file:`, `folder:` or `pattern:`",
        ));
    }
    let mut paths = Vec::with_capacity(entries.len());
    for item in &entries {
        let (kind, value) = single_entry(item, "`file:`, `folder:` or `pattern:`")?;
        let raw = value.string()?;
        let resolved = match kind {
            "file" => resolve_file(&raw, file_url).map(MlPath::File),
            "folder" => resolve_folder(&raw, file_url).map(MlPath::Folder),
            "pattern" => resolve_pattern(&raw, file_url).map(MlPath::Pattern),
            other => {
                let hint = did_you_mean(other, PATH_KINDS)
                    .map(|s| format!("; did you mean `{s}`?"))
                    .unwrap_or_default();
                return Err(SpecError::at(
                    value.key_pos,
                    &value.path,
                    format!("unknown kind of path `{other}`; allowed: {}{hint}", list(PATH_KINDS)),
                ));
            }
        };
        paths.push(resolved.map_err(|message| value.error(message))?);
    }
    Ok(paths)
}

fn resolve_file(raw: &str, base: &Url) -> Result<String, String> {
    if raw.ends_with('/') {
        return Err(format!(
            "`{raw}` ends with `/`, so it is a folder; use `folder:` for a folder, `file:` for \
             one file"
        ));
    }
    let url = resolve(raw, base)?;
    if url.path().ends_with('/') || url.path().is_empty() {
        return Err(format!(
            "`{raw}` is the folder `{url}`; use `folder:` for a folder, `file:` for one file"
        ));
    }
    Ok(url.to_string())
}

fn resolve_folder(raw: &str, base: &Url) -> Result<String, String> {
    let with_slash = if raw.ends_with('/') { raw.to_string() } else { format!("{raw}/") };
    let mut url = resolve(&with_slash, base)?;
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    Ok(url.to_string())
}

fn resolve_pattern(raw: &str, base: &Url) -> Result<String, String> {
    let pattern = PathPattern::parse(raw).map_err(|e| e.message)?;
    let folder = if pattern.base.is_empty() { "./" } else { pattern.base.as_str() };
    // The MLTable's own folder may hold glob characters (`/data/[x]/MLTable`): escaped, they
    // cannot move the split between the folder and the glob.
    let folder = resolve_folder(folder, base)?.replace('*', "%2A").replace('[', "%5B");
    let full = format!("{folder}{}", pattern.relative);
    let check = PathPattern::parse(&full).map_err(|e| e.message)?;
    debug_assert_eq!(check.base, folder);
    Ok(full)
}

/// `raw` as an absolute URL: URLs as they are (known schemes only), absolute local paths as
/// `file://` URLs, anything else joined to the MLTable's URL.
fn resolve(raw: &str, base: &Url) -> Result<Url, String> {
    if raw.trim().is_empty() {
        return Err("the path is empty".into());
    }
    if let Some(scheme_end) = raw.find("://") {
        let scheme = &raw[..scheme_end];
        if scheme.eq_ignore_ascii_case("azureml") {
            return Err(format!(
                "`{raw}`: azureml:// URIs (data assets, datastores) are not supported: they \
                 exist only inside Azure ML; use the storage URL behind them (az://<container>/\
                 <path> for a blob datastore, s3://, gs://, or a path)"
            ));
        }
        let url = Url::parse(raw).map_err(|e| format!("`{raw}` is not a valid URL: {e}"))?;
        if !SCHEMES.contains(&url.scheme()) {
            let hint = match url.scheme() {
                "http" | "https" | "wasb" | "wasbs" => {
                    "; for Azure Blob storage write az://<container>/<path> (the account comes \
                     from AZURE_STORAGE_ACCOUNT_NAME)"
                }
                _ => "",
            };
            return Err(format!(
                "`{raw}`: the scheme `{}` is not supported; use file://, s3://, gs://, az:// or a \
                 path{hint}",
                url.scheme()
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!(
                "`{raw}` has a `?` or `#` part, which names no object; write the object's path \
                 only"
            ));
        }
        return Ok(url);
    }
    // A path: `%`, `?` and `#` are characters of a file name, not URL syntax.
    let escaped = raw.replace('%', "%25").replace('?', "%3F").replace('#', "%23");
    let joined = if raw.starts_with('/') {
        Url::parse("file:///").expect("a valid URL").join(&escaped)
    } else {
        // `./` keeps a first segment with a `:` from reading as a scheme.
        base.join(&format!("./{escaped}"))
    };
    joined.map_err(|e| format!("`{raw}` cannot be resolved against `{base}`: {e}"))
}

use std::path::Path;

use super::{AllowList, ConfineError};

fn url(path: &Path) -> String {
    url::Url::from_file_path(path).unwrap().to_string()
}

fn allow(path: &Path) -> AllowList {
    AllowList::new(&[path.display().to_string()])
}

#[test]
fn store_urls_are_allowed_under_their_prefix_only() {
    let allow = AllowList::new(&["s3://data/in".to_string()]);
    assert!(allow.check("input_data", "s3://data/in/a.csv").is_ok());
    assert!(allow.check("input_data", "s3://data/in").is_ok());
    for outside in ["s3://data/inside/a.csv", "s3://database/in/a", "az://data/in/a", "/etc/x"] {
        let error = allow.check("input_data", outside).unwrap_err().to_string();
        assert!(error.contains(outside.trim_start_matches('/')), "{error}");
        assert!(error.starts_with("input_data: "), "{error}");
    }
    let none = AllowList::new(&[]);
    let error = none.check("task.code", "s3://data/in/").unwrap_err().to_string();
    assert!(error.contains("(nothing)"), "{error}");
}

#[test]
fn a_link_out_of_an_allowed_folder_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (allowed, secret) = (dir.path().join("allowed"), dir.path().join("secret"));
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::create_dir_all(&secret).unwrap();
    std::os::unix::fs::symlink(&secret, allowed.join("out")).unwrap();
    let allow = allow(&allowed);
    assert!(allow.check("outputs.rows", &url(&allowed.join("in/rows.txt"))).is_ok());
    // Not made yet: resolved as far as it exists.
    let place = url(&allowed.join("out/result.txt"));
    match allow.check("task.append_row_to", &place) {
        Err(ConfineError::Outside { key, place: named, via, .. }) => {
            assert_eq!(key, "task.append_row_to");
            assert_eq!(named, place);
            assert!(via.contains(&secret.join("result.txt").display().to_string()), "{via}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn every_file_a_folder_lists_is_checked_where_it_leads() {
    let dir = tempfile::tempdir().unwrap();
    let (allowed, secret) = (dir.path().join("allowed"), dir.path().join("secret"));
    std::fs::create_dir_all(allowed.join("data/deep")).unwrap();
    std::fs::create_dir_all(&secret).unwrap();
    std::fs::write(allowed.join("data/a.txt"), "a").unwrap();
    std::fs::write(secret.join("key"), "secret").unwrap();
    let allow = allow(&allowed);
    assert!(allow.check_tree("input_data", &url(&allowed.join("data"))).await.is_ok());
    std::os::unix::fs::symlink(secret.join("key"), allowed.join("data/deep/key")).unwrap();
    let error = allow.check_tree("input_data", &url(&allowed.join("data"))).await.unwrap_err();
    let text = error.to_string();
    assert!(text.contains("deep/key") && text.contains(&secret.join("key").display().to_string()));
}

#[test]
fn a_manifest_s_relative_paths_are_refused_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let allow = allow(dir.path()).with_scratch(&dir.path().join("scratch"));
    let error = allow.check("inputs.files", &url(&dir.path().join("scratch/data"))).unwrap_err();
    assert!(matches!(error, ConfineError::Relative { .. }), "{error}");
}

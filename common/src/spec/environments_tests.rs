use std::path::Path;

use serde_json::json;

use super::*;

const FILE: &str = "\
environments:
  sklearn-env: /opt/venvs/sklearn/bin/python
  ./conda.yml: ../venvs/partition/bin/python
  mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu20.04: python3.11
";

fn map() -> Environments {
    Environments::from_yaml(FILE, "/jobs/environments.yaml", Path::new("/jobs")).unwrap()
}

#[test]
fn an_azureml_name_is_found_with_or_without_its_version_or_label() {
    let map = map();
    for written in ["azureml:sklearn-env@latest", "azureml:sklearn-env:3", "sklearn-env"] {
        let (name, python) = map.lookup(&json!(written)).unwrap_or_else(|| panic!("{written}"));
        assert_eq!(python, Path::new("/opt/venvs/sklearn/bin/python"), "{written}");
        assert_eq!(name, "sklearn-env");
    }
    assert!(map.lookup(&json!("azureml:other-env@latest")).is_none());
}

#[test]
fn a_conda_file_comes_before_the_image_and_relative_paths_start_at_the_file() {
    let map = map();
    let env = json!({"image": "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu20.04",
                     "conda_file": "conda.yml"});
    let (name, python) = map.lookup(&env).unwrap();
    assert_eq!(name, "conda.yml");
    assert_eq!(python, Path::new("/jobs/../venvs/partition/bin/python"));
    let image_only = json!({"image": "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu20.04"});
    assert_eq!(map.lookup(&image_only).unwrap().1, Path::new("python3.11"), "a bare name stays");
}

#[test]
fn flags_override_the_file_and_a_bad_flag_is_named() {
    let mut map = map();
    map.add_flags(&["sklearn-env=venv/bin/python".to_string()], Path::new("/work")).unwrap();
    let (_, python) = map.lookup(&json!("azureml:sklearn-env@latest")).unwrap();
    assert_eq!(python, Path::new("/work/venv/bin/python"));
    let error = map.add_flags(&["sklearn-env".to_string()], Path::new("/")).unwrap_err();
    assert!(error.to_string().contains("`sklearn-env` is not NAME=PYTHON"), "{error}");
}

#[test]
fn an_unknown_key_or_an_empty_interpreter_in_the_file_is_an_error_naming_it() {
    let error =
        Environments::from_yaml("enviroments: {}\n", "/j/environments.yaml", Path::new("/j"))
            .unwrap_err()
            .to_string();
    assert!(error.contains("/j/environments.yaml") && error.contains("enviroments"), "{error}");
    let error = Environments::from_yaml(
        "environments:\n  a: ''\n",
        "/j/environments.yaml",
        Path::new("/j"),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("environment `a` maps to no interpreter"), "{error}");
}

#[test]
fn environments_are_described_by_what_they_name() {
    assert_eq!(describe(&json!("azureml:sklearn-env@latest")), "`azureml:sklearn-env@latest`");
    let env = json!({"image": "mcr.io/x", "conda_file": "./conda.yml"});
    assert_eq!(describe(&env), "image `mcr.io/x`, conda file `./conda.yml`");
}

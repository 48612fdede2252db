use super::*;

fn python() -> PathBuf {
    std::env::var_os("BATCHFLEET_TEST_PYTHON")
        .map_or_else(|| PathBuf::from("python3"), PathBuf::from)
}

#[tokio::test]
async fn a_launcher_script_resolves_to_the_interpreter_it_runs() {
    // A launcher like pyenv's shim: a shell script that executes the interpreter.
    let dir = tempfile::tempdir().expect("temp dir");
    let real = resolve_interpreter(&python()).await;
    let shim = dir.path().join("python3");
    std::fs::write(&shim, format!("#!/bin/sh\nexec '{}' \"$@\"\n", real.display()))
        .expect("write the shim");
    let mut permissions = std::fs::metadata(&shim).expect("shim metadata").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&shim, permissions).expect("make the shim executable");

    let resolved = resolve_interpreter(&shim).await;
    assert_ne!(resolved, shim, "the shim must resolve to the interpreter it runs");
    assert_eq!(resolved, real, "the shim runs {}", real.display());
}

#[tokio::test]
async fn a_missing_interpreter_stays_as_given() {
    let missing = PathBuf::from("/nonexistent/python3");
    assert_eq!(resolve_interpreter(&missing).await, missing);
}

#[tokio::test]
async fn a_program_that_is_not_python_stays_as_given() {
    // `false` exits 1 without an answer.
    let not_python = PathBuf::from("/bin/false");
    assert_eq!(resolve_interpreter(&not_python).await, not_python);
}

#[test]
fn a_relative_or_empty_answer_is_not_used() {
    let python = Path::new("python3");
    assert_eq!(chosen(python, b""), None);
    assert_eq!(chosen(python, b"python3"), None);
    assert_eq!(chosen(python, b"/nonexistent/bin/python3"), None);
    assert_eq!(chosen(python, b"/bin/sh\n"), Some(PathBuf::from("/bin/sh")));
}

#[tokio::test]
async fn the_driver_is_compiled_for_the_interpreter_and_runtimes_start_from_its_bytecode() {
    let dir = tempfile::tempdir().expect("temp dir");
    let driver = crate::runtime::install_driver(dir.path()).expect("install the driver");
    let real = prepare_interpreter(&python(), &driver).await;
    assert!(real.is_absolute(), "resolved as well: {}", real.display());
    let cache = dir.path().join("__pycache__");
    let compiled: Vec<_> = std::fs::read_dir(&cache)
        .unwrap_or_else(|e| panic!("no {}: {e}", cache.display()))
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    for file in [crate::runtime::DRIVER_FILE_NAME, crate::runtime::DRIVER_TABLE_FILE_NAME] {
        let stem = file.trim_end_matches(".py");
        assert!(
            compiled
                .iter()
                .any(|name| name.starts_with(&format!("{stem}.")) && name.ends_with(".pyc")),
            "{file}'s bytecode in {}: {compiled:?}",
            cache.display()
        );
    }
    let stem = crate::runtime::DRIVER_FILE_NAME.trim_end_matches(".py");
    // The start command imports the module the bytecode is for.
    assert!(crate::runtime::DRIVER_START.contains(&format!("import {stem} as driver")));
}

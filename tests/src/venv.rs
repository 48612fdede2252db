//! Python environments of a test's own: a virtual environment of the test interpreter that
//! also sees the test interpreter's packages, plus modules only it can import.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{describe, python, run};

/// A venv at `dir` (`python -m venv --without-pip`) that sees the test interpreter's packages
/// (a `.pth` file naming its `site-packages`) and holds `modules` (file name → source) in its
/// own `site-packages`; returns its `bin/python`.
pub fn venv_with(dir: &Path, modules: &[(&str, &str)]) -> PathBuf {
    let made = run(Command::new(python()).args(["-m", "venv", "--without-pip"]).arg(dir));
    assert!(made.status.success(), "cannot make a venv at {}: {}", dir.display(), describe(&made));
    let asked = run(Command::new(python())
        .args(["-c", "import site, sys; print('\\n'.join(site.getsitepackages()))"]));
    assert!(asked.status.success(), "{}", describe(&asked));
    let lib = dir.join("lib");
    let site = std::fs::read_dir(&lib)
        .unwrap_or_else(|e| panic!("{}: {e}", lib.display()))
        .map(|e| e.expect("lib entry").path().join("site-packages"))
        .find(|p| p.is_dir())
        .unwrap_or_else(|| panic!("no site-packages under {}", lib.display()));
    std::fs::write(site.join("batchfleet-test.pth"), asked.stdout).expect("write the .pth");
    for (name, source) in modules {
        let path = site.join(name);
        std::fs::create_dir_all(path.parent().expect("a module's folder")).expect("module folder");
        std::fs::write(path, source).expect("write a module");
    }
    dir.join("bin/python")
}

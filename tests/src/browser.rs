//! Headless Chromium for the tests of `batchfleet profile`'s pages: `infra/chromium` installs it
//! and prints its path, which `infra/run-tests` exports as `BATCHFLEET_TEST_CHROMIUM`. A page is
//! loaded from disk and the test reads what its script set on `<body>` in the dumped DOM.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::describe;

/// How long one Chromium render may take before the test gives up.
pub const RENDER_BOUND: Duration = Duration::from_secs(90);

/// The Chromium `BATCHFLEET_TEST_CHROMIUM` names.
pub fn chromium() -> PathBuf {
    match std::env::var_os("BATCHFLEET_TEST_CHROMIUM") {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => panic!(
            "BATCHFLEET_TEST_CHROMIUM is not set: run infra/chromium (it installs Debian's \
             chromium when missing and prints its path) and export BATCHFLEET_TEST_CHROMIUM=<that \
             path>, or run the tests through infra/run-tests, which does both"
        ),
    }
}

/// Chromium headless on `page` + `fragment` with `extra` arguments, bounded by
/// [`RENDER_BOUND`].
fn headless(page: &Path, fragment: &str, extra: &[String]) -> Output {
    let profile_dir = tempfile::tempdir().expect("a browser profile folder");
    let child = Command::new(chromium())
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000"])
        .arg(format!("--user-data-dir={}", profile_dir.path().display()))
        .args(extra)
        .arg(format!("file://{}{fragment}", page.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start chromium ({}): {e}", chromium().display()));
    let pid = child.id();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    match receiver.recv_timeout(RENDER_BOUND) {
        Ok(output) => output.expect("chromium's output"),
        Err(_) => {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            panic!("chromium did not render {} within {RENDER_BOUND:?}", page.display());
        }
    }
}

/// The page's DOM after its scripts ran, as headless Chromium dumps it, loaded with `fragment`
/// (`#selftest` makes a profile page exercise its interactive parts once and report on
/// `<body data-selftest>`).
pub fn render(page: &Path, fragment: &str) -> String {
    let output = headless(page, fragment, &["--dump-dom".to_string()]);
    let dom = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success() && dom.contains("<body"),
        "chromium failed to render {}: {}",
        page.display(),
        describe(&output)
    );
    dom
}

/// A PNG of the page (loaded with `fragment`) at `width` × `height` CSS pixels, written to
/// `png`.
pub fn screenshot(page: &Path, fragment: &str, png: &Path, width: u32, height: u32) {
    let output = headless(
        page,
        fragment,
        &[format!("--screenshot={}", png.display()), format!("--window-size={width},{height}")],
    );
    assert!(
        output.status.success() && png.is_file(),
        "chromium took no screenshot of {}: {}",
        page.display(),
        describe(&output)
    );
}

/// The value of attribute `name` on the dumped `<body>` tag, entities decoded.
pub fn body_attribute(dom: &str, name: &str) -> Option<String> {
    let start = dom.find("<body")?;
    let tag = &dom[start..start + dom[start..].find('>')?];
    let at = tag.find(&format!("{name}=\""))? + name.len() + 2;
    let value = &tag[at..at + tag[at..].find('"')?];
    Some(
        value
            .replace("&quot;", "\"")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&#39;", "'")
            .replace("&amp;", "&"),
    )
}

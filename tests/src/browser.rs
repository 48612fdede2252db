//! Headless Chromium for the tests of batchfleet's pages (`infra/chromium` installs it and
//! prints its path, which `infra/run-tests` exports as `BATCHFLEET_TEST_CHROMIUM`): the DOM after
//! a page's scripts ran, a screenshot, and what a page's script set on `<body>`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::describe;

/// How long one Chromium run may take before the test gives up.
const RUN_BOUND: Duration = Duration::from_secs(90);

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

/// Chromium headless on `url` with `args`, bounded by [`RUN_BOUND`].
fn headless(url: &str, args: &[String]) -> Output {
    let profile_dir = tempfile::tempdir().expect("a browser profile folder");
    let child = Command::new(chromium())
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"])
        .arg(format!("--user-data-dir={}", profile_dir.path().display()))
        .args(args)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start chromium ({}): {e}", chromium().display()));
    let pid = child.id();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    match receiver.recv_timeout(RUN_BOUND) {
        Ok(output) => output.expect("chromium's output"),
        Err(_) => {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            panic!("chromium did not finish with {url} within {RUN_BOUND:?}");
        }
    }
}

/// A page on disk, loaded with `fragment` (`#selftest` makes a profile page exercise its
/// interactive parts once and report on `<body data-selftest>`): its DOM after its scripts ran
/// for 10 s of virtual time.
pub fn render(page: &Path, fragment: &str) -> String {
    dump_dom(&format!("file://{}{fragment}", page.display()), 10_000)
}

/// The page's DOM once its scripts ran for `budget_ms` of virtual time (timers run ahead;
/// requests to a server are awaited for real).
pub fn dump_dom(url: &str, budget_ms: u64) -> String {
    let output =
        headless(url, &[format!("--virtual-time-budget={budget_ms}"), "--dump-dom".to_string()]);
    let dom = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success() && dom.contains("<body"),
        "chromium failed to render {url}: {}",
        describe(&output)
    );
    dom
}

/// A `width`×`height` screenshot of `url` after `budget_ms` of virtual time, as a PNG at `path`.
pub fn screenshot(url: &str, path: &Path, (width, height): (u32, u32), budget_ms: u64) {
    let output = headless(
        url,
        &[
            format!("--virtual-time-budget={budget_ms}"),
            format!("--window-size={width},{height}"),
            format!("--screenshot={}", path.display()),
        ],
    );
    assert!(
        output.status.success() && path.is_file(),
        "chromium took no screenshot of {url} into {}: {}",
        path.display(),
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

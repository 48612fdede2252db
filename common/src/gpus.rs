//! The machine's GPUs, for one GPU per slot (see docs/entry-protocol.md, GPUs).
//!
//! The devices are, first found: `BATCHFLEET_GPUS` (`0,1,2,3`; empty or `none` for none), the
//! process's own `CUDA_VISIBLE_DEVICES` (a worker already limited to some devices keeps to
//! them), then `nvidia-smi -L` when that command exists. Looked up once per process.

use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The variable that names the GPUs outright (it wins over `nvidia-smi`).
pub const GPUS_ENV: &str = "BATCHFLEET_GPUS";
/// The variable CUDA reads the devices a process may use from.
pub const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";
/// How long `nvidia-smi -L` may take before the machine is taken to have no GPUs.
const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(10);

/// The GPUs of this machine, as `CUDA_VISIBLE_DEVICES` names them (indexes or UUIDs); empty
/// without GPUs.
pub fn devices() -> &'static [String] {
    static DEVICES: OnceLock<Vec<String>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let given = |name| std::env::var(name).ok();
        let devices = find(given(GPUS_ENV), given(CUDA_VISIBLE_DEVICES), nvidia_smi);
        if !devices.is_empty() {
            tracing::info!(gpus = %devices.join(","), "GPUs found: one per slot");
        }
        devices
    })
}

/// The devices slot `index` of `slots` gets, as `CUDA_VISIBLE_DEVICES` reads them: with at
/// least as many slots as devices, device `index mod n` (slots share them round-robin); with
/// fewer slots, each slot gets its own contiguous share, so that one slot on a 4-GPU machine
/// sees all four (a script using several GPUs keeps them). `None` without GPUs.
pub fn devices_for_slot(devices: &[String], index: usize, slots: usize) -> Option<String> {
    let n = devices.len();
    if n == 0 {
        return None;
    }
    let slots = slots.max(1);
    if slots >= n {
        return Some(devices[index % n].clone());
    }
    let index = index % slots;
    Some(devices[index * n / slots..(index + 1) * n / slots].join(","))
}

/// The devices from `BATCHFLEET_GPUS`, else `CUDA_VISIBLE_DEVICES`, else `nvidia_smi()`.
pub(crate) fn find(
    gpus_env: Option<String>,
    cuda_visible: Option<String>,
    nvidia_smi: impl FnOnce() -> Option<String>,
) -> Vec<String> {
    if let Some(given) = gpus_env.or(cuda_visible) {
        return parse_list(&given);
    }
    nvidia_smi().map(|listing| parse_nvidia_smi(&listing)).unwrap_or_default()
}

/// `0,1,2` (blanks allowed); empty, `none` or `-1` (CUDA's "no device") is none.
fn parse_list(text: &str) -> Vec<String> {
    let trimmed = text.trim();
    if trimmed.eq_ignore_ascii_case("none") || trimmed == "-1" {
        return Vec::new();
    }
    trimmed.split(',').map(str::trim).filter(|d| !d.is_empty()).map(str::to_string).collect()
}

/// The indexes in `nvidia-smi -L`'s lines (`GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-…)`).
fn parse_nvidia_smi(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("GPU ")?;
            let (index, _) = rest.split_once(':')?;
            index.trim().parse::<u32>().ok().map(|i| i.to_string())
        })
        .collect()
}

/// What `nvidia-smi -L` prints, when it exists and succeeds in time.
fn nvidia_smi() -> Option<String> {
    let mut child = Command::new("nvidia-smi")
        .arg("-L")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(_)) | Err(_) => return None,
            Ok(None) if started.elapsed() > NVIDIA_SMI_TIMEOUT => {
                tracing::warn!("nvidia-smi -L did not answer in time; running without GPUs");
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take()?, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
#[path = "gpus_tests.rs"]
mod tests;

//! The fleet's worker containers through the Docker Engine API (bollard).
//!
//! Every container the autoscaler creates carries the label `batchfleet.autoscale.fleet=<fleet>`;
//! it lists, signals and removes only containers with its fleet's label, so it touches no
//! other container, and a restarted autoscaler finds (adopts) the ones it made. What a running
//! worker is doing comes from its status file (`batchfleet_common::worker_status`), read out
//! of the container through the archive endpoint (no process started in the container).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bollard::models::{ContainerCreateBody, ContainerSummaryStateEnum, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptions, DownloadFromContainerOptions, KillContainerOptions,
    ListContainersOptions, RemoveContainerOptions, StartContainerOptions,
};
use bollard::Docker;
use futures::TryStreamExt;

use batchfleet_common::worker_status::{WorkerStatus, STATUS_DIR};

use super::policy::{Worker, WorkerState};
use super::AutoscaleError;

/// The label that names a container's fleet.
pub const FLEET_LABEL: &str = "batchfleet.autoscale.fleet";
/// The label that says what the container is (`worker`).
pub const ROLE_LABEL: &str = "batchfleet.role";
/// Where the workers' scratch folder (and so their status file) is in their containers.
pub const SCRATCH_DIR: &str = "/scratch";

/// How a worker container is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub image: String,
    /// `NAME=VALUE` for every variable the workers get (the broker URL among them).
    pub env: Vec<String>,
    /// The network to attach them to (`host`, a compose project's network); `None`: the
    /// engine's default bridge.
    pub network: Option<String>,
    /// Bind mounts, `HOST:CONTAINER[:ro]`.
    pub volumes: Vec<String>,
    /// `user[:group]` to run as; `None`: the image's user.
    pub user: Option<String>,
    /// Arguments after the image's entrypoint (`batchfleet-worker`).
    pub args: Vec<String>,
}

/// The fleet's containers on one Docker engine.
pub struct DockerFleet {
    docker: Docker,
    fleet: String,
    template: Template,
}

impl DockerFleet {
    /// Connect to the engine (`DOCKER_HOST`, by default the local socket) and agree on an API
    /// version it speaks.
    pub async fn connect(fleet: &str, template: Template) -> Result<DockerFleet, AutoscaleError> {
        let docker = Docker::connect_with_local_defaults()
            .map_err(|source| AutoscaleError::Docker { what: "connecting".into(), source })?;
        let docker = docker.negotiate_version().await.map_err(|source| AutoscaleError::Docker {
            what: "asking for its API version".into(),
            source,
        })?;
        Ok(DockerFleet { docker, fleet: fleet.to_string(), template })
    }

    fn docker_error(what: String) -> impl FnOnce(bollard::errors::Error) -> AutoscaleError {
        move |source| AutoscaleError::Docker { what, source }
    }

    /// Every container of the fleet, running or not, with what it is doing.
    pub async fn workers(&self) -> Result<Vec<Worker>, AutoscaleError> {
        let filters =
            HashMap::from([("label".to_string(), vec![format!("{FLEET_LABEL}={}", self.fleet)])]);
        let options =
            ListContainersOptions { all: true, filters: Some(filters), ..Default::default() };
        let listed = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(Self::docker_error("listing the fleet's containers".into()))?;
        let mut workers = Vec::with_capacity(listed.len());
        for container in listed {
            let Some(id) = container.id else { continue };
            let name = container
                .names
                .and_then(|names| names.into_iter().next())
                .map(|name| name.trim_start_matches('/').to_string())
                .unwrap_or_else(|| id.clone());
            let status = container.status.unwrap_or_default();
            let state = match container.state {
                Some(ContainerSummaryStateEnum::RUNNING) if status.contains("(unhealthy)") => {
                    WorkerState::Unhealthy
                }
                Some(ContainerSummaryStateEnum::RUNNING) => match self.status(&id).await {
                    Some(status) if status.draining => WorkerState::Draining,
                    Some(status) => WorkerState::Serving {
                        busy: u32::try_from(status.busy).unwrap_or(u32::MAX),
                        idle_for: Duration::from_millis(status.idle_ms),
                    },
                    None => WorkerState::Starting,
                },
                Some(ContainerSummaryStateEnum::EXITED | ContainerSummaryStateEnum::DEAD) => {
                    WorkerState::Exited { code: exit_code(&status).unwrap_or(-1) }
                }
                Some(ContainerSummaryStateEnum::CREATED) => WorkerState::Created,
                // Restarting, paused, being removed: not capacity, and not touched.
                _ => WorkerState::Draining,
            };
            workers.push(Worker { id, name, state });
        }
        Ok(workers)
    }

    /// The worker's status file, or `None` when it has none yet (or it cannot be read).
    async fn status(&self, id: &str) -> Option<WorkerStatus> {
        let options = DownloadFromContainerOptions { path: format!("{SCRATCH_DIR}/{STATUS_DIR}") };
        let chunks: Vec<bytes::Bytes> =
            match self.docker.download_from_container(id, Some(options)).try_collect().await {
                Ok(chunks) => chunks,
                Err(error) => {
                    tracing::debug!(container = id, %error, "no status file yet");
                    return None;
                }
            };
        let tarball: Vec<u8> = chunks.concat();
        match status_from_tar(&tarball) {
            Ok(status) => Some(status),
            Err(error) => {
                tracing::warn!(container = id, %error, "cannot read the worker's status file");
                None
            }
        }
    }

    /// Create and start one worker container; returns its name.
    pub async fn start(&self) -> Result<String, AutoscaleError> {
        let name = format!("{}-worker-{}", self.fleet, unique_suffix());
        let mut env = self.template.env.clone();
        env.push(format!("BATCHFLEET_WORKER_ID={name}"));
        env.push(format!("BATCHFLEET_SCRATCH_DIR={SCRATCH_DIR}"));
        let labels = HashMap::from([
            (FLEET_LABEL.to_string(), self.fleet.clone()),
            (ROLE_LABEL.to_string(), "worker".to_string()),
        ]);
        let host_config = HostConfig {
            network_mode: self.template.network.clone(),
            binds: (!self.template.volumes.is_empty()).then(|| self.template.volumes.clone()),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(self.template.image.clone()),
            env: Some(env),
            cmd: (!self.template.args.is_empty()).then(|| self.template.args.clone()),
            user: self.template.user.clone(),
            labels: Some(labels),
            host_config: Some(host_config),
            ..Default::default()
        };
        let options = CreateContainerOptions { name: Some(name.clone()), ..Default::default() };
        let created = self
            .docker
            .create_container(Some(options), body)
            .await
            .map_err(Self::docker_error(format!("creating worker {name}")))?;
        self.start_created(&created.id).await?;
        Ok(name)
    }

    /// Start a container of the fleet that was created and not started.
    pub async fn start_created(&self, id: &str) -> Result<(), AutoscaleError> {
        self.docker
            .start_container(id, None::<StartContainerOptions>)
            .await
            .map_err(Self::docker_error(format!("starting worker {id}")))
    }

    /// Send `signal` (SIGTERM: drain; SIGKILL) to a worker of the fleet.
    pub async fn signal(&self, id: &str, signal: &str) -> Result<(), AutoscaleError> {
        let options = KillContainerOptions { signal: signal.to_string() };
        self.docker
            .kill_container(id, Some(options))
            .await
            .map_err(Self::docker_error(format!("sending {signal} to {id}")))
    }

    /// Remove a container of the fleet with its anonymous volumes (its scratch folder).
    pub async fn remove(&self, id: &str) -> Result<(), AutoscaleError> {
        let options = RemoveContainerOptions { v: true, force: true, ..Default::default() };
        self.docker
            .remove_container(id, Some(options))
            .await
            .map_err(Self::docker_error(format!("removing {id}")))
    }
}

/// The status file out of the tar stream the archive endpoint sends (one file).
fn status_from_tar(tarball: &[u8]) -> Result<WorkerStatus, std::io::Error> {
    use std::io::Read;
    // The status folder: one `<pid>.json` per worker process that ran in the container (one
    // serves at a time); the newest is the one serving.
    let mut archive = tar::Archive::new(tarball);
    let mut newest: Option<(u64, WorkerStatus)> = None;
    for entry in archive.entries()? {
        let mut entry = entry?;
        let is_status = entry.path()?.extension().is_some_and(|ext| ext == "json");
        if !entry.header().entry_type().is_file() || !is_status {
            continue;
        }
        let modified = entry.header().mtime().unwrap_or(0);
        let mut text = String::new();
        entry.read_to_string(&mut text)?;
        let Ok(status) = WorkerStatus::parse(&text) else { continue };
        if newest.as_ref().is_none_or(|(at, _)| modified >= *at) {
            newest = Some((modified, status));
        }
    }
    newest
        .map(|(_, status)| status)
        .ok_or_else(|| std::io::Error::other("the archive holds no status file"))
}

/// The exit code in a container's status line: `Exited (137) 3 seconds ago`.
fn exit_code(status: &str) -> Option<i64> {
    let rest = status.strip_prefix("Exited (")?;
    rest.split(')').next()?.parse().ok()
}

/// Eight hex digits that differ between two containers of one fleet (time, pid and a count).
fn unique_suffix() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as u64);
    let mixed =
        nanos ^ (u64::from(std::process::id()) << 24) ^ COUNT.fetch_add(1, Ordering::Relaxed);
    format!("{:08x}", mixed & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_come_from_the_status_line() {
        assert_eq!(exit_code("Exited (137) 3 seconds ago"), Some(137));
        assert_eq!(exit_code("Exited (0) About a minute ago"), Some(0));
        assert_eq!(exit_code("Up 3 seconds (healthy)"), None);
    }

    #[test]
    fn the_status_file_is_read_out_of_a_tar_stream() {
        let text = r#"{"worker_id":"w","slots":2,"busy":1,"draining":false,"idle_ms":0}"#;
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, format!("{STATUS_DIR}/7.json"), text.as_bytes()).unwrap();
        let tarball = builder.into_inner().unwrap();
        let status = status_from_tar(&tarball).unwrap();
        assert_eq!((status.busy, status.slots, status.draining), (1, 2, false));
        assert!(status_from_tar(b"").is_err(), "an empty stream is an error, not a status");
    }
}

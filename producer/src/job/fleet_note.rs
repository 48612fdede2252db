//! The fleet a submitted job's workers serve, as its job root keeps it (`control/fleet`: the
//! broker without its password, and the pool), and the `resume` command that finishes a job,
//! on that fleet or with workers in the resuming process (`status` prints it; an interrupted
//! `run` or `submit` ends with it).

use batchfleet_common::broker::connect::redact;
use batchfleet_common::job_root::JobRoot;

use crate::error::ProducerError;

/// The broker (password redacted) and pool a job was submitted to (`control/fleet`, or the
/// detached marker of a job submitted before that file existed).
#[derive(Debug, Clone, PartialEq)]
pub struct Fleet {
    pub broker: String,
    pub pool: String,
}

/// `{"broker": <URL without its password>, "pool": …}`.
pub fn fleet_note(broker: &str, pool: &str) -> String {
    format!(
        "{{\"broker\": {}, \"pool\": {}}}\n",
        serde_json::Value::from(redact(broker)),
        serde_json::Value::from(pool)
    )
}

/// The `resume` command that finishes the job at `root_url`: on its fleet's broker and pool, or
/// with workers in the resuming process when it ran that way (`batchfleet run`).
/// The command works when pasted: a broker URL with credentials is never printed (the job
/// root keeps it without its password); the command reads it from `BATCHFLEET_BROKER`, and
/// a second line says which broker that must be.
pub fn resume_line(root_url: &str, fleet: &Option<Fleet>) -> String {
    match fleet {
        Some(Fleet { broker, pool }) => match crate::words::pasteable_broker(broker) {
            (arg, Some(note)) => format!(
                "batchfleet resume {root_url} --broker {arg} --pool {pool}\n  {note} (the job \
                 root does not keep them)"
            ),
            (arg, None) => format!("batchfleet resume {root_url} --broker {arg} --pool {pool}"),
        },
        None => format!("batchfleet resume {root_url}"),
    }
}

/// The fleet a job was submitted to: `control/fleet`, or `detached` (the detached marker's
/// text) for a job submitted before that file existed; `None` for a job of `batchfleet run`.
pub async fn fleet_of(
    root: &JobRoot,
    detached: Option<String>,
) -> Result<Option<Fleet>, ProducerError> {
    let note = match root.fleet_note().await? {
        Some(text) => Some(text),
        None => detached,
    };
    Ok(note.map(|text| {
        let note: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let field = |name: &str| note[name].as_str().unwrap_or("URL").to_string();
        Fleet { broker: field("broker"), pool: field("pool") }
    }))
}

/// The `resume` command that finishes the job in `root` (what `status` prints).
pub async fn resume_command(root: &JobRoot) -> String {
    let fleet = fleet_of(root, None).await.unwrap_or_default();
    resume_line(&root.url(), &fleet)
}

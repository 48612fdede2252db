//! What of the worker's own environment an entry-script runtime inherits: the one place that
//! keeps batchfleet's credentials from user code.
//!
//! A runtime starts with the worker's environment (the job's `environment_variables` and the
//! runtime's own `BATCHFLEET_*` settings are added after this), less:
//!
//! - **always**, in every mode (`run`'s in-process workers, a fleet's `batchfleet-worker`,
//!   the jobs `watch` submits): batchfleet's own settings, every `BATCHFLEET_*` variable —
//!   `BATCHFLEET_BROKER` holds the broker's user and password, from which the management API's
//!   credentials are derived — and [`BROKER_CREDENTIALS`], the management URLs an operator
//!   keeps beside them (the Kubernetes manifests' `RABBITMQ_MANAGEMENT_URL`, for KEDA);
//! - **with [`StorageKeys::None`]** (the worker's `--script-storage-keys none`, and any job that
//!   was checked against an allow-list, which `watch` always does): the store credentials,
//!   every variable the store clients read — `AWS_*`, `AZURE_*`, `GOOGLE_*` (object_store's
//!   `from_env` builders take exactly these prefixes; the AWS, Azure and Google SDKs a script
//!   might use read the same) — and [`MANAGED_IDENTITY`], the endpoints through which a
//!   process on a cloud host fetches the host's identity. `AWS_EC2_METADATA_DISABLED=true` is
//!   set so that AWS SDKs do not fall back to the instance's role. A job passes its own keys
//!   through its `environment_variables`, which are added after this.

use std::collections::BTreeSet;
use std::ffi::OsString;

use serde::{Deserialize, Serialize};

/// Prefix of batchfleet's own settings, none of which a runtime inherits.
pub const OWN_PREFIX: &str = "BATCHFLEET_";

/// Broker and management credentials kept beside batchfleet's own settings.
pub const BROKER_CREDENTIALS: &[&str] =
    &["RABBITMQ_MANAGEMENT_URL", "RABBITMQ_URL", "AMQP_URL", "CLOUDAMQP_URL"];

/// Prefixes of the store credentials (and store settings) that [`StorageKeys::None`] removes.
pub const STORE_PREFIXES: &[&str] = &["AWS_", "AZURE_", "GOOGLE_"];

/// Managed-identity endpoints (Azure App Service and Functions, Azure Arc) that
/// [`StorageKeys::None`] removes too.
pub const MANAGED_IDENTITY: &[&str] =
    &["IDENTITY_ENDPOINT", "IDENTITY_HEADER", "MSI_ENDPOINT", "MSI_SECRET", "IMDS_ENDPOINT"];

/// Set for [`StorageKeys::None`]: AWS SDKs then ask no instance metadata service for a role.
pub const NO_INSTANCE_METADATA: (&str, &str) = ("AWS_EC2_METADATA_DISABLED", "true");

/// Whether entry scripts inherit the store credentials of the worker that runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum StorageKeys {
    /// The worker's store credentials reach the script (`run` and `submit`'s default, as
    /// Azure ML gives scripts the compute's identity).
    #[default]
    Inherit,
    /// None do: the script reaches a store only with keys its job passes it.
    None,
}

impl StorageKeys {
    /// The policy for one job: `None` when the worker says so or the job was confined to an
    /// allow-list (with the fleet's keys its script could reach everything the fleet can).
    pub fn for_job(self, confined: bool) -> StorageKeys {
        match confined {
            true => StorageKeys::None,
            false => self,
        }
    }
}

/// The names, among `inherited`, that a runtime must not inherit under `keys`.
pub fn removed<I>(inherited: I, keys: StorageKeys) -> BTreeSet<OsString>
where
    I: IntoIterator<Item = OsString>,
{
    inherited.into_iter().filter(|name| withheld(name, keys)).collect()
}

/// Whether the variable `name` is withheld from a runtime under `keys`.
pub fn withheld(name: &OsString, keys: StorageKeys) -> bool {
    let Some(name) = name.to_str() else { return false };
    if name.starts_with(OWN_PREFIX) || BROKER_CREDENTIALS.contains(&name) {
        return true;
    }
    keys == StorageKeys::None
        && (STORE_PREFIXES.iter().any(|prefix| name.starts_with(prefix))
            || MANAGED_IDENTITY.contains(&name))
}

/// Apply the policy to a command that would inherit this process's environment: remove what
/// is withheld, and under [`StorageKeys::None`] turn off the instance-metadata fallback. Call
/// it before adding the runtime's own variables.
pub fn scrub(command: &mut tokio::process::Command, keys: StorageKeys) {
    for name in removed(std::env::vars_os().map(|(name, _)| name), keys) {
        command.env_remove(name);
    }
    if keys == StorageKeys::None {
        command.env(NO_INSTANCE_METADATA.0, NO_INSTANCE_METADATA.1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn broker_settings_are_withheld_whatever_the_storage_policy() {
        let env = names(&["BATCHFLEET_BROKER", "RABBITMQ_MANAGEMENT_URL", "PATH", "HOME"]);
        for keys in [StorageKeys::Inherit, StorageKeys::None] {
            let gone = removed(env.clone(), keys);
            assert_eq!(
                gone,
                names(&["BATCHFLEET_BROKER", "RABBITMQ_MANAGEMENT_URL"]).into_iter().collect()
            );
        }
    }

    #[test]
    fn store_keys_are_withheld_only_under_none() {
        let env = names(&[
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AZURE_STORAGE_ACCOUNT_KEY",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "IDENTITY_ENDPOINT",
            "LANG",
        ]);
        assert!(removed(env.clone(), StorageKeys::Inherit).is_empty());
        let gone = removed(env, StorageKeys::None);
        assert_eq!(gone.len(), 5, "{gone:?}");
        assert!(!gone.contains(&OsString::from("LANG")));
    }

    #[test]
    fn a_confined_job_never_inherits_store_keys() {
        assert_eq!(StorageKeys::Inherit.for_job(true), StorageKeys::None);
        assert_eq!(StorageKeys::Inherit.for_job(false), StorageKeys::Inherit);
        assert_eq!(StorageKeys::None.for_job(false), StorageKeys::None);
    }
}

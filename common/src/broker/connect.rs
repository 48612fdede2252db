//! A broker from a URL: what `--broker` / `BATCHFLEET_BROKER` name.
//!
//! - `amqp://user:password@host:5672/vhost` and `amqps://…` → RabbitMQ
//!   ([`RabbitMqBroker`](super::rabbitmq::RabbitMqBroker)).
//! - `sqs://…` → SQS ([`SqsBroker`](super::sqs::SqsBroker)): region, endpoint and credentials
//!   from the AWS environment (`AWS_REGION`, `AWS_ENDPOINT_URL[_SQS]`, the default credential
//!   chain); the rest of the URL is not read.
//! - Anything else is refused naming only the scheme: a broker URL carries a password, and
//!   errors end up in logs.
//!
//! - A RabbitMQ cluster is a comma-separated list of `amqp://` URLs, one per node: a
//!   connection goes to the first that answers and moves on when its node goes.
//!   `BATCHFLEET_RABBITMQ_MANAGEMENT` (comma-separated `http://` URLs) names the nodes'
//!   management APIs when they are not on each node's host at port 15672, and
//!   `BATCHFLEET_QUORUM_SIZE` the number of nodes each queue is replicated over when declared.
//!
//! Options that only one backend has live in that backend's part of [`ConnectOptions`]
//! ([`RabbitMqConnect`]); they are read, and checked, only when the URL names that backend.

use std::sync::Arc;
use std::time::Duration;

use super::{Broker, BrokerError};

/// How to connect, beyond the URL.
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    /// The name the connection shows in the broker's own tools (RabbitMQ's connection list),
    /// so that an operator can tell a producer from a worker. `None`: the backend's default.
    pub connection_name: Option<String>,
    /// Read only when the URL names RabbitMQ.
    pub rabbitmq: RabbitMqConnect,
}

/// What only a RabbitMQ broker needs to be told.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RabbitMqConnect {
    /// How many messages of one queue this process may hold unsettled at most (the consumer's
    /// prefetch): a worker passes its `--prefetch`. `None`: the backend's default.
    pub prefetch: Option<u16>,
    /// The most the prefetch grows to while mini-batches are short (RabbitMQ's adaptive
    /// prefetch); `None` or at most `prefetch`: fixed.
    pub prefetch_limit: Option<u16>,
    /// How long a message pushed ahead may wait for a slot before the adaptive prefetch goes
    /// back to its least. `None`: the backend's default (10 s).
    pub prefetch_hold: Option<Duration>,
    /// The broker's `consumer_timeout`: a delivery held unacknowledged longer is taken back.
    /// `None`: the broker has none. Not sent to the broker: a producer checks a job against it
    /// ([`RabbitMqConnect::consumer_timeout`] is RabbitMQ's server setting, `rabbitmq.conf`).
    pub consumer_timeout: Option<Duration>,
}

impl RabbitMqConnect {
    /// RabbitMQ's default `consumer_timeout` (30 minutes).
    pub const DEFAULT_CONSUMER_TIMEOUT: Duration = Duration::from_secs(1800);
}

/// The broker families a URL can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerKind {
    RabbitMq,
    Sqs,
}

/// Which broker `url` names, without connecting; errors never quote the URL.
pub fn kind_of(url: &str) -> Result<BrokerKind, BrokerError> {
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(BrokerError::BadUrl(
            "the broker URL has no scheme: use amqp://user:password@host:5672/vhost (RabbitMQ) or sqs:// (SQS)"
                .into(),
        ));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "amqp" | "amqps" => Ok(BrokerKind::RabbitMq),
        "sqs" => Ok(BrokerKind::Sqs),
        _ => Err(BrokerError::BadUrl(format!(
            "unknown broker URL scheme `{}`: use amqp:// or amqps:// (RabbitMQ), or sqs:// (SQS)",
            printable(scheme)
        ))),
    }
}

/// Connect to the broker `url` names; only the options of that backend are read.
pub async fn connect(url: &str, options: ConnectOptions) -> Result<Arc<dyn Broker>, BrokerError> {
    match kind_of(url)? {
        BrokerKind::RabbitMq => rabbitmq(url, options).await,
        BrokerKind::Sqs => sqs().await,
    }
}

#[cfg(feature = "rabbitmq")]
async fn rabbitmq(url: &str, options: ConnectOptions) -> Result<Arc<dyn Broker>, BrokerError> {
    use super::rabbitmq::{RabbitMqBroker, RabbitMqOptions};
    let defaults = RabbitMqOptions::default();
    let management_url = std::env::var(MANAGEMENT_ENV).ok().filter(|url| !url.trim().is_empty());
    let quorum_size = quorum_size_from_env()?;
    let options = RabbitMqOptions {
        management_url,
        quorum_size,
        connection_name: options.connection_name,
        prefetch: options.rabbitmq.prefetch.unwrap_or(defaults.prefetch),
        prefetch_limit: options.rabbitmq.prefetch_limit.unwrap_or(defaults.prefetch_limit),
        hold_limit: options.rabbitmq.prefetch_hold.unwrap_or(defaults.hold_limit),
        ..defaults
    };
    Ok(Arc::new(RabbitMqBroker::connect_with(url, options).await?))
}

/// The management API URLs of a RabbitMQ broker, comma-separated, when not each AMQP node's
/// host at port 15672.
pub const MANAGEMENT_ENV: &str = "BATCHFLEET_RABBITMQ_MANAGEMENT";
/// The number of nodes each RabbitMQ queue is replicated over when declared
/// (`x-quorum-initial-group-size`); unset: RabbitMQ's default.
pub const QUORUM_SIZE_ENV: &str = "BATCHFLEET_QUORUM_SIZE";

/// `BATCHFLEET_QUORUM_SIZE`, checked: a whole number from 1 to 255.
pub fn quorum_size_from_env() -> Result<Option<u16>, BrokerError> {
    match std::env::var(QUORUM_SIZE_ENV) {
        Ok(value) if !value.trim().is_empty() => parse_quorum_size(&value).map(Some),
        _ => Ok(None),
    }
}

fn parse_quorum_size(value: &str) -> Result<u16, BrokerError> {
    match value.trim().parse::<u16>() {
        Ok(size @ 1..=255) => Ok(size),
        _ => Err(BrokerError::BadUrl(format!(
            "{QUORUM_SIZE_ENV}=`{}` is not a number of nodes from 1 to 255",
            value.chars().filter(|c| !c.is_control()).take(32).collect::<String>()
        ))),
    }
}

#[cfg(not(feature = "rabbitmq"))]
async fn rabbitmq(_url: &str, _options: ConnectOptions) -> Result<Arc<dyn Broker>, BrokerError> {
    Err(BrokerError::BadUrl(
        "this build of batchfleet has no RabbitMQ support (the `rabbitmq` feature is off)".into(),
    ))
}

#[cfg(feature = "sqs")]
async fn sqs() -> Result<Arc<dyn Broker>, BrokerError> {
    use super::sqs::{SqsBroker, SqsOptions};
    Ok(Arc::new(SqsBroker::from_env(SqsOptions::default()).await?))
}

#[cfg(not(feature = "sqs"))]
async fn sqs() -> Result<Arc<dyn Broker>, BrokerError> {
    Err(BrokerError::BadUrl(
        "this build of batchfleet has no SQS support (the `sqs` feature is off)".into(),
    ))
}

/// A user-typed scheme, bounded and without control characters, for an error message.
fn printable(scheme: &str) -> String {
    scheme.chars().filter(|c| !c.is_control()).take(32).collect()
}

/// A broker URL safe to print: scheme, user, host, port and path, never the password; each
/// node of a comma-separated cluster list alike.
pub fn redact(url: &str) -> String {
    if url.contains(',') {
        return url.split(',').map(|one| redact(one.trim())).collect::<Vec<_>>().join(",");
    }
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some("***"));
            }
            parsed.to_string()
        }
        Err(_) => match url.split_once("://") {
            Some((scheme, _)) => format!("{}://…", printable(scheme)),
            None => "(not a URL)".into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_pick_the_backend() {
        assert_eq!(kind_of("amqp://guest:guest@127.0.0.1:5672/%2f").unwrap(), BrokerKind::RabbitMq);
        assert_eq!(kind_of("AMQPS://rabbit").unwrap(), BrokerKind::RabbitMq);
        assert_eq!(kind_of("sqs://eu-west-1/queue").unwrap(), BrokerKind::Sqs);
    }

    #[test]
    fn unknown_schemes_are_named_without_the_password() {
        let err = kind_of("redis://bob:s3cret@host:6379").unwrap_err().to_string();
        assert!(err.contains("`redis`"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");
        assert!(!err.contains("refused"), "no broker was contacted: {err}");
        let err = kind_of("bob:s3cret@host").unwrap_err().to_string();
        assert!(!err.contains("s3cret"), "{err}");
    }

    #[cfg(feature = "sqs")]
    #[tokio::test]
    async fn sqs_urls_reach_the_sqs_backend() {
        // Without a region in the environment the backend itself refuses; either way it is reached.
        if let Err(err) = connect("sqs://", ConnectOptions::default()).await {
            assert!(err.to_string().contains("AWS region"), "{err}");
        }
    }

    #[test]
    fn redacted_urls_keep_everything_but_the_password() {
        let shown = redact("amqp://bob:s3cret@rabbit:5672/%2f");
        assert_eq!(shown, "amqp://bob:***@rabbit:5672/%2f");
        assert_eq!(redact("amqp://bob:s3cret@host:notaport/"), "amqp://…");
        assert_eq!(
            redact("amqp://a:s3cret@r0:5680/%2f, amqp://b:s3cret@r1:5681/%2f"),
            "amqp://a:***@r0:5680/%2f,amqp://b:***@r1:5681/%2f"
        );
    }

    #[test]
    fn quorum_sizes_are_checked() {
        assert_eq!(parse_quorum_size(" 3 ").unwrap(), 3);
        let err = parse_quorum_size("0").unwrap_err().to_string();
        assert!(err.contains("BATCHFLEET_QUORUM_SIZE=`0`"), "{err}");
        assert!(parse_quorum_size("three").is_err());
    }
}

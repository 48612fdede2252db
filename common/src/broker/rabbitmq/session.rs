//! The AMQP connection: opened once, re-opened (with backoff) by the first call after it was
//! lost, and the channels hanging off it.
//!
//! The broker URL may list several nodes of one cluster, comma-separated
//! (`amqp://u:p@rabbit-0:5672/%2f,amqp://u:p@rabbit-1:5672/%2f`). A connection goes to the
//! first that answers, starting after the node whose connection was lost last, so a node that
//! went away is tried last; one round over all of them is one attempt of the backoff.
//!
//! A call that finds the connection broken fails with [`BrokerError::Connection`] (transient);
//! the *next* call reconnects. Leases held on the lost connection are gone with it — RabbitMQ
//! put their messages back in their queues — so their handles are stale, which the lease table
//! notices by itself (lapin poisons the ackers of a closed channel).

use std::collections::HashMap;
use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backon::Retryable;
use lapin::options::ConfirmSelectOptions;
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{Channel, Connection, ConnectionProperties};
use tokio::sync::Mutex;

use super::error;
use super::feed::Feed;
use super::prefetch::PrefetchPolicy;
use crate::broker::BrokerError;
use crate::retry::RetryPolicy;

/// Where the broker is, with the password kept out of everything that is displayed.
#[derive(Clone)]
pub(super) struct Endpoint {
    pub(super) uri: AMQPUri,
    /// `amqp://user@host:port/vhost`: for logs and error messages.
    pub(super) redacted: String,
}

impl Endpoint {
    pub(super) fn parse(url: &str) -> Result<Self, BrokerError> {
        // The parser's message may quote the URL: never pass it on.
        let uri = AMQPUri::from_str(url).map_err(|_| {
            BrokerError::Refused(format!(
                "`{}` is not an AMQP URL (amqp://user:password@host:port/vhost)",
                redact_unparsed(url)
            ))
        })?;
        let scheme = match uri.scheme {
            AMQPScheme::AMQP => "amqp",
            AMQPScheme::AMQPS => "amqps",
        };
        let redacted = format!(
            "{scheme}://{}@{}:{}/{}",
            uri.authority.userinfo.username,
            uri.authority.host,
            uri.authority.port,
            url::form_urlencoded::byte_serialize(uri.vhost.as_bytes()).collect::<String>()
        );
        Ok(Endpoint { uri, redacted })
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted)
    }
}

/// The nodes a broker URL lists: each a full AMQP URL, separated by commas (a comma inside a
/// password is written `%2C`).
pub(super) fn parse_endpoints(urls: &str) -> Result<Vec<Endpoint>, BrokerError> {
    let endpoints = urls
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(Endpoint::parse)
        .collect::<Result<Vec<_>, _>>()?;
    if endpoints.is_empty() {
        return Err(BrokerError::Refused("the broker URL lists no AMQP address".into()));
    }
    Ok(endpoints)
}

/// Everything before the last `@` of the authority is credentials: drop it.
fn redact_unparsed(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***{}", &url[..scheme_end], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// One live connection and its publishing channel.
pub(super) struct Session {
    pub(super) connection: Connection,
    /// In confirm mode; re-opened when a failed publish closed it.
    publisher: Mutex<Option<Channel>>,
    /// The consumer of each queue received from (see the `feed` module).
    feeds: Mutex<HashMap<String, Arc<Feed>>>,
    /// Given up: a call on it got no answer in time (see [`Session::abandon`]).
    abandoned: AtomicBool,
}

impl Session {
    fn is_alive(&self) -> bool {
        !self.abandoned.load(Ordering::Relaxed) && self.connection.status().connected()
    }

    /// Give the session up: RabbitMQ did not answer a call on it in time (a connection whose
    /// peer went silent without a reset, or a client that stopped reading it). The next call
    /// opens a new connection; this one is closed in the background, within `limit`, so that
    /// RabbitMQ puts back the messages it had pushed on it (if it can still hear us at all:
    /// otherwise its heartbeat timeout does).
    pub(super) fn abandon(self: &Arc<Self>, limit: Duration) {
        if self.abandoned.swap(true, Ordering::Relaxed) {
            return;
        }
        let session = Arc::clone(self);
        tokio::spawn(async move {
            let closing = session.connection.close(320, "no answer in time; reconnecting".into());
            let _closed = tokio::time::timeout(limit, closing).await;
        });
    }

    /// A fresh channel, for one operation or one `receive` and the leases it hands out.
    pub(super) async fn channel(&self) -> Result<Channel, BrokerError> {
        self.connection.create_channel().await.map_err(|e| error::transport(&e))
    }

    /// The live feed of `queue`, started (with `policy`) when there is none or the last
    /// one ended. `fresh` is true when this call started it.
    pub(super) async fn feed(
        &self,
        queue: &str,
        policy: PrefetchPolicy,
    ) -> Result<(Arc<Feed>, bool), BrokerError> {
        let mut feeds = self.feeds.lock().await;
        if let Some(feed) = feeds.get(queue).filter(|feed| !feed.is_ended()) {
            return Ok((Arc::clone(feed), false));
        }
        let feed = Feed::start(&self.connection, queue, policy).await?;
        feeds.insert(queue.to_owned(), Arc::clone(&feed));
        Ok((feed, true))
    }

    /// The prefetch of `queue`'s live feed, if it has one.
    pub(super) async fn prefetch(&self, queue: &str) -> Option<u16> {
        let feeds = self.feeds.lock().await;
        feeds.get(queue).filter(|feed| !feed.is_ended()).map(|feed| feed.prefetch())
    }

    /// Forget the feed of `queue` (it was deleted).
    pub(super) async fn forget_feed(&self, queue: &str) {
        self.feeds.lock().await.remove(queue);
    }

    /// The shared channel publishes go through, in confirm mode.
    pub(super) async fn publisher(&self) -> Result<Channel, BrokerError> {
        let mut publisher = self.publisher.lock().await;
        if let Some(channel) = publisher.as_ref().filter(|c| c.status().connected()) {
            return Ok(channel.clone());
        }
        let channel = self.channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| error::transport(&e))?;
        *publisher = Some(channel.clone());
        Ok(channel)
    }
}

/// How long the connection waits for RabbitMQ.
pub(super) struct Limits {
    /// One attempt to connect.
    pub(super) connect: Duration,
    /// The answers to one call ([`Sessions::answered`]).
    pub(super) answer: Duration,
}

/// The current session, replaced when it is found broken.
pub(super) struct Sessions {
    endpoints: Vec<Endpoint>,
    /// The endpoint tried first at the next connect: the one after the node lost last.
    first: AtomicUsize,
    /// The endpoint of the live session.
    connected_to: AtomicUsize,
    connection_name: String,
    reconnect: RetryPolicy,
    limits: Limits,
    current: Mutex<Option<Arc<Session>>>,
}

impl Sessions {
    pub(super) fn new(
        endpoints: Vec<Endpoint>,
        connection_name: String,
        reconnect: RetryPolicy,
        limits: Limits,
    ) -> Self {
        Sessions {
            endpoints,
            first: AtomicUsize::new(0),
            connected_to: AtomicUsize::new(0),
            connection_name,
            reconnect,
            limits,
            current: Mutex::new(None),
        }
    }

    /// Every node the broker URL lists, in its order.
    pub(super) fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// The node of the live (or last) session, for messages.
    fn current_endpoint(&self) -> &Endpoint {
        let index = self.connected_to.load(Ordering::Relaxed);
        &self.endpoints[index % self.endpoints.len()]
    }

    /// The live session, connecting (with backoff) when there is none.
    pub(super) async fn get(&self) -> Result<Arc<Session>, BrokerError> {
        let mut current = self.current.lock().await;
        if let Some(session) = current.as_ref().filter(|s| s.is_alive()) {
            return Ok(Arc::clone(session));
        }
        if current.take().is_some() {
            let lost = self.connected_to.load(Ordering::Relaxed);
            self.first.store((lost + 1) % self.endpoints.len(), Ordering::Relaxed);
            tracing::warn!(broker = %self.current_endpoint().redacted, "connection lost; reconnecting");
        }
        let session = Arc::new(self.connect_with_backoff().await?);
        *current = Some(Arc::clone(&session));
        Ok(session)
    }

    /// `operation` on `session`, bounded by [`Limits::answer`] (`RabbitMqOptions::answer_limit`) plus `also` (a
    /// receive's own wait). Without RabbitMQ's answers in time the call fails with
    /// `Connection` (transient) and the session is given up: the next call reconnects. `what`
    /// and `queue` name the call in that error (`a publish to` `work`).
    pub(super) async fn answered<T>(
        &self,
        session: &Arc<Session>,
        (what, queue): (&str, &str),
        also: Duration,
        operation: impl Future<Output = Result<T, BrokerError>>,
    ) -> Result<T, BrokerError> {
        let limit = self.limits.answer;
        match tokio::time::timeout(limit.saturating_add(also), operation).await {
            Ok(result) => result,
            Err(_) => {
                session.abandon(limit);
                Err(BrokerError::Connection(format!(
                    "RabbitMQ did not answer {what} `{queue}` within {:.0} s; the connection is \
                     given up and the next call opens a new one",
                    limit.as_secs_f64()
                )))
            }
        }
    }

    async fn connect_with_backoff(&self) -> Result<Session, BrokerError> {
        (|| self.connect_once())
            .retry(self.reconnect.builder())
            .when(|e| matches!(e, BrokerError::Connection(_)))
            .notify(|error, wait| {
                tracing::warn!(%error,
                    retry_in_ms = wait.as_millis() as u64, "connecting to RabbitMQ failed");
            })
            .await
    }

    /// One round over the nodes, from [`Sessions::first`]: the first that answers.
    async fn connect_once(&self) -> Result<Session, BrokerError> {
        let count = self.endpoints.len();
        let first = self.first.load(Ordering::Relaxed);
        let mut last_error = None;
        for index in (0..count).map(|n| (first + n) % count) {
            match self.connect_to(&self.endpoints[index]).await {
                Ok(session) => {
                    self.connected_to.store(index, Ordering::Relaxed);
                    self.first.store(index, Ordering::Relaxed);
                    return Ok(session);
                }
                Err(error @ BrokerError::Connection(_)) if count > 1 => {
                    tracing::debug!(broker = %self.endpoints[index].redacted, %error,
                        "node did not answer; trying the next");
                    last_error = Some(error);
                }
                Err(error) => return Err(error),
            }
        }
        Err(match last_error {
            Some(BrokerError::Connection(last)) => BrokerError::Connection(format!(
                "none of the {count} RabbitMQ nodes answered (the last: {last})"
            )),
            Some(other) => other,
            None => BrokerError::Connection("no RabbitMQ node to connect to".into()),
        })
    }

    async fn connect_to(&self, endpoint: &Endpoint) -> Result<Session, BrokerError> {
        let properties = ConnectionProperties::default()
            .with_connection_name(self.connection_name.clone().into());
        let connecting = Connection::connect_uri(endpoint.uri.clone(), properties);
        let connection = tokio::time::timeout(self.limits.connect, connecting)
            .await
            .map_err(|_| {
                BrokerError::Connection(format!(
                    "no answer from {} within {:?}",
                    endpoint.redacted, self.limits.connect
                ))
            })?
            .map_err(|e| {
                if login_refused(&e) {
                    // Trying again gives the same answer: one line that says what to change.
                    return BrokerError::Refused(format!(
                        "RabbitMQ at {} refused the login: wrong user or password (the \
                         user:password in --broker or BATCHFLEET_BROKER)",
                        endpoint.redacted
                    ));
                }
                BrokerError::Connection(format!("cannot connect to {}: {e}", endpoint.redacted))
            })?;
        tracing::info!(broker = %endpoint.redacted, connection = %self.connection_name,
            "connected to RabbitMQ");
        Ok(Session {
            connection,
            publisher: Mutex::new(None),
            feeds: Mutex::new(HashMap::new()),
            abandoned: AtomicBool::new(false),
        })
    }
}

/// RabbitMQ refused the user or password (`ACCESS_REFUSED` when connecting).
fn login_refused(error: &lapin::Error) -> bool {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    matches!(error.kind(), lapin::ErrorKind::ProtocolError(e)
        if matches!(e.kind(), AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_never_shows() {
        let endpoint = Endpoint::parse("amqp://bob:s3cret@rabbit.local:5673/%2f").unwrap();
        assert_eq!(endpoint.redacted, "amqp://bob@rabbit.local:5673/%2F");
        assert!(!format!("{endpoint:?}").contains("s3cret"));
        let err = Endpoint::parse("amqp://bob:s3cret@host:notaport/").unwrap_err();
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }

    #[test]
    fn a_list_names_every_node_and_hides_every_password() {
        let endpoints =
            parse_endpoints("amqp://a:s3cret@r0:5680/%2f, amqp://b:s3cret@r1:5681/%2f,").unwrap();
        let shown: Vec<_> = endpoints.iter().map(|e| e.redacted.clone()).collect();
        assert_eq!(shown, ["amqp://a@r0:5680/%2F", "amqp://b@r1:5681/%2F"]);
        assert!(parse_endpoints(" , ").is_err());
        let err = parse_endpoints("amqp://a:s3cret@r0/,amqp://b:s3cret@r1:bad/").unwrap_err();
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }

    #[test]
    fn defaults_fill_in_the_vhost() {
        let endpoint = Endpoint::parse("amqp://guest:guest@127.0.0.1").unwrap();
        assert_eq!(endpoint.uri.vhost, "/");
        assert_eq!(endpoint.uri.authority.port, 5672);
    }
}

//! Queue depth from RabbitMQ's management HTTP API (the `rabbitmq_management` plugin).
//!
//! AMQP can count a queue's ready messages (a passive `queue.declare`) but not its unacked
//! ones, and depth must include those: the autoscaling signal may never hide busy work. The
//! management API has both, as one snapshot (`messages_ready`, `messages_unacknowledged`).
//! It is a snapshot of statistics RabbitMQ collects periodically (`collect_statistics_interval`,
//! 5 s by default; quorum queues report on their own tick, `quorum_tick_interval`), so it lags
//! the queue by that much — but the total it reports is consistent: a receive moves a message
//! from ready to unacked within one snapshot, never out of both.
//!
//! Plain HTTP only (ureq without a TLS stack): an `https://` management URL is refused with a
//! message saying so.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use url::Url;

use super::session::Endpoint;
use crate::broker::{BrokerError, QueueDepth};

/// The management port RabbitMQ listens on by default (plain HTTP).
const DEFAULT_PORT: u16 = 15672;
const TIMEOUT: Duration = Duration::from_secs(10);

/// One node's management API, without credentials in `base` (safe to show).
struct Api {
    base: Url,
    authorization: String,
}

/// A client of a broker's management API, for one vhost: of each node the broker URL lists
/// (or each URL given), asked in turn from the one that answered last.
pub(super) struct Management {
    apis: Vec<Api>,
    /// The API asked first: the last that answered.
    first: AtomicUsize,
    vhost: String,
    agent: ureq::Agent,
}

impl Management {
    /// `urls` when given (comma-separated; credentials in one win over the AMQP ones), else
    /// each AMQP node's host on port 15672 with the AMQP credentials.
    pub(super) fn new(endpoints: &[Endpoint], urls: Option<&str>) -> Result<Self, BrokerError> {
        let Some(first) = endpoints.first() else {
            return Err(BrokerError::Refused("the broker URL lists no AMQP address".into()));
        };
        let apis = match urls {
            Some(urls) => urls
                .split(',')
                .map(str::trim)
                .filter(|url| !url.is_empty())
                .map(|url| Api::new(first, Some(url)))
                .collect::<Result<Vec<_>, _>>()?,
            None => endpoints
                .iter()
                .map(|endpoint| Api::new(endpoint, None))
                .collect::<Result<Vec<_>, _>>()?,
        };
        if apis.is_empty() {
            return Err(BrokerError::Refused("the management URL lists no address".into()));
        }
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(TIMEOUT))
            .http_status_as_error(false)
            .build();
        Ok(Management {
            apis,
            first: AtomicUsize::new(0),
            vhost: first.uri.vhost.clone(),
            agent: ureq::Agent::new_with_config(config),
        })
    }

    /// GET `segments` of the first API that answers at all; the error of the last when none
    /// does. Returns the answer and the base that gave it (for messages).
    async fn ask(&self, segments: &[&str]) -> Result<(u16, String, Url), (String, Url)> {
        let count = self.apis.len();
        let first = self.first.load(Ordering::Relaxed);
        let mut last = (String::new(), self.apis[first % count].base.clone());
        for index in (0..count).map(|n| (first + n) % count) {
            let api = &self.apis[index];
            let url = match api_url(&api.base, segments) {
                Ok(url) => url,
                Err(error) => return Err((error.to_string(), api.base.clone())),
            };
            let (agent, authorization) = (self.agent.clone(), api.authorization.clone());
            let answer = tokio::task::spawn_blocking(move || get(&agent, &url, &authorization))
                .await
                .map_err(|e| (format!("the call did not finish: {e}"), api.base.clone()))?;
            match answer {
                Ok((status, body)) => {
                    self.first.store(index, Ordering::Relaxed);
                    return Ok((status, body, api.base.clone()));
                }
                Err(error) => last = (error.to_string(), api.base.clone()),
            }
        }
        Err(last)
    }

    /// Ready + unacked as of RabbitMQ's last statistics; `None` while the queue has none yet
    /// (it was declared moments ago) or the API does not know it (yet).
    pub(super) async fn depth(&self, queue: &str) -> Result<Option<QueueDepth>, BrokerError> {
        match self.ask(&["api", "queues", &self.vhost, queue]).await {
            Ok((200, body, _)) => parse_depth(&body),
            Ok((404, _, _)) => Ok(None),
            Ok((401 | 403, _, shown)) => Err(BrokerError::Refused(format!(
                "the management API at {shown} refused the credentials (the user needs the \
                 `monitoring` or `management` tag)"
            ))),
            Ok((status, _, shown)) => Err(BrokerError::Refused(format!(
                "the management API at {shown} answered HTTP {status} for queue `{queue}`"
            ))),
            Err((error, shown)) => Err(BrokerError::Connection(format!(
                "the management API at {shown} did not answer ({error}); queue depth needs the \
                 rabbitmq_management plugin (`rabbitmq-plugins enable rabbitmq_management`)"
            ))),
        }
    }

    /// The client-provided names of the broker's connections (all vhosts the user may see).
    pub(super) async fn connection_names(&self) -> Result<Vec<String>, BrokerError> {
        match self.ask(&["api", "connections"]).await {
            Ok((200, body, _)) => parse_connection_names(&body),
            Ok((status, _, shown)) => Err(BrokerError::Refused(format!(
                "the management API at {shown} answered HTTP {status} for the connections"
            ))),
            Err((error, shown)) => Err(BrokerError::Connection(format!(
                "the management API at {shown} did not answer ({error})"
            ))),
        }
    }

    #[cfg(test)]
    fn queue_url(&self, queue: &str) -> Result<Url, BrokerError> {
        api_url(&self.apis[0].base, &["api", "queues", &self.vhost, queue])
    }
}

impl Api {
    fn new(endpoint: &Endpoint, url: Option<&str>) -> Result<Self, BrokerError> {
        let amqp = &endpoint.uri.authority;
        let mut base = match url {
            Some(url) => Url::parse(url)
                .map_err(|e| BrokerError::Refused(format!("management URL is not a URL ({e})")))?,
            None => Url::parse(&format!("http://{}:{DEFAULT_PORT}/", host_for_url(&amqp.host)))
                .map_err(|e| {
                    BrokerError::Refused(format!("cannot derive a management URL ({e})"))
                })?,
        };
        let username = match base.username() {
            "" => amqp.userinfo.username.clone(),
            name => percent_decode(name),
        };
        let password = match base.password() {
            Some(password) => percent_decode(password),
            None if url.is_some() && !base.username().is_empty() => String::new(),
            None => amqp.userinfo.password.clone(),
        };
        // Errors from here on may show `base`: take the credentials out of it.
        let _ = base.set_username("");
        let _ = base.set_password(None);
        let credentials =
            base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
        Ok(Api { base, authorization: format!("Basic {credentials}") })
    }
}

fn api_url(base: &Url, segments: &[&str]) -> Result<Url, BrokerError> {
    if base.scheme() != "http" {
        return Err(BrokerError::Refused(format!(
            "management URL {base}: only http:// is supported (this build has no TLS for it)"
        )));
    }
    let mut url = base.clone();
    url.path_segments_mut()
        .map_err(|()| BrokerError::Refused(format!("management URL {base} cannot take a path")))?
        .pop_if_empty()
        .extend(segments);
    Ok(url)
}

fn get(agent: &ureq::Agent, url: &Url, authorization: &str) -> Result<(u16, String), ureq::Error> {
    let mut response = agent.get(url.as_str()).header("authorization", authorization).call()?;
    let status = response.status().as_u16();
    let body = response.body_mut().read_to_string()?;
    Ok((status, body))
}

fn parse_depth(body: &str) -> Result<Option<QueueDepth>, BrokerError> {
    let queue: serde_json::Value = serde_json::from_str(body).map_err(|e| {
        BrokerError::Refused(format!(
            "the management API answered something that is not JSON ({e})"
        ))
    })?;
    let count = |field: &str| queue.get(field).and_then(serde_json::Value::as_u64);
    Ok(match (count("messages_ready"), count("messages_unacknowledged")) {
        (Some(ready), Some(in_flight)) => Some(QueueDepth { ready, in_flight }),
        _ => None,
    })
}

fn parse_connection_names(body: &str) -> Result<Vec<String>, BrokerError> {
    let list: serde_json::Value = serde_json::from_str(body).map_err(|e| {
        BrokerError::Refused(format!(
            "the management API answered something that is not JSON ({e})"
        ))
    })?;
    Ok(list
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["client_properties"]["connection_name"].as_str().map(str::to_owned))
        .collect())
}

/// An IPv6 literal needs brackets in a URL.
fn host_for_url(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

/// `%XX` escapes of URL userinfo decoded (`+` stays `+`, unlike in a query string).
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| value.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                decoded.push(byte);
                i += 3;
            }
            None => {
                decoded.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(url: &str) -> Vec<Endpoint> {
        super::super::session::parse_endpoints(url).unwrap()
    }

    #[test]
    fn connection_names_are_the_client_provided_ones() {
        let body = r#"[{"name": "127.0.0.1:1 -> 127.0.0.1:5672",
            "client_properties": {"connection_name": "batchfleet-worker/p/w1"}},
            {"name": "127.0.0.1:2 -> 127.0.0.1:5672", "client_properties": {}}]"#;
        assert_eq!(parse_connection_names(body).unwrap(), ["batchfleet-worker/p/w1"]);
        assert!(parse_connection_names("<html>").is_err());
    }

    #[test]
    fn derived_from_the_amqp_url_with_the_vhost_encoded() {
        let management = Management::new(&endpoint("amqp://bob:pw@rabbit:5672/%2f"), None).unwrap();
        let url = management.queue_url("jobs/1 work").unwrap();
        assert_eq!(url.as_str(), "http://rabbit:15672/api/queues/%2F/jobs%2F1%20work");
        assert_eq!(management.apis[0].authorization, "Basic Ym9iOnB3");
    }

    #[test]
    fn an_explicit_url_keeps_its_path_and_its_credentials_stay_out_of_it() {
        let management = Management::new(
            &endpoint("amqp://bob:pw@rabbit/prod"),
            Some("http://admin:s3cret@proxy:8080/rabbitmq/"),
        )
        .unwrap();
        let url = management.queue_url("work").unwrap();
        assert_eq!(url.as_str(), "http://proxy:8080/rabbitmq/api/queues/prod/work");
        assert!(!management.apis[0].base.as_str().contains("s3cret"));
        assert_eq!(percent_decode("a%2Bb+c%zz"), "a+b+c%zz");
    }

    #[test]
    fn a_cluster_has_an_api_per_node() {
        let management =
            Management::new(&endpoint("amqp://a:b@r0/%2f,amqp://a:b@r1/%2f"), None).unwrap();
        let bases: Vec<_> = management.apis.iter().map(|api| api.base.to_string()).collect();
        assert_eq!(bases, ["http://r0:15672/", "http://r1:15672/"]);
        let given = Management::new(
            &endpoint("amqp://a:b@r0/%2f"),
            Some("http://127.0.0.1:15680, http://127.0.0.1:15681"),
        )
        .unwrap();
        assert_eq!(given.apis.len(), 2);
    }

    #[test]
    fn https_is_refused_with_a_reason() {
        let management =
            Management::new(&endpoint("amqp://rabbit"), Some("https://rabbit:15671/")).unwrap();
        let err = management.queue_url("work").unwrap_err();
        assert!(err.to_string().contains("only http://"), "{err}");
    }

    #[test]
    fn a_queue_without_statistics_yet_has_no_depth() {
        assert_eq!(parse_depth(r#"{"name":"w","messages_ready":null}"#).unwrap(), None);
        assert_eq!(
            parse_depth(r#"{"messages_ready":2,"messages_unacknowledged":3}"#).unwrap(),
            Some(QueueDepth { ready: 2, in_flight: 3 })
        );
    }
}

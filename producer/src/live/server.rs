//! The live page's HTTP server (axum): the page, each job's snapshot as JSON (computed at most
//! once every 2 s per job, whoever asks), the profile page of what ended, and a failure
//! record's JSON. Read-only: every route is a GET and none writes anything.
//!
//! Routes: `/` the page; `/api/jobs` the jobs; `/api/jobs/{id}/state` a job's snapshot;
//! `/jobs/{id}/profile` `batchfleet profile`'s page; `/jobs/{id}/failures/{batch}/{file}` a
//! failure record; `/api/pipelines` every pipeline's step graph; `/pipelines/{id}/profile` a
//! pipeline's profile page.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use tokio::sync::Mutex;

use batchfleet_common::job_root::JobRoot;

use super::reader::JobReader;
use super::snapshot::snapshot;
use super::{pipelines, registered, registered_pipelines, Jobs};
use crate::report::analysis::Profile;

const PAGE_HTML: &str = include_str!("live.html");
const PAGE_CSS: &str = include_str!("live.css");
const PAGE_JS: &str = include_str!("live.js");

/// A job's snapshot is computed again once it is this old (the page asks every 2 s; workers
/// write their attempt records every 2 s).
const FRESH_FOR: Duration = Duration::from_secs(2);
/// The store's job roots are listed again once the list is this old.
const LIST_FRESH_FOR: Duration = Duration::from_secs(10);

/// One job the server follows.
struct Followed {
    reader: JobReader,
    snapshot: Option<(Instant, u64, Bytes)>,
}

/// What every request shares.
pub struct Shared {
    jobs: Jobs,
    token: Option<String>,
    price: Option<f64>,
    followed: Mutex<BTreeMap<String, Arc<Mutex<Followed>>>>,
    listed: Mutex<Option<(Instant, Vec<JobRoot>)>>,
}

impl Shared {
    pub fn new(jobs: Jobs, token: Option<String>, price: Option<f64>) -> Shared {
        Shared {
            jobs,
            token,
            price,
            followed: Mutex::new(BTreeMap::new()),
            listed: Mutex::new(None),
        }
    }

    /// The job roots shown, newest job id last.
    async fn roots(&self) -> Result<Vec<JobRoot>, String> {
        match &self.jobs {
            Jobs::ThisProcess => Ok(registered()),
            Jobs::Root(root) => Ok(vec![root.clone()]),
            Jobs::Pipeline(folder) => Ok(pipelines::step_roots(folder).await),
            Jobs::Store(url) => {
                let mut listed = self.listed.lock().await;
                if let Some((at, roots)) = listed.as_ref() {
                    if at.elapsed() < LIST_FRESH_FOR {
                        return Ok(roots.clone());
                    }
                }
                let mut roots =
                    JobRoot::roots_under(url).await.map_err(|e| format!("listing jobs: {e}"))?;
                roots.sort_by(|a, b| a.job_id.cmp(&b.job_id));
                *listed = Some((Instant::now(), roots.clone()));
                Ok(roots)
            }
        }
    }

    /// The pipelines shown (their folders).
    fn pipelines(&self) -> Vec<JobRoot> {
        match &self.jobs {
            Jobs::ThisProcess => registered_pipelines(),
            Jobs::Pipeline(folder) => vec![folder.clone()],
            Jobs::Root(_) | Jobs::Store(_) => Vec::new(),
        }
    }

    /// The folder of pipeline `id`, opened with this thread's own store client.
    fn pipeline(&self, id: &str) -> Option<JobRoot> {
        let folder = self.pipelines().into_iter().find(|p| p.job_id == id)?;
        Some(JobRoot::open(&folder.url()).unwrap_or(folder))
    }

    async fn job(&self, id: &str) -> Result<Arc<Mutex<Followed>>, Response> {
        if let Some(found) = self.followed.lock().await.get(id) {
            return Ok(found.clone());
        }
        let roots = self.roots().await.map_err(|e| error(StatusCode::BAD_GATEWAY, &e))?;
        let Some(root) = roots.into_iter().find(|r| r.job_id == id) else {
            return Err(error(StatusCode::NOT_FOUND, &format!("no job {id} here")));
        };
        // A root another runtime made holds that runtime's store client: this thread's own.
        let root = JobRoot::open(&root.url()).unwrap_or(root);
        let followed =
            Arc::new(Mutex::new(Followed { reader: JobReader::new(root), snapshot: None }));
        self.followed.lock().await.insert(id.to_owned(), followed.clone());
        Ok(followed)
    }
}

/// Serve until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    let app = Router::new()
        .route("/", get(page))
        .route("/api/jobs", get(jobs))
        .route("/api/jobs/{id}/state", get(state))
        .route("/jobs/{id}/profile", get(profile))
        .route("/jobs/{id}/failures/{batch}/{file}", get(failure))
        .route("/api/pipelines", get(pipelines_state))
        .route("/pipelines/{id}/profile", get(pipeline_profile))
        .layer(middleware::from_fn_with_state(shared.clone(), token_check))
        .with_state(shared);
    if let Err(error) = axum::serve(listener, app).await {
        tracing::warn!(%error, "the live page stopped serving");
    }
}

/// A request without the token (when one is asked) gets 401 and nothing else.
async fn token_check(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
    request: Request,
    next: Next,
) -> Response {
    if let Some(token) = &shared.token {
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let given = query.get("token").map(String::as_str).or(bearer);
        if !given.is_some_and(|given| same(given.as_bytes(), token.as_bytes())) {
            return error(
                StatusCode::UNAUTHORIZED,
                "this page asks for its token: open the URL batchfleet printed (…/?token=…)",
            );
        }
    }
    let mut response = next.run(request).await;
    response.headers_mut().insert(header::CACHE_CONTROL, "no-store".parse().expect("a header"));
    response
}

/// Equal, in a time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn error(status: StatusCode, text: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({"error": text}).to_string(),
    )
        .into_response()
}

fn json_bytes(bytes: Bytes) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], bytes).into_response()
}

async fn page() -> Response {
    let html = PAGE_HTML.replace("/*CSS*/", PAGE_CSS).replace("/*JS*/", PAGE_JS);
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response()
}

async fn jobs(State(shared): State<Arc<Shared>>) -> Response {
    match shared.roots().await {
        Ok(roots) => {
            let ids: Vec<&str> = roots.iter().map(|r| r.job_id.as_str()).collect();
            json_bytes(Bytes::from(serde_json::json!({"jobs": ids}).to_string()))
        }
        Err(e) => error(StatusCode::BAD_GATEWAY, &e),
    }
}

async fn state(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    let followed = match shared.job(&id).await {
        Ok(followed) => followed,
        Err(response) => return response,
    };
    let mut followed = followed.lock().await;
    if let Some((at, _, bytes)) = &followed.snapshot {
        if at.elapsed() < FRESH_FOR {
            return json_bytes(bytes.clone());
        }
    }
    if let Err(e) = followed.reader.refresh().await {
        return error(StatusCode::BAD_GATEWAY, &format!("reading the job root: {e}"));
    }
    let generation = followed.reader.generation;
    let now = now_ms();
    let value = snapshot(&followed.reader, now, shared.price);
    let bytes = Bytes::from(value.to_string());
    followed.snapshot = Some((Instant::now(), generation, bytes.clone()));
    json_bytes(bytes)
}

async fn profile(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    let followed = match shared.job(&id).await {
        Ok(followed) => followed,
        Err(response) => return response,
    };
    let root = followed.lock().await.reader.root.clone();
    let data = match crate::report::load::load(&root).await {
        Ok(data) => data,
        Err(e) => return error(StatusCode::BAD_GATEWAY, &format!("reading the job root: {e}")),
    };
    if data.records.is_empty() {
        let text = "<!DOCTYPE html><meta charset=\"utf-8\"><body style=\"font:14px sans-serif\">\
                    No attempt has ended yet: the timeline appears with the first.</body>";
        return ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], text).into_response();
    }
    match crate::report::page::html(&data, &Profile::new(&data.records)) {
        Ok(html) => ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &format!("the profile page: {e}")),
    }
}

async fn failure(
    State(shared): State<Arc<Shared>>,
    Path((id, batch, file)): Path<(String, String, String)>,
) -> Response {
    let followed = match shared.job(&id).await {
        Ok(followed) => followed,
        Err(response) => return response,
    };
    let key = format!("failures/{batch}/{file}");
    let found = followed.lock().await.reader.failure_json(&key).await;
    match found {
        Some(bytes) => json_bytes(bytes),
        None => error(StatusCode::NOT_FOUND, &format!("no failure record {key} on the page")),
    }
}

/// Every pipeline's step graph, as it stands (a pipeline is a handful of small files: read at
/// each look).
async fn pipelines_state(State(shared): State<Arc<Shared>>) -> Response {
    let mut shown = Vec::new();
    for folder in shared.pipelines() {
        let Some(folder) = shared.pipeline(&folder.job_id) else { continue };
        match pipelines::state(&folder, now_ms()).await {
            Ok(graph) => shown.push(graph),
            Err(e) => shown.push(serde_json::json!({"id": folder.job_id, "error": e})),
        }
    }
    json_bytes(Bytes::from(serde_json::json!({"pipelines": shown}).to_string()))
}

async fn pipeline_profile(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    let Some(folder) = shared.pipeline(&id) else {
        return error(StatusCode::NOT_FOUND, &format!("no pipeline {id} here"));
    };
    match pipelines::page(&folder, now_ms()).await {
        Ok(html) => ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response(),
        Err(e) => error(StatusCode::BAD_GATEWAY, &format!("the pipeline's profile: {e}")),
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

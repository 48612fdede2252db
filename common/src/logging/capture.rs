//! The lines a process logs, kept (bounded) in memory so that each job's `logs/sys/<process>.log`
//! can be uploaded into its root when the job ends: WARN and ERROR always; every level down to
//! DEBUG while a job asked for it (`logging_level: DEBUG`, see [`capture_debug`]).
//!
//! Each line remembers the `job_id` and `worker_id` fields of the event or of the spans it is
//! in, so [`lines_for`] can give one job's lines of one worker (or of the producer) and the
//! lines that name no job but were logged while it ran.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::{filter_fn, LevelFilter};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Lines kept at most; the oldest go first.
const KEEP_LINES: usize = 20_000;

/// One captured line.
#[derive(Debug, Clone)]
struct Line {
    ms: u64,
    job_id: Option<String>,
    worker_id: Option<String>,
    text: String,
}

fn lines() -> &'static Mutex<VecDeque<Line>> {
    static LINES: OnceLock<Mutex<VecDeque<Line>>> = OnceLock::new();
    LINES.get_or_init(|| Mutex::new(VecDeque::new()))
}

/// Jobs running in this process that asked for DEBUG lines.
static DEBUG_JOBS: AtomicUsize = AtomicUsize::new(0);

/// While the returned guard lives, DEBUG and INFO lines are captured too.
pub fn capture_debug() -> DebugGuard {
    DEBUG_JOBS.fetch_add(1, Ordering::SeqCst);
    DebugGuard(())
}

/// See [`capture_debug`].
#[derive(Debug)]
pub struct DebugGuard(());

impl Drop for DebugGuard {
    fn drop(&mut self) {
        DEBUG_JOBS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether a job running in this process asked for DEBUG lines.
pub fn debug_wanted() -> bool {
    DEBUG_JOBS.load(Ordering::Relaxed) > 0
}

fn captured(level: &Level) -> bool {
    *level <= Level::WARN || (debug_wanted() && *level <= Level::DEBUG)
}

/// Whose lines [`lines_for`] returns.
#[derive(Debug, Clone, Copy)]
pub enum Process<'a> {
    /// Lines logged outside any worker's span.
    Producer,
    /// Lines of one worker (its `worker_id` span field).
    Worker(&'a str),
}

/// The captured lines of `process` for `job_id`: those naming the job, and those naming no job
/// logged at or after `since_ms` (the job's start in this process). One line each, oldest first.
pub fn lines_for(process: Process<'_>, job_id: &str, since_ms: u64) -> String {
    let Ok(lines) = lines().lock() else { return String::new() };
    let mut out = String::new();
    for line in lines.iter() {
        let whose = match process {
            Process::Producer => line.worker_id.is_none(),
            Process::Worker(worker) => line.worker_id.as_deref() == Some(worker),
        };
        let job = match &line.job_id {
            Some(id) => id == job_id,
            None => line.ms >= since_ms,
        };
        if whose && job {
            out.push_str(&line.text);
            out.push('\n');
        }
    }
    out
}

/// The capturing layer with its filter, as [`super::init`] installs it: WARN and ERROR of every
/// crate; DEBUG and INFO of batchfleet's own while a job asks; and batchfleet's spans, whose
/// job and worker ids the lines are sorted by.
pub fn layer<S>() -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    CaptureLayer.with_filter(
        filter_fn(|meta| {
            let ours = meta.target().starts_with("batchfleet");
            // lapin's dump of a returned message: see `super::QUIET_RETURNS`.
            let returned = meta.target() == "lapin::returned_messages";
            !returned
                && ((meta.is_span() && ours)
                    || *meta.level() <= Level::WARN
                    || (debug_wanted() && ours && *meta.level() <= Level::DEBUG))
        })
        .with_max_level_hint(LevelFilter::DEBUG),
    )
}

/// The layer that captures (see [`layer`] for its filter).
pub struct CaptureLayer;

/// The `job_id` / `worker_id` a span was created with.
#[derive(Debug, Default, Clone)]
struct Ids {
    job_id: Option<String>,
    worker_id: Option<String>,
    /// A span's batch id (a batch's lines name it).
    batch_id: Option<String>,
}

/// Collects an event's or span's fields: the ids apart, the rest as ` key=value`.
#[derive(Default)]
struct Fields {
    ids: Ids,
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "job_id" => self.ids.job_id = Some(value.to_owned()),
            "worker_id" => self.ids.worker_id = Some(value.to_owned()),
            "batch_id" => self.ids.batch_id = Some(value.to_owned()),
            "message" if self.message.is_empty() => self.message.push_str(value),
            name => {
                let _ = write!(self.rest, " {name}={value:?}");
            }
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "job_id" => self.ids.job_id = Some(format!("{value:?}")),
            "worker_id" => self.ids.worker_id = Some(format!("{value:?}")),
            "batch_id" => self.ids.batch_id = Some(format!("{value:?}")),
            "message" if self.message.is_empty() => {
                let _ = write!(self.message, "{value:?}");
            }
            name => {
                let _ = write!(self.rest, " {name}={value:?}");
            }
        }
    }
}

impl<S> Layer<S> for CaptureLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if fields.ids.job_id.is_some() || fields.ids.worker_id.is_some() {
            if let Some(span) = ctx.span(id) {
                span.extensions_mut().insert(fields.ids);
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let metadata = event.metadata();
        if !captured(metadata.level()) {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope {
                if let Some(ids) = span.extensions().get::<Ids>() {
                    if fields.ids.job_id.is_none() {
                        fields.ids.job_id.clone_from(&ids.job_id);
                    }
                    if fields.ids.worker_id.is_none() {
                        fields.ids.worker_id.clone_from(&ids.worker_id);
                    }
                    if fields.ids.batch_id.is_none() {
                        fields.ids.batch_id.clone_from(&ids.batch_id);
                    }
                }
            }
        }
        let ms = crate::status::now_ms();
        let when = humantime::format_rfc3339_millis(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
        );
        let mut text = format!(
            "{when} {:>5} {}: {}{}",
            metadata.level(),
            metadata.target(),
            fields.message,
            fields.rest
        );
        if let Some(batch_id) = &fields.ids.batch_id {
            let _ = write!(text, " batch_id={batch_id}");
        }
        if let Some(job_id) = &fields.ids.job_id {
            let _ = write!(text, " job_id={job_id}");
        }
        // One line per event: a multi-line message keeps its lines joined.
        let text = text.replace('\n', "\\n");
        let Ok(mut lines) = lines().lock() else { return };
        if lines.len() >= KEEP_LINES {
            lines.pop_front();
        }
        lines.push_back(Line {
            ms,
            job_id: fields.ids.job_id,
            worker_id: fields.ids.worker_id,
            text,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn a_jobs_lines_are_told_apart_by_its_id_and_its_worker() {
        let subscriber = tracing_subscriber::registry().with(layer());
        tracing::subscriber::with_default(subscriber, || {
            let since = crate::status::now_ms();
            tracing::warn!(job_id = "capture-a", "producer line of a");
            tracing::warn!("producer line of no job");
            tracing::info!(job_id = "capture-a", "an info line is not kept");
            let slot = tracing::info_span!("slot", worker_id = "capture-w", slot = 0);
            let _slot = slot.enter();
            let batch = tracing::info_span!("batch", job_id = "capture-a", batch_id = "1");
            batch.in_scope(
                || tracing::error!(attempt = 2, message = %"why", "worker line of a\nsecond line"),
            );
            tracing::warn!(job_id = "capture-b", "worker line of b");
            {
                let _debug = capture_debug();
                tracing::debug!(job_id = "capture-a", "a debug line while a job asked for it");
            }
            tracing::debug!(job_id = "capture-a", "a debug line once none does");

            let producer = lines_for(Process::Producer, "capture-a", since);
            assert!(producer.contains("producer line of a"), "{producer}");
            assert!(producer.contains("producer line of no job"), "{producer}");
            assert!(!producer.contains("worker line"), "{producer}");
            assert!(!producer.contains("info line"), "{producer}");
            let worker = lines_for(Process::Worker("capture-w"), "capture-a", since);
            assert!(
                worker.contains("ERROR batchfleet_common::logging::capture::tests: worker line of a\\nsecond line attempt=2 message=why batch_id=1 job_id=capture-a"),
                "{worker}"
            );
            assert!(!worker.contains("worker line of b"), "{worker}");
            assert!(worker.contains("a debug line while a job asked for it"), "{worker}");
            assert!(!worker.contains("once none does"), "{worker}");
            assert_eq!(worker.lines().count(), 2, "{worker}");
        });
    }
}

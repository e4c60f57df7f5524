//! A run's events, live: Server-Sent Events read from the run's event log as it grows, so a stream
//! shows the same events whoever runs the run (this server or a terminal). Each event's `id` is its
//! `seq`; a client that reconnects with `Last-Event-ID` gets the events after it, none twice. The
//! stream ends with an `end` event once nobody runs the run any more and every event is sent.
//!
//! A stage's output (a command's standard output and error, an agent's transcript) streams the same
//! way from the files the stage writes ([`stage_output`]): output never goes through the event log.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt, stream};
use serde::Deserialize;
use trellis_store::{Chunk, Position, RunDir, StageOutput, StageState, read_whole_lines};
use utoipa::IntoParams;

use crate::api::{ApiError, blocking};
use crate::runs::Server;

/// How often a stream looks at the log when it was not woken (runs of other processes).
const POLL: Duration = Duration::from_millis(200);
/// At most this much of the log is read at a time.
const CHUNK: u64 = 4 << 20;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// `jsonl`: the event log as it stands, one JSON event a line, instead of a stream.
    format: Option<String>,
    /// Only events after this `seq` (as `Last-Event-ID` does).
    after: Option<u64>,
}

/// A run's events: a Server-Sent Events stream until the run ends, or the log as JSON lines.
#[utoipa::path(get, path = "/api/runs/{id}/events",
    params(("id" = String, Path, description = "The run id"), EventsQuery,
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume the stream after this event's seq")),
    responses((status = 200, description = "`text/event-stream`: each event's `data` is one event-log line and its `id` the event's `seq`; an `end` event closes the stream. With `format=jsonl`: `application/x-ndjson`."),
        (status = 404, description = "No such run")))]
pub async fn events(
    State(server): State<Arc<Server>>,
    UrlPath(id): UrlPath<String>,
    Query(query): Query<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let lookup = server.clone();
    let (record, run_id) = blocking(move || {
        let record = lookup.record(&id)?;
        let run_id = record.meta().map_err(ApiError::internal)?.run_id;
        Ok((record, run_id))
    })
    .await?;
    match query.format.as_deref() {
        None | Some("sse") => {}
        Some("jsonl") => {
            let path = record.events_path();
            let (lines, _) = blocking(move || read_lines(&path, 0, u64::MAX)).await?;
            return Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], lines).into_response());
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unknown format `{other}`: use `jsonl`, or none for a live stream"
            )));
        }
    }
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .or(query.after);
    let tail = Tail {
        server,
        record: Arc::new(record),
        run_id,
        offset: 0,
        after,
        ended: false,
    };
    Ok(Sse::new(tail.into_stream())
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// [`read_whole_lines`] as text, for a response (on the blocking pool).
fn read_lines(path: &std::path::Path, offset: u64, limit: u64) -> Result<(String, u64), ApiError> {
    let (bytes, next) = read_whole_lines(path, offset, limit)
        .map_err(|e| ApiError::internal(format!("cannot read {}: {e}", path.display())))?;
    Ok((String::from_utf8_lossy(&bytes).into_owned(), next))
}

/// The reading end of one stream.
struct Tail {
    server: Arc<Server>,
    record: Arc<RunDir>,
    run_id: String,
    offset: u64,
    /// The last `seq` sent.
    after: Option<u64>,
    ended: bool,
}

impl Tail {
    fn into_stream(self) -> impl Stream<Item = Result<SseEvent, Infallible>> {
        stream::unfold(self, |mut tail| async move {
            let batch = tail.next_batch().await?;
            Some((stream::iter(batch.into_iter().map(Ok)), tail))
        })
        .flatten()
    }

    /// The next events (waiting until there are some), the `end` event, or `None` after it.
    async fn next_batch(&mut self) -> Option<Vec<SseEvent>> {
        if self.ended {
            return None;
        }
        loop {
            if self.server.stopping.is_cancelled() {
                self.ended = true;
                return Some(vec![end_event("the server is stopping")]);
            }
            let wake = self.server.live(&self.run_id).map(|live| live.wake.clone());
            let woken = wake.as_ref().map(|w| w.notified());
            // Whether anyone runs the run is asked before reading: a run that ends between the two
            // has written every event before its owner let go, so the read sees them.
            let record = self.record.clone();
            let path: PathBuf = record.events_path();
            let offset = self.offset;
            let read = blocking(move || {
                let owned = record.has_live_owner();
                read_lines(&path, offset, CHUNK).map(|(text, next)| (owned, text, next))
            })
            .await;
            let Ok((owned, text, next)) = read else {
                self.ended = true;
                return Some(vec![end_event("the event log cannot be read")]);
            };
            self.offset = next;
            let batch = self.parse(&text);
            if !batch.is_empty() {
                return Some(batch);
            }
            if !owned && text.is_empty() {
                self.ended = true;
                return Some(vec![end_event("the run is not running")]);
            }
            if text.is_empty() {
                let stopping = self.server.stopping.cancelled();
                if let Some(woken) = woken {
                    tokio::select! {
                        _ = tokio::time::timeout(POLL, woken) => {}
                        () = stopping => {}
                    }
                } else {
                    tokio::select! {
                        () = tokio::time::sleep(POLL) => {}
                        () = stopping => {}
                    }
                }
            }
        }
    }

    /// The events in `text` after the last one sent; damaged lines are skipped.
    fn parse(&mut self, text: &str) -> Vec<SseEvent> {
        let mut batch = Vec::new();
        for line in text.lines() {
            let Ok(event) = serde_json::from_str::<trellis_engine::Event>(line) else {
                continue;
            };
            if self.after.is_some_and(|after| event.seq <= after) {
                continue;
            }
            self.after = Some(event.seq);
            batch.push(
                SseEvent::default()
                    .id(event.seq.to_string())
                    .data(line.trim_end()),
            );
        }
        batch
    }
}

fn end_event(reason: &str) -> SseEvent {
    SseEvent::default()
        .event("end")
        .data(serde_json::json!({ "reason": reason }).to_string())
}

/// How often a stage's output stream looks at its files.
const OUTPUT_POLL: Duration = Duration::from_millis(100);
/// At most this much of each output file is sent at a time.
const OUTPUT_CHUNK: u64 = 256 << 10;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OutputQuery {
    /// Start after this position (`stdout.stderr.transcript` byte offsets, as an event's `id`).
    after: Option<String>,
}

/// A stage's output as it is written: its `stdout.log`, `stderr.log` and `transcript.jsonl`, live.
#[utoipa::path(get, path = "/api/runs/{id}/stages/{dir}/output",
    params(("id" = String, Path, description = "The run id"),
        ("dir" = String, Path, description = "The stage directory (`002-build@1`)"), OutputQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this position")),
    responses((status = 200, description = "`text/event-stream`: `stdout`, `stderr` and `transcript` events whose `data` is `{\"text\": ...}` (whole lines; a transcript's lines are JSON entries) and whose `id` is the position after them; an `end` event (`{\"reason\": ...}`) once the stage has ended or nobody runs the run, and everything it wrote is sent. Output is never copied into the event log."),
        (status = 400, description = "A position that is not three byte offsets"),
        (status = 404, description = "No such run or stage")))]
pub async fn stage_output(
    State(server): State<Arc<Server>>,
    UrlPath((id, dir)): UrlPath<(String, String)>,
    Query(query): Query<OutputQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let given = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or(query.after);
    let at = match given.as_deref().map(str::parse::<Position>) {
        None => Position::default(),
        Some(Ok(at)) => at,
        Some(Err(problem)) => return Err(ApiError::bad_request(problem)),
    };
    let lookup = server.clone();
    let (record, output) = blocking(move || {
        let record = lookup.record(&id)?;
        let output = record
            .stage_output(&dir, at)
            .ok_or_else(|| ApiError::not_found("no such stage in the run"))?;
        Ok((Arc::new(record), output))
    })
    .await?;
    let follow = Follow {
        server,
        record,
        output: Some(output),
    };
    Ok(Sse::new(follow.into_stream())
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// The reading end of one stage's output stream.
struct Follow {
    server: Arc<Server>,
    record: Arc<RunDir>,
    /// `None` once the `end` event is sent.
    output: Option<StageOutput>,
}

impl Follow {
    fn into_stream(self) -> impl Stream<Item = Result<SseEvent, Infallible>> {
        stream::unfold(self, |mut follow| async move {
            let batch = follow.next_batch().await?;
            Some((stream::iter(batch.into_iter().map(Ok)), follow))
        })
        .flatten()
    }

    async fn next_batch(&mut self) -> Option<Vec<SseEvent>> {
        loop {
            let mut output = self.output.take()?;
            if self.server.stopping.is_cancelled() {
                return Some(vec![end_event("the server is stopping")]);
            }
            let record = self.record.clone();
            // Whether the stage is over is asked before reading: what it wrote before it ended is
            // then in the read.
            let read = blocking(move || {
                let over = output.state() == StageState::Ended || !record.has_live_owner();
                let chunks = output
                    .read(OUTPUT_CHUNK, over)
                    .map_err(ApiError::internal)?;
                Ok((output, over, chunks))
            })
            .await;
            let Ok((output, over, chunks)) = read else {
                return Some(vec![end_event("the stage's output cannot be read")]);
            };
            if !chunks.is_empty() {
                self.output = Some(output);
                return Some(chunks.iter().map(output_event).collect());
            }
            if over {
                return Some(vec![end_event(if output.state() == StageState::Ended {
                    "the stage has ended"
                } else {
                    "the run is not running"
                })]);
            }
            self.output = Some(output);
            tokio::select! {
                () = tokio::time::sleep(OUTPUT_POLL) => {}
                () = self.server.stopping.cancelled() => {}
            }
        }
    }
}

fn output_event(chunk: &Chunk) -> SseEvent {
    SseEvent::default()
        .event(chunk.stream.name())
        .id(chunk.then.to_string())
        .data(serde_json::json!({ "text": chunk.text }).to_string())
}

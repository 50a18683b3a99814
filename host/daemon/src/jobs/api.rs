//! The jobs API, served behind the daemon's bearer token:
//!
//! - `POST /jobs` `{"kind": "sft"|"rl", "config": {...}}`: queue a job (201 with the job).
//! - `GET /jobs`, `GET /jobs/{id}`: the jobs, or one.
//! - `POST /jobs/{id}/cancel`, `POST /jobs/{id}/resume`.
//! - `GET /jobs/{id}/metrics`: the run's metrics records as server-sent events (`data:` one
//!   JSON record per event, from the first), then `event: end` with the job once it is over.
//!   A resumed run rewinds its metrics to its checkpoint; the stream then sends the steps it
//!   does again.

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use super::{Job, JobError, Jobs, Submission};

/// How often a metrics stream looks for new records.
const POLL: Duration = Duration::from_millis(250);

/// The routes, for [`crate::http::HttpOptions::extra_routes`].
pub fn jobs_router(jobs: Jobs) -> Router {
    Router::new()
        .route("/jobs", post(submit).get(list))
        .route("/jobs/{id}", get(show))
        .route("/jobs/{id}/cancel", post(cancel))
        .route("/jobs/{id}/resume", post(resume))
        .route("/jobs/{id}/metrics", get(metrics))
        .with_state(jobs)
}

fn error(e: &JobError) -> Response {
    let status = match e {
        JobError::NotFound(_) => StatusCode::NOT_FOUND,
        JobError::Invalid(_) => StatusCode::BAD_REQUEST,
        JobError::Conflict { .. } | JobError::Locked(_) => StatusCode::CONFLICT,
        JobError::Store { .. } | JobError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, axum::Json(json!({"error": {"message": e.to_string()}}))).into_response()
}

/// Runs a store call off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, JobError> + Send + 'static) -> Result<T, JobError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(JobError::Invalid(format!("the request failed inside the server: {e}"))))
}

fn reply(result: Result<Job, JobError>, ok: StatusCode) -> Response {
    match result {
        Ok(job) => (ok, axum::Json(job)).into_response(),
        Err(e) => error(&e),
    }
}

async fn submit(State(jobs): State<Jobs>, body: Bytes) -> Response {
    let submission: Submission = match serde_json::from_slice(&body) {
        Ok(s) => s,
        Err(e) => return error(&JobError::Invalid(format!("invalid request body: {e}"))),
    };
    reply(blocking(move || jobs.submit(submission.kind, submission.config)).await, StatusCode::CREATED)
}

async fn list(State(jobs): State<Jobs>) -> Response {
    match blocking(move || jobs.list()).await {
        Ok(all) => axum::Json(json!({ "jobs": all })).into_response(),
        Err(e) => error(&e),
    }
}

async fn show(State(jobs): State<Jobs>, Path(id): Path<i64>) -> Response {
    reply(blocking(move || jobs.get(id)).await, StatusCode::OK)
}

async fn cancel(State(jobs): State<Jobs>, Path(id): Path<i64>) -> Response {
    reply(blocking(move || jobs.cancel(id)).await, StatusCode::OK)
}

async fn resume(State(jobs): State<Jobs>, Path(id): Path<i64>) -> Response {
    reply(blocking(move || jobs.resume(id)).await, StatusCode::OK)
}

async fn metrics(State(jobs): State<Jobs>, Path(id): Path<i64>) -> Response {
    let job = {
        let jobs = jobs.clone();
        match blocking(move || jobs.get(id)).await {
            Ok(job) => job,
            Err(e) => return error(&e),
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    let file = job.dir.join(toolsmith_train::metrics::METRICS_FILE);
    tokio::spawn(async move {
        // Bytes of the file already sent, always at a line's end.
        let mut offset = 0u64;
        loop {
            // Read the state first: records written before a job ends are then all on disk.
            let job = {
                let jobs = jobs.clone();
                match blocking(move || jobs.get(id)).await {
                    Ok(job) => job,
                    Err(_) => return,
                }
            };
            for line in appended(&file, &mut offset).await {
                if tx.send(Event::default().data(line)).await.is_err() {
                    return;
                }
            }
            if job.state.is_terminal() {
                let end = Event::default().event("end").data(serde_json::to_string(&job).unwrap_or_default());
                let _ = tx.send(end).await;
                return;
            }
            tokio::time::sleep(POLL).await;
        }
    });
    let events = tokio_stream::wrappers::ReceiverStream::new(rx);
    let events = tokio_stream::StreamExt::map(events, Ok::<Event, Infallible>);
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}

/// The whole lines appended to `file` since `offset`, which moves past them (the writer may be
/// midway through the last line). A file shorter than `offset` was cut back to a checkpoint by a
/// resumed run: what it still holds was sent, so reading goes on from its new end.
async fn appended(file: &std::path::Path, offset: &mut u64) -> Vec<String> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};

    let Ok(mut f) = tokio::fs::File::open(file).await else { return Vec::new() };
    let len = f.metadata().await.map(|m| m.len()).unwrap_or(0);
    if len < *offset {
        *offset = len;
    }
    let mut bytes = Vec::new();
    if f.seek(std::io::SeekFrom::Start(*offset)).await.is_err() || f.read_to_end(&mut bytes).await.is_err() {
        return Vec::new();
    }
    let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    *offset += whole as u64;
    String::from_utf8_lossy(&bytes[..whole]).lines().map(str::to_owned).collect()
}

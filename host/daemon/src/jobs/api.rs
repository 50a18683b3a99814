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
        let mut sent = 0usize;
        loop {
            // Read the state first: records written before a job ends are then all on disk.
            let job = {
                let jobs = jobs.clone();
                match blocking(move || jobs.get(id)).await {
                    Ok(job) => job,
                    Err(_) => return,
                }
            };
            let text = tokio::fs::read_to_string(&file).await.unwrap_or_default();
            // Only whole lines: the writer may be midway through one.
            let lines: Vec<&str> = text.split_inclusive('\n').filter(|l| l.ends_with('\n')).collect();
            if lines.len() < sent {
                sent = lines.len();
            }
            for line in &lines[sent..] {
                if tx.send(Event::default().data(line.trim_end())).await.is_err() {
                    return;
                }
            }
            sent = lines.len();
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

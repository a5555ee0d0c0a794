//! What a created (or replayed) job is answered with, and the answer to a failing store.

use lambda_http::http::{StatusCode, header};
use lambda_http::{Body, Response};
use longhaul_aws::api::{Problem, json_response};
use longhaul_aws::jobs::{JobRecord, StoreError};
use serde_json::json;

/// Seconds a client should wait before polling a job it just submitted.
pub const RETRY_AFTER_SECONDS: u64 = 2;
/// The response header that marks an answer as a replay of an earlier request's
/// (`Idempotent-Replayed: true`).
pub const IDEMPOTENT_REPLAYED: header::HeaderName =
    header::HeaderName::from_static("idempotent-replayed");

pub(crate) fn accepted(status: StatusCode, job: &JobRecord, replay: bool) -> Response<Body> {
    let location = format!("/jobs/{}", job.job_id);
    let mut body = json!({
        "job_id": job.job_id,
        "status": job.status,
        "status_url": location,
        "created_at": job.created_at,
    });
    if let Some(retry_of) = &job.retry_of {
        body["retry_of"] = retry_of.as_str().into();
    }
    let mut response = json_response(status, &body);
    let headers = response.headers_mut();
    headers.insert(header::LOCATION, location.parse().expect("job ids are header-safe"));
    headers.insert(header::RETRY_AFTER, RETRY_AFTER_SECONDS.into());
    headers.insert(header::CACHE_CONTROL, "no-store".parse().expect("static"));
    if replay {
        headers.insert(IDEMPOTENT_REPLAYED, header::HeaderValue::from_static("true"));
    }
    response
}

pub(crate) fn internal(err: StoreError) -> Problem {
    tracing::error!(error = %err, "job store failed");
    Problem::internal()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::job_in;
    use longhaul_domain::JobStatus;

    #[test]
    fn a_replay_answers_200_with_the_job_its_location_and_the_replayed_mark() {
        let job = job_in(JobStatus::Pending);
        let replay = accepted(StatusCode::OK, &job, true);
        assert_eq!(replay.status(), StatusCode::OK);
        let location = format!("/jobs/{}", job.job_id);
        assert_eq!(replay.headers()[header::LOCATION], location.as_str());
        assert_eq!(replay.headers()[IDEMPOTENT_REPLAYED], "true");
        let Body::Binary(bytes) = replay.body() else { panic!("a JSON body") };
        let body: serde_json::Value = serde_json::from_slice(bytes).unwrap();
        assert_eq!(body["job_id"], job.job_id.as_str());
        assert_eq!(body["status_url"], location.as_str());

        let first = accepted(StatusCode::ACCEPTED, &job, false);
        assert_eq!(first.status(), StatusCode::ACCEPTED);
        assert_eq!(first.headers()[header::LOCATION], location.as_str());
        assert!(first.headers().get(IDEMPOTENT_REPLAYED).is_none());
    }
}

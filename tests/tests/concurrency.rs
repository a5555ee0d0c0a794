//! 1,000 concurrent identical submissions create exactly one job, one SQS message and one
//! execution. In a test binary of its own, so the stack's AWS call meter counts only this.
//!
//! Each of the thousand behaves as a well-behaved client does: it sends the same request
//! again on `409` (a request with its key has not stored its job yet), `429` and `503` (the
//! local API, like API Gateway, answers `503` when the function outlives its timeout: on a
//! loaded machine the emulator, which takes one write at a time, makes some of them do), a
//! bounded number of times, never before `Retry-After` and backing off exponentially with
//! jitter (a timed-out invocation's DynamoDB call still runs to its end, so a thousand
//! clients coming back at once would keep the emulator's queue as long as it was). What is
//! asserted holds however fast the machine is.

use longhaul_domain::JobId;
use std::collections::BTreeMap;
use std::time::Duration;

use longhaul_tests::{Aws, Reply, assert_no_access_denied, harness, openapi, principal};
use serde_json::{Value, json};

/// How many times one client sends its request before the test gives up on it.
const ATTEMPTS: u32 = 20;
/// The first back-off; each further one doubles, up to [`BACKOFF_CAP`].
const BACKOFF_BASE: Duration = Duration::from_secs(1);
/// The longest back-off.
const BACKOFF_CAP: Duration = Duration::from_secs(60);
/// How long the job may sit without moving before the test gives up on it: a creator that
/// timed out between writing the job and enqueueing it leaves it to the reaper, which
/// re-enqueues a pending job after `LONGHAUL_PENDING_GRACE_SECONDS` (60) at its next run
/// (every minute).
const STILL_FOR: Duration = Duration::from_secs(180);

/// The answers one client got, in order; the last is a `200` or `202`.
struct Client {
    answers: Vec<Reply>,
}

/// The wait after the `attempt`-th (from 0) answer that asks to retry: exponential, capped,
/// with "equal jitter" (half of it fixed, the other half random) so that clients that were
/// answered together do not come back together.
fn backoff(attempt: u32) -> Duration {
    let full = BACKOFF_BASE.saturating_mul(1 << attempt.min(16)).min(BACKOFF_CAP);
    let half = full / 2;
    let random = uuid::Uuid::new_v4().as_u64_pair().0;
    half + Duration::from_millis(random % (half.as_millis() as u64 + 1))
}

/// `POST /jobs` with `body` as client `i` of the stampede: sent again on `409`, `429` and
/// `503` (after `Retry-After` when the answer has one, and after [`backoff`] in any case),
/// until it is answered `200` or `202`.
async fn submit_as_a_client(http: &reqwest::Client, token: &str, body: &Value, i: u32) -> Client {
    let url = format!("{}/jobs", harness().stack.api_url);
    let mut answers = Vec::new();
    for attempt in 0..ATTEMPTS {
        let response = http
            .post(&url)
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .expect("the local API answers");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.expect("a body");
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        let reply = Reply { status, headers, json, text };
        if status != 503 {
            // The gateway's own 503 is not the API's answer; every other one is documented.
            openapi::check("POST", "/jobs", &reply);
        }
        let asked = match status {
            200 | 202 => {
                answers.push(reply);
                return Client { answers };
            }
            409 | 429 => {
                let seconds = reply.header("retry-after").and_then(|v| v.parse().ok());
                Duration::from_secs(seconds.expect("a 409 or 429 says when to retry"))
            }
            503 => Duration::ZERO,
            other => panic!("client {i}: unexpected {other}: {}", reply.text),
        };
        answers.push(reply);
        tokio::time::sleep(asked.max(backoff(attempt))).await;
    }
    let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    panic!("client {i} was not answered in {ATTEMPTS} attempts: {statuses:?}");
}

#[tokio::test]
async fn a_thousand_identical_requests_make_one_job() {
    let who = principal("stampede");
    let api = longhaul_tests::Api::new(&who);
    let token = harness().stack.token(&who);
    let http = reqwest::Client::new();
    let before = api.get("/_local/aws-calls").await.json;
    let body = json!({"type": "demo", "params": {"items": 3}});
    let clients =
        futures::future::join_all((0..1000).map(|i| submit_as_a_client(&http, &token, &body, i)))
            .await;
    assert_no_access_denied();

    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    let mut job_ids = std::collections::BTreeSet::new();
    for answer in clients.iter().flat_map(|c| &c.answers) {
        *by_status.entry(answer.status).or_default() += 1;
        match answer.status {
            200 | 202 => {
                let job_id =
                    answer.json["job_id"].as_str().expect("a job_id").parse::<JobId>().unwrap();
                let location = format!("/jobs/{job_id}");
                assert_eq!(answer.header("location"), Some(location.as_str()));
                // A 202 created the job; every other answer naming it is a replay.
                let replayed = (answer.status == 200).then_some("true");
                assert_eq!(answer.header("idempotent-replayed"), replayed, "{}", answer.text);
                job_ids.insert(job_id);
            }
            409 => assert_eq!(answer.json["type"], "/problems/request-in-flight"),
            _ => {}
        }
    }
    eprintln!("1,000 clients, answers: {by_status:?}");
    // The request that created the job may be one the gateway gave up on (503), and then no
    // client saw a 202; never more than one.
    assert!(by_status.get(&202).copied().unwrap_or(0) <= 1, "one creator: {by_status:?}");
    assert_eq!(job_ids.len(), 1, "every answer names the same job: {job_ids:?}");
    let job_id = job_ids.into_iter().next().expect("one job");
    assert_eq!(api.wait_terminal(&job_id, STILL_FOR).await["status"], "succeeded");

    let items = Aws::new().await.items_of(&who).await;
    let jobs = items.iter().filter(|i| i["sk"].as_s().unwrap() == "JOB").count();
    assert_eq!(jobs, 1, "one job record");
    let after = api.get("/_local/aws-calls").await.json;
    let delta = |key: &str| after[key].as_u64().unwrap_or(0) - before[key].as_u64().unwrap_or(0);
    let calls: BTreeMap<&String, u64> = after
        .as_object()
        .expect("counts by call")
        .keys()
        .map(|key| (key, delta(key)))
        .filter(|(_, n)| *n > 0)
        .collect();
    // Started once: by the request that wrote it, or by one message when that start failed
    // part-way under the stampede (its `Invoke` again, if that was the step that failed); its
    // direct run taken over by an execution at most once (when every try of that invocation
    // failed under the stampede).
    assert!(delta("sqs:SendMessage") <= 1, "at most one message: {calls:?}");
    let invokes = delta("lambda:Invoke");
    assert!(invokes == 1 || invokes == 2 && delta("sqs:SendMessage") == 1, "{calls:?}");
    assert!(delta("states:StartExecution") <= 1, "at most one execution: {calls:?}");
}

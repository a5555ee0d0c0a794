//! 1,000 concurrent identical submissions create exactly one job, one SQS message and one
//! execution. In a test binary of its own, so the stack's AWS call meter counts only this.

use std::collections::BTreeMap;
use std::time::Duration;

use longhaul_tests::{Api, Aws, principal};
use serde_json::json;

#[tokio::test]
async fn a_thousand_identical_requests_make_one_job() {
    let who = principal("stampede");
    let api = Api::new(&who);
    let before = api.get("/_local/aws-calls").await.json;
    let body = json!({"type": "demo", "params": {"items": 3}});
    let replies = futures::future::join_all((0..1000).map(|_| api.post_json("/jobs", &body))).await;

    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    let mut job_ids = std::collections::BTreeSet::new();
    for reply in &replies {
        *by_status.entry(reply.status).or_default() += 1;
        match reply.status {
            202 | 200 => {
                job_ids.insert(reply.json["job_id"].as_str().unwrap().to_owned());
            }
            409 => assert!(reply.header("retry-after").is_some()),
            other => panic!("unexpected {other}: {}", reply.text),
        }
    }
    assert_eq!(by_status.get(&202), Some(&1), "exactly one request created the job: {by_status:?}");
    assert_eq!(job_ids.len(), 1, "every answer names the same job: {job_ids:?}");
    let job_id = job_ids.into_iter().next().unwrap();
    assert_eq!(api.wait_terminal(&job_id, Duration::from_secs(90)).await["status"], "succeeded");

    let items = Aws::new().await.items_of(&who).await;
    let jobs = items.iter().filter(|i| i["sk"].as_s().unwrap() == "JOB").count();
    assert_eq!(jobs, 1, "one job record");
    let after = api.get("/_local/aws-calls").await.json;
    let delta = |key: &str| after[key].as_u64().unwrap_or(0) - before[key].as_u64().unwrap_or(0);
    assert_eq!(delta("sqs:SendMessage"), 1, "one message");
    assert_eq!(delta("states:StartExecution"), 1, "one execution");
}

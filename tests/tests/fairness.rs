//! Running-job limits, fairness and priority, against the local stack with a tenant limit of
//! 2: a tenant's jobs beyond its limit wait (pending, no execution, `waiting` shown) and start
//! as its slots free, in priority order; another tenant is not held up by that backlog; a
//! kind's limit is shared fairly, tenants taking turns whatever their priorities; a slot is
//! given back however a job ends, and the reaper reconciles one that leaked.

use longhaul_domain::Owner;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{DateTime, Utc};
use longhaul_aws::slots::Pool;
use longhaul_tests::kinds::{KindName, Sleeper};
use longhaul_tests::{Api, Aws, Harness, fire, harness_with_registry, principal};
use longhaul_worker::Registry;
use serde_json::{Value, json};

const LIMIT: usize = 2;

fn stack() -> &'static Harness {
    harness_with_registry(
        Registry::builder()
            .kinds_of(&longhaul_jobs::registry())
            .kind(
                Sleeper::<OneAtATime>::new().longest(Duration::from_secs(600)).concurrency_limit(1),
            )
            .build()
            .expect("one_at_a_time's name is its own"),
        &[("LONGHAUL_TENANT_MAX_RUNNING", "2"), ("ENABLED_JOB_TYPES", "demo,one_at_a_time")],
    )
}

/// `one_at_a_time`: a kind for a downstream that takes one job at a time, whoever submits it
/// (its policy's `concurrency_limit` is 1, so all tenants' jobs of it share one kind pool). Its
/// one stage works `millis`; `n` only makes one request differ from the next.
struct OneAtATime;

impl KindName for OneAtATime {
    const NAME: &'static str = "one_at_a_time";
}

/// A demo job of about `seconds` s; `n` makes it a different request (derived idempotency
/// keys would make identical submissions one job).
fn job_n(seconds: u64, n: u64) -> Value {
    json!({"type": "demo", "params": {"items": seconds * 10 + n, "item_ms": 100}})
}

fn job(seconds: u64) -> Value {
    job_n(seconds, 0)
}

fn at(job: &Value, field: &str) -> DateTime<Utc> {
    let text = job[field].as_str().unwrap_or_else(|| panic!("{field} of {job}"));
    DateTime::parse_from_rfc3339(text).unwrap().to_utc()
}

/// The jobs holding a slot of `owner`'s pool, straight from the table.
async fn holders(aws: &Aws, owner: &Owner) -> Vec<String> {
    let item = aws
        .dynamodb
        .get_item()
        .table_name(stack().stack.resource("JobsTable"))
        .key("pk", AttributeValue::S(Pool::Tenant(owner.to_owned()).holders_pk()))
        .key("sk", AttributeValue::S("HOLDERS".into()))
        .consistent_read(true)
        .send()
        .await
        .expect("read holders")
        .item;
    item.and_then(|mut i| i.remove("holders"))
        .and_then(|v| v.as_ss().ok().cloned())
        .unwrap_or_default()
}

/// Waits until no job of `owner` holds a slot (slots are given back by the stream consumer,
/// a moment after the job's end).
async fn no_slots_held(aws: &Aws, owner: &Owner) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let held = holders(aws, owner).await;
        if held.is_empty() {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{owner}'s slots still held: {held:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The most of `jobs` running at one time, from their start and end times.
fn max_overlap(jobs: &[Value]) -> usize {
    jobs.iter()
        .map(|j| {
            let t = at(j, "started_at");
            jobs.iter().filter(|o| at(o, "started_at") <= t && t < at(o, "finished_at")).count()
        })
        .max()
        .unwrap_or(0)
}

#[tokio::test]
async fn a_noisy_tenant_runs_at_its_limit_and_never_delays_another() {
    stack();
    let aws = Aws::new().await;
    let (noisy, quiet) = (principal("noisy"), principal("quiet"));
    let (noisy_api, quiet_api) = (Api::new(&noisy), Api::new(&quiet));
    let mut noisy_jobs = Vec::new();
    for i in 0..10 {
        let body = job_n(5, i as u64);
        noisy_jobs.push(noisy_api.submit(&body).await);
    }
    // The last one waits, and says why.
    let waiting = noisy_api
        .wait_for(&noisy_jobs[9], "waiting", |j| j["waiting"]["reason"] == "tenant_limit")
        .await;
    assert_eq!(waiting["status"], "pending", "{waiting}");
    assert_eq!(waiting["waiting"]["limit"], LIMIT, "{waiting}");
    assert!(waiting["waiting"]["message"].as_str().unwrap().contains("limit"), "{waiting}");

    let mut quiet_jobs = Vec::new();
    for i in 0..2 {
        let body = job_n(1, i as u64);
        quiet_jobs.push(quiet_api.submit(&body).await);
    }
    let mut most_held = 0;
    let mut quiet_done = Vec::new();
    for id in &quiet_jobs {
        most_held = most_held.max(holders(&aws, &noisy).await.len());
        let done = quiet_api.wait_terminal(id, Duration::from_secs(120)).await;
        assert_eq!(done["status"], "succeeded", "{done}");
        quiet_done.push(done);
    }
    let mut noisy_done = Vec::new();
    for id in &noisy_jobs {
        most_held = most_held.max(holders(&aws, &noisy).await.len());
        let done = noisy_api.wait_terminal(id, Duration::from_secs(300)).await;
        assert_eq!(done["status"], "succeeded", "{done}");
        assert!(done.get("waiting").is_none(), "a finished job waits for nothing: {done}");
        noisy_done.push(done);
    }
    assert!(most_held <= LIMIT, "the noisy tenant held {most_held} slots");
    assert_eq!(max_overlap(&noisy_done), LIMIT, "the noisy tenant ran more (or less) than 2");
    // The quiet tenant's jobs started within seconds, long before the backlog was through.
    let last_noisy_start = noisy_done.iter().map(|j| at(j, "started_at")).max().unwrap();
    for done in &quiet_done {
        let wait = at(done, "started_at") - at(done, "created_at");
        assert!(wait < chrono::Duration::seconds(15), "quiet job waited {wait}: {done}");
        assert!(at(done, "started_at") < last_noisy_start, "quiet job ran after the backlog");
    }
    no_slots_held(&aws, &noisy).await;
    no_slots_held(&aws, &quiet).await;
}

#[tokio::test]
async fn a_high_priority_job_takes_the_next_free_slot() {
    stack();
    let owner = principal("priority");
    let api = Api::new(&owner);
    let mut running = Vec::new();
    for i in 0..LIMIT {
        let body = job_n(6, i as u64);
        running.push(api.submit(&body).await);
    }
    let mut normal = Vec::new();
    for i in 0..6 {
        let body = job_n(1, i as u64);
        let id = api.submit(&body).await;
        api.wait_for(&id, "waiting", |j| j["waiting"].is_object()).await;
        normal.push(id);
    }
    let mut body = job(1);
    body["priority"] = json!("high");
    let high = api.submit(&body).await;
    let shown = api.wait_for(&high, "waiting", |j| j["waiting"].is_object()).await;
    assert_eq!(shown["priority"], "high", "{shown}");

    let high = api.wait_terminal(&high, Duration::from_secs(120)).await;
    assert_eq!(high["status"], "succeeded", "{high}");
    for id in &normal {
        let done = api.wait_terminal(id, Duration::from_secs(180)).await;
        assert_eq!(done["status"], "succeeded", "{done}");
        assert_eq!(done["priority"], "normal");
        assert!(
            at(&high, "started_at") < at(&done, "started_at"),
            "a normal job waiting before the high one started first: {done} / {high}"
        );
    }
    for id in &running {
        api.wait_terminal(id, Duration::from_secs(60)).await;
    }
}

/// A kind's limit is shared by tenants in turn: a tenant that submits its backlog as `high`
/// does not take every slot the kind frees ahead of another tenant's jobs submitted after it
/// (priority orders only a tenant's own jobs); the other tenant's jobs run interleaved with
/// the backlog, one of each in turn.
#[tokio::test]
async fn a_kind_pool_takes_tenants_in_turn_whatever_their_priorities() {
    stack();
    let (backlog, other) = (principal("kind-backlog"), principal("kind-other"));
    let (backlog_api, other_api) = (Api::new(&backlog), Api::new(&other));
    let body = |n: u64, priority: &str, millis: u64| json!({"type": "one_at_a_time", "params": {"millis": millis, "n": n}, "priority": priority});
    // The kind's one slot is held by a blocker until both tenants' jobs wait, however slow
    // the machine: it works up to ten minutes and is cancelled once they do.
    let blocker = backlog_api.submit(&body(99, "high", 600_000)).await;
    backlog_api.wait_for(&blocker, "running", |j| j["status"] == "running").await;
    let mut backlog_jobs = Vec::new();
    for n in 0..5 {
        backlog_jobs.push(backlog_api.submit(&body(n, "high", 3000)).await);
    }
    backlog_api
        .wait_for(&backlog_jobs[4], "waiting", |j| j["waiting"]["reason"] == "kind_limit")
        .await;
    let mut other_jobs = Vec::new();
    for n in 0..3 {
        other_jobs.push(other_api.submit(&body(100 + n, "normal", 3000)).await);
    }
    other_api.wait_for(&other_jobs[2], "waiting", |j| j["waiting"]["reason"] == "kind_limit").await;
    let cancel = backlog_api.send("DELETE", &format!("/jobs/{blocker}"), None, &[]).await;
    assert_eq!(cancel.status, 202, "{}", cancel.text);
    let mut started = Vec::new();
    for (api, ids, who) in
        [(&backlog_api, &backlog_jobs, "backlog"), (&other_api, &other_jobs, "other")]
    {
        for id in ids {
            let done = api.wait_terminal(id, Duration::from_secs(240)).await;
            assert_eq!(done["status"], "succeeded", "{done}");
            started.push((at(&done, "started_at"), who));
        }
    }
    started.sort();
    let order: Vec<&str> = started.iter().map(|(_, who)| *who).collect();
    assert!(
        order.windows(2).all(|w| w[0] != w[1] || w[0] == "backlog"),
        "two of the other tenant's jobs ran back to back: {order:?}"
    );
    // Turns: one of each, the backlog's tenant first (it waited first). Without turns all five
    // `high` jobs would start before the other tenant's first.
    let mut backlog_before = 0;
    let mut seen = 0;
    for who in &order {
        if *who == "backlog" {
            backlog_before += 1;
            continue;
        }
        assert!(
            backlog_before <= seen + 3,
            "the backlog ran {backlog_before} jobs before the other tenant's job {}: {order:?}",
            seen + 1
        );
        seen += 1;
    }
    assert_eq!(order.len(), 8);
}

#[tokio::test]
async fn cancelling_a_waiting_job_ends_it_and_frees_every_slot() {
    stack();
    let aws = Aws::new().await;
    let owner = principal("canceller");
    let api = Api::new(&owner);
    let mut running = Vec::new();
    for i in 0..LIMIT {
        let body = job_n(60, i as u64);
        running.push(api.submit(&body).await);
    }
    let body = job_n(1, 7);
    let waiting = api.submit(&body).await;
    api.wait_for(&waiting, "waiting", |j| j["waiting"].is_object()).await;

    let reply = api.send("DELETE", &format!("/jobs/{waiting}"), None, &[]).await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    let done = api.wait_terminal(&waiting, Duration::from_secs(30)).await;
    assert_eq!(done["status"], "cancelled", "{done}");
    assert!(done["started_at"].is_null(), "a waiting job never ran: {done}");
    // Cancel the running ones too: every slot comes back, the waiting list is empty.
    for id in &running {
        api.wait_for(id, "running", |j| j["status"] == "running").await;
        let reply = api.send("DELETE", &format!("/jobs/{id}"), None, &[]).await;
        assert_eq!(reply.status, 202, "{}", reply.text);
        let done = api.wait_terminal(id, Duration::from_secs(60)).await;
        assert_eq!(done["status"], "cancelled", "{done}");
    }
    no_slots_held(&aws, &owner).await;
    let listed = waiting_list(&aws, &owner).await;
    assert_eq!(listed.len(), 0, "left in the waiting list: {listed:?}");
}

#[tokio::test]
async fn the_reaper_gives_back_slots_of_jobs_that_ended_and_starts_who_waits() {
    stack();
    let aws = Aws::new().await;
    let owner = principal("leaked");
    let api = Api::new(&owner);
    // Two slots held by jobs that no longer exist (a stream record lost, say), their ids made
    // in 2023 (a UUIDv7 carries its time): past the grace a slot taken before its job's write
    // gets (`UNWRITTEN_HOLDER_GRACE`).
    let gone = ["018bcfe5-6800-7000-8000-000000000001", "018bcfe5-6800-7000-8000-000000000002"]
        .map(str::to_owned);
    aws.dynamodb
        .put_item()
        .table_name(stack().stack.resource("JobsTable"))
        .item("pk", AttributeValue::S(Pool::Tenant(owner.clone()).holders_pk()))
        .item("sk", AttributeValue::S("HOLDERS".into()))
        .item("holders", AttributeValue::Ss(gone.to_vec()))
        .send()
        .await
        .unwrap();
    let id = api.submit(&job(1)).await;
    api.wait_for(&id, "waiting", |j| j["waiting"]["reason"] == "tenant_limit").await;

    let report = fire("reaper").await;
    assert!(report["output"]["slots_reclaimed"].as_u64().unwrap() >= 2, "{report}");
    assert!(report["output"]["admitted"].as_u64().unwrap() >= 1, "{report}");
    let done = api.wait_terminal(&id, Duration::from_secs(60)).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    no_slots_held(&aws, &owner).await;
}

/// The owner's waiting list, straight from the table: (job id, item).
async fn waiting_list(
    aws: &Aws,
    owner: &Owner,
) -> Vec<(String, std::collections::HashMap<String, AttributeValue>)> {
    let listed = aws
        .dynamodb
        .query()
        .table_name(stack().stack.resource("JobsTable"))
        .key_condition_expression("pk = :pk")
        .expression_attribute_values(
            ":pk",
            AttributeValue::S(Pool::Tenant(owner.clone()).waiting_pk()),
        )
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    listed
        .items()
        .iter()
        .map(|item| (item["job_id"].as_s().unwrap().clone(), item.clone()))
        .collect()
}

/// The reaper checks waiting jobs against their waiting lists without touching those that are
/// in them (at volume, a read and a write per waiting job per run would cost more than the
/// jobs), and puts back one that went missing.
#[tokio::test]
async fn the_reaper_puts_back_a_lost_waiting_list_entry_and_leaves_the_others_alone() {
    stack();
    let aws = Aws::new().await;
    let owner = principal("relisted");
    let api = Api::new(&owner);
    let mut ids = Vec::new();
    for i in 0..LIMIT {
        ids.push(api.submit(&job_n(60, 20 + i as u64)).await);
    }
    let (kept, lost) = (api.submit(&job_n(1, 31)).await, api.submit(&job_n(1, 32)).await);
    for id in [&kept, &lost] {
        api.wait_for(id, "waiting", |j| j["waiting"].is_object()).await;
    }
    let table = stack().stack.resource("JobsTable");
    for (job_id, item) in waiting_list(&aws, &owner).await {
        let key = [("pk", item["pk"].clone()), ("sk", item["sk"].clone())];
        if job_id == kept.as_str() {
            // Marked: a rewrite of the entry would drop the mark.
            let mut update = aws.dynamodb.update_item().table_name(&table);
            for (name, value) in key {
                update = update.key(name, value);
            }
            update
                .update_expression("SET mark = :m")
                .expression_attribute_values(":m", AttributeValue::S("untouched".into()))
                .send()
                .await
                .unwrap();
        } else if job_id == lost.as_str() {
            let mut delete = aws.dynamodb.delete_item().table_name(&table);
            for (name, value) in key {
                delete = delete.key(name, value);
            }
            delete.send().await.unwrap();
        }
    }

    // (Another test's reaper run may be the one that puts it back: the outcome is checked.)
    fire("reaper").await;
    let listed = waiting_list(&aws, &owner).await;
    let entry = |id: &str| listed.iter().find(|(job_id, _)| job_id == id).map(|(_, item)| item);
    assert!(entry(&lost).is_some(), "the lost entry is back: {listed:?}");
    let kept_entry = entry(&kept).expect("the kept entry is still listed");
    assert_eq!(
        kept_entry.get("mark").and_then(|m| m.as_s().ok()).map(String::as_str),
        Some("untouched")
    );

    for id in ids.iter().chain([&kept, &lost]) {
        api.send("DELETE", &format!("/jobs/{id}"), None, &[]).await;
    }
    for id in ids.iter().chain([&kept, &lost]) {
        api.wait_terminal(id, Duration::from_secs(60)).await;
    }
    no_slots_held(&aws, &owner).await;
}

#[tokio::test]
async fn an_unknown_priority_is_422_and_writes_nothing() {
    stack();
    let aws = Aws::new().await;
    let owner = principal("bad-priority");
    let api = Api::new(&owner);
    for priority in [json!("urgent"), json!(1), json!(null), json!("HIGH")] {
        let mut body = job(1);
        body["priority"] = priority.clone();
        let reply = api.post_json("/jobs", &body).await;
        if priority.is_null() {
            // JSON null is "not given": the default.
            assert_eq!(reply.status, 202, "{}", reply.text);
            continue;
        }
        assert_eq!(reply.status, 422, "{priority}: {}", reply.text);
        assert_eq!(reply.json["type"], "/problems/invalid-priority", "{}", reply.text);
    }
    assert_eq!(
        aws.items_of(&owner).await.iter().filter(|i| i["sk"].as_s().unwrap() == "JOB").count(),
        1
    );
}

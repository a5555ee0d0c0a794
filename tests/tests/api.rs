//! The job API's HTTP contract against the local stack. Every response these tests receive is
//! also checked against docs/openapi.json by the harness.

use longhaul_domain::JobId;
use std::collections::BTreeSet;
use std::time::Duration;

use longhaul_job_demo::DemoResult;
use longhaul_tests::{Api, Aws, assert_counted_once, harness, metric_points, openapi, principal};
use serde_json::{Value, json};

const JOB_TIMEOUT: Duration = Duration::from_secs(90);

fn demo(items: u64) -> Value {
    json!({"type": "demo", "params": {"items": items}})
}

fn fatal_demo() -> Value {
    json!({"type": "demo", "params": {"items": 2, "fail_at": 0, "fail_kind": "fatal"}})
}

#[tokio::test]
async fn the_api_description_documents_exactly_the_template_routes() {
    let stack = &harness().stack;
    let functions = longhaul_local::model::functions(&stack.template).unwrap();
    let routes: BTreeSet<String> = functions
        .iter()
        .flat_map(|f| f.events.iter())
        .filter_map(|e| match e {
            longhaul_local::model::EventSpec::Http { method, path, .. } if method != "ANY" => {
                Some(format!("{method} {path}"))
            }
            _ => None,
        })
        .collect();
    let documented: BTreeSet<String> = openapi::DOCUMENT["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .filter(|m| *m != "parameters")
                .map(move |m| format!("{} {path}", m.to_uppercase()))
        })
        .collect();
    assert_eq!(routes, documented);

    let served = Api::anonymous().get("/openapi.json").await;
    assert_eq!(served.status, 200, "the description is public");
    assert_eq!(served.json, *openapi::DOCUMENT);
}

#[tokio::test]
async fn idempotency_key_replays_conflicts_and_reuse_after_failure() {
    let api = Api::new(&principal("idem"));
    let key = [("idempotency-key", "order-42")];
    let body = demo(2).to_string().into_bytes();
    let first = api.send("POST", "/jobs", Some(("application/json", body.clone())), &key).await;
    assert_eq!(first.status, 202, "{}", first.text);
    let job_id = first.json["job_id"].as_str().unwrap().to_owned();

    let replay = api.send("POST", "/jobs", Some(("application/json", body.clone())), &key).await;
    assert_eq!(replay.status, 200, "{}", replay.text);
    assert_eq!(replay.json["job_id"], job_id.as_str());
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.header("location"), Some(format!("/jobs/{job_id}").as_str()));

    let different = api
        .send("POST", "/jobs", Some(("application/json", demo(3).to_string().into_bytes())), &key)
        .await;
    assert_eq!(different.status, 422);
    assert_eq!(different.json["type"], "/problems/idempotency-key-reused");

    // The same key in another tenant is another key.
    let other = Api::new(&principal("idem-other"));
    let theirs = other.send("POST", "/jobs", Some(("application/json", body.clone())), &key).await;
    assert_eq!(theirs.status, 202);
    assert_ne!(theirs.json["job_id"], job_id.as_str());

    // Without a header, the key is derived from the request: a double submit is one job.
    let derived = api.submit(&demo(5)).await;
    let again = api.post_json("/jobs", &demo(5)).await;
    assert_eq!((again.status, again.json["job_id"].as_str()), (200, Some(derived.as_str())));
}

/// A replay sent right after the `202` — the job still `pending`, perhaps not even enqueued
/// yet — answers `200` with the same job, its `Location` and `Idempotent-Replayed: true`: the
/// first request has answered, so it is not "in flight" (`409` is only for a key whose job is
/// not written yet). With a client's key and with a derived one.
#[tokio::test]
async fn a_replay_right_after_the_202_answers_200_with_the_job() {
    let who = principal("replay-at-once");
    let api = Api::new(&who);
    let body = ("application/json", demo(1).to_string().into_bytes());
    for key in [&[("idempotency-key", "at-once")][..], &[]] {
        let first = api.send("POST", "/jobs", Some(body.clone()), key).await;
        assert_eq!(first.status, 202, "{}", first.text);
        let job_id = first.json["job_id"].as_str().unwrap().to_owned();
        let location = format!("/jobs/{job_id}");
        assert_eq!(first.header("location"), Some(location.as_str()));
        assert_eq!(first.header("idempotent-replayed"), None);

        for _ in 0..3 {
            let replay = api.send("POST", "/jobs", Some(body.clone()), key).await;
            assert_eq!(replay.status, 200, "{key:?}: {}", replay.text);
            assert_eq!(replay.json["job_id"], job_id.as_str());
            assert_eq!(replay.header("location"), Some(location.as_str()));
            assert_eq!(replay.header("idempotent-replayed"), Some("true"));
        }
    }
    let items = Aws::new().await.items_of(&who).await;
    let jobs = items.iter().filter(|i| i["sk"].as_s().unwrap() == "JOB").count();
    assert_eq!(jobs, 2, "one job per key, none for the replays");
}

#[tokio::test]
async fn a_key_whose_job_failed_starts_a_new_job() {
    let api = Api::new(&principal("reuse"));
    let key = [("idempotency-key", "nightly-export")];
    let body = fatal_demo().to_string().into_bytes();
    let first = api.send("POST", "/jobs", Some(("application/json", body.clone())), &key).await;
    let failed_id = first.json["job_id"].as_str().unwrap().parse::<JobId>().unwrap();
    assert_eq!(api.wait_terminal(&failed_id, JOB_TIMEOUT).await["status"], "failed");
    assert_counted_once("JobsFailed", &failed_id).await;
    let second = api.send("POST", "/jobs", Some(("application/json", body)), &key).await;
    assert_eq!(second.status, 202, "{}", second.text);
    assert_ne!(second.json["job_id"], failed_id.as_str());
}

#[tokio::test]
async fn listing_is_newest_first_paged_and_filtered() {
    let api = Api::new(&principal("lister"));
    let mut ids = Vec::new();
    for items in 1..=3 {
        ids.push(api.submit(&demo(items)).await);
    }
    let failed = api.submit(&fatal_demo()).await;
    for id in &ids {
        assert_eq!(api.wait_terminal(id, JOB_TIMEOUT).await["status"], "succeeded");
    }
    assert_eq!(api.wait_terminal(&failed, JOB_TIMEOUT).await["status"], "failed");

    let page = api.get("/jobs?limit=2").await;
    assert_eq!(page.status, 200, "{}", page.text);
    let got: Vec<&str> = page.json["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["job_id"].as_str().unwrap())
        .collect();
    assert_eq!(got, [failed.as_str(), ids[2].as_str()], "newest first");
    let cursor = page.json["next_cursor"].as_str().expect("more pages").to_owned();
    let next = api.get(&format!("/jobs?limit=2&cursor={cursor}")).await;
    let got: Vec<&str> = next.json["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["job_id"].as_str().unwrap())
        .collect();
    assert_eq!(got, [ids[1].as_str(), ids[0].as_str()]);

    let succeeded = api.get("/jobs?status=succeeded&type=demo&limit=100").await;
    assert_eq!(succeeded.json["jobs"].as_array().unwrap().len(), 3);
    assert!(succeeded.json["next_cursor"].is_null());
    let none = api.get("/jobs?type=csv_report").await;
    assert_eq!(none.json["jobs"], json!([]));

    // Someone else sees none of them, and cannot use this caller's cursor to see them.
    let stranger = Api::new(&principal("lister-stranger"));
    assert_eq!(stranger.get("/jobs").await.json["jobs"], json!([]));
    let borrowed = stranger.get(&format!("/jobs?cursor={cursor}")).await;
    assert!(borrowed.status == 400 || borrowed.json["jobs"] == json!([]), "{}", borrowed.text);

    for bad in [
        "limit=0",
        "limit=101",
        "limit=ten",
        "status=RUNNING",
        "cursor=%%%",
        "cursor=e30",
        "sort=asc",
    ] {
        let reply = api.get(&format!("/jobs?{bad}")).await;
        assert_eq!(reply.status, 400, "{bad}: {}", reply.text);
    }
}

#[tokio::test]
async fn cancelling_a_job_before_it_runs_ends_it_at_once() {
    let owner = principal("canceller");
    let api = Api::new(&owner);
    // A job that starts in a minute: pending when cancelled, however slow this machine is (a
    // job not delayed is started by its submission, and may be running by its 202).
    let job_id = api
        .submit(
            &json!({"type": "demo", "params": {"items": 50, "item_ms": 100}, "delay_seconds": 60}),
        )
        .await;
    let reply = api
        .send(
            "DELETE",
            &format!("/jobs/{job_id}"),
            Some(("application/json", br#"{"reason": "wrong input"}"#.to_vec())),
            &[],
        )
        .await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    assert_eq!(reply.json["cancellation"]["requested_by"], owner.as_str());
    assert_eq!(reply.json["cancellation"]["reason"], "wrong input");
    assert_eq!(reply.json["status"], "cancelled");
    let job = api.get(&format!("/jobs/{job_id}")).await.json;
    assert_eq!(job["status"], "cancelled");
    let last = job["transitions"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["state"], "cancelled");
    assert_eq!(last["reason"], format!("cancelled by {owner}: wrong input"));
    // It never runs: a dispatch, if one came, does not queue it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let job = api.get(&format!("/jobs/{job_id}")).await.json;
    assert_eq!(
        (job["status"].as_str(), job["attempt"].as_u64()),
        (Some("cancelled"), Some(0)),
        "{job}"
    );
    assert_counted_once("JobsCancelled", &job_id).await;
    assert_eq!(metric_points("JobDuration", &job_id, 1).await.len(), 1, "one duration per end");
    // Cancelling again, or retrying the cancellation of a terminal job, is a conflict.
    let again = api.send("POST", &format!("/jobs/{job_id}/cancel"), None, &[]).await;
    assert_eq!(again.status, 409);
    assert_eq!(again.json["status_now"], "cancelled");
}

#[tokio::test]
async fn cancelling_a_running_job_stops_its_stage_and_removes_partial_results() {
    let owner = principal("coop");
    let api = Api::new(&owner);
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 400, "item_ms": 20}})).await;
    api.wait_for(&job_id, "running", |job| {
        job["status"] == "running" && job["progress"]["items_done"].as_u64().unwrap_or(0) > 5
    })
    .await;
    let reply = api
        .send(
            "POST",
            &format!("/jobs/{job_id}/cancel"),
            Some(("application/json", br#"{"reason": "changed my mind"}"#.to_vec())),
            &[],
        )
        .await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    assert_eq!(reply.json["status"], "running", "a running job is cancelled cooperatively");
    // Asking twice is harmless.
    assert_eq!(api.send("DELETE", &format!("/jobs/{job_id}"), None, &[]).await.status, 202);

    let job = api.wait_terminal(&job_id, JOB_TIMEOUT).await;
    assert_eq!(job["status"], "cancelled", "{job}");
    let last = job["transitions"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["reason"], format!("cancelled by {owner}: changed my mind"));
    assert!(job["progress"]["items_done"].as_u64().unwrap() < 400, "it stopped early: {job}");
    assert_counted_once("JobsCancelled", &job_id).await;
    assert!(
        Aws::new().await.keys(&format!("results/{job_id}/")).await.is_empty(),
        "no partial result remains"
    );
    let result = api.get(&format!("/jobs/{job_id}/result")).await;
    assert_eq!((result.status, result.json["status_now"].as_str()), (409, Some("cancelled")));
    let after = api.send("DELETE", &format!("/jobs/{job_id}"), None, &[]).await;
    assert_eq!(after.status, 409, "{}", after.text);
}

#[tokio::test]
async fn results_redirect_when_ready_conflict_before_and_are_gone_after_expiry() {
    let api = Api::new(&principal("results"));
    // Long enough (3 s) to be asked for its result before it ends, on a busy machine too.
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 100, "item_ms": 30}})).await;
    let early = api.get(&format!("/jobs/{job_id}/result")).await;
    assert_eq!(early.status, 409, "{}", early.text);
    assert!(early.json["status_now"].is_string());

    assert_eq!(api.wait_terminal(&job_id, JOB_TIMEOUT).await["status"], "succeeded");
    // The demo's result is small: kept in the job's record, and linked to by a path of the
    // API that needs no bearer token (the link's own), served sandboxed.
    let reply = api.get(&format!("/jobs/{job_id}/result")).await;
    assert_eq!(reply.status, 303, "{}", reply.text);
    let location = reply.header("location").expect("Location").to_owned();
    assert!(location.starts_with("result/"), "relative to the request: {location}");
    assert!(Aws::new().await.keys(&format!("results/{job_id}/")).await.is_empty(), "no object");
    let link = api.result_link(&job_id).await;
    let download = reqwest::get(&link).await.unwrap();
    assert_eq!(download.status(), 200);
    let header = |name: &str| download.headers()[name].to_str().unwrap().to_owned();
    assert_eq!(header("content-type"), "application/json");
    assert_eq!(header("x-content-type-options"), "nosniff");
    assert!(header("content-security-policy").starts_with("sandbox"));
    let result: DemoResult = serde_json::from_slice(&download.bytes().await.unwrap()).unwrap();
    assert_eq!(result, DemoResult::expected(100));
    // Its token is the job's: on another job's path, or altered, it opens nothing.
    let other = api.submit(&json!({"type": "demo", "params": {"items": 1, "item_ms": 1}})).await;
    for wrong in [link.replace(job_id.as_str(), other.as_str()), format!("{link}x")] {
        let refused = reqwest::get(&wrong).await.unwrap();
        assert_eq!(refused.status(), 401, "{wrong}");
    }

    // Once the expirer has marked the job expired (written directly here: the expirer is
    // not part of this API), the result is gone for good.
    let aws = Aws::new().await;
    aws.mark_expired(&job_id).await;
    let gone = api.get(&format!("/jobs/{job_id}/result")).await;
    assert_eq!(gone.status, 410, "{}", gone.text);
    assert_eq!(reqwest::get(&link).await.unwrap().status(), 410, "the link it handed out too");
    // And the job no longer links to it: an expired job has no result_url.
    let expired = api.get(&format!("/jobs/{job_id}")).await.json;
    assert_eq!(expired["status"], "expired", "{expired}");
    assert!(expired.get("result_url").is_none(), "an expired job links no result: {expired}");
    assert_eq!(expired["progress"]["pct"], 100.0, "it did finish: {expired}");
}

#[tokio::test]
async fn resubmitting_a_request_whose_job_expired_starts_a_new_job_unless_the_key_was_sent() {
    let api = Api::new(&principal("expired-replay"));
    let body = json!({"type": "demo", "params": {"items": 2, "item_ms": 1}});
    const KEY: &[(&str, &str)] = &[("idempotency-key", "nightly")];
    let send = |headers: &'static [(&'static str, &'static str)]| {
        let api = &api;
        let body = body.to_string().into_bytes();
        async move { api.send("POST", "/jobs", Some(("application/json", body)), headers).await }
    };
    let derived = send(&[]).await.json["job_id"].as_str().unwrap().parse::<JobId>().unwrap();
    let keyed = send(KEY).await.json["job_id"].as_str().unwrap().parse::<JobId>().unwrap();
    let aws = Aws::new().await;
    for id in [&derived, &keyed] {
        assert_eq!(api.wait_terminal(id, JOB_TIMEOUT).await["status"], "succeeded");
        aws.mark_expired(id).await;
    }
    // The same request again: with a derived key, the old job's result is gone, so it runs
    // again (202, a new job); with the client's own key, that key still names its job (200).
    let again = send(&[]).await;
    assert_eq!(again.status, 202, "{}", again.text);
    assert_ne!(again.json["job_id"], derived.as_str());
    let replay = send(KEY).await;
    assert_eq!(replay.status, 200, "{}", replay.text);
    assert_eq!(replay.json["job_id"], keyed.as_str());
}

#[tokio::test]
async fn uploads_are_presigned_under_the_callers_own_prefix() {
    let who = principal("uploader");
    let api = Api::new(&who);
    let csv = "region,amount\neu,3\n";
    let reply = api
        .post_json(
            "/uploads",
            &json!({"filename": "sales.csv", "content_type": "text/csv", "size_bytes": csv.len()}),
        )
        .await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    let input = reply.json["input"].as_str().unwrap().to_owned();
    // The declared size is signed into the URL: S3 takes a body of exactly that length and no
    // other. (The emulator does not check signatures, so this checks what S3 will check.)
    let url = reqwest::Url::parse(reply.json["upload_url"].as_str().unwrap()).unwrap();
    let signed = url
        .query_pairs()
        .find(|(k, _)| k == "X-Amz-SignedHeaders")
        .map(|(_, v)| v.into_owned())
        .unwrap();
    assert!(signed.split(';').any(|h| h == "content-length"), "content-length is signed: {signed}");
    assert_eq!(reply.json["size_bytes"], csv.len());
    assert!(longhaul_domain::uploads::owns_upload(&who, &input), "{input}");
    assert!(!input.contains(who.as_str()), "the key does not reveal the principal");
    let mut put = reqwest::Client::new().put(reply.json["upload_url"].as_str().unwrap()).body(csv);
    for (name, value) in reply.json["headers"].as_object().unwrap() {
        put = put.header(name, value.as_str().unwrap());
    }
    let uploaded = put.send().await.unwrap();
    assert_eq!(uploaded.status(), 200, "{}", uploaded.text().await.unwrap());
    let object = Aws::new()
        .await
        .s3
        .get_object()
        .bucket(harness().stack.resource("DataBucket"))
        .key(&input)
        .send()
        .await
        .unwrap();
    assert_eq!(
        object.body.collect().await.unwrap().into_bytes().as_ref(),
        b"region,amount\neu,3\n"
    );

    let over_the_limit = 5 * 1024 * 1024 * 1024u64 + 1;
    for (body, status) in [
        (json!({"filename": "../etc/passwd", "content_type": "text/csv", "size_bytes": 10}), 422),
        (json!({"filename": "a.csv", "content_type": "not a type", "size_bytes": 10}), 422),
        (
            json!({"filename": "a.csv", "content_type": "text/csv", "size_bytes": over_the_limit}),
            422,
        ),
        (json!({"filename": "a.csv", "content_type": "text/csv"}), 400),
        (json!({"filename": "a.csv", "content_type": "text/csv", "size_bytes": -1}), 400),
        (json!({"filename": "a.csv", "size_bytes": 10}), 400),
        (
            json!({"filename": "a.csv", "content_type": "text/csv", "size_bytes": 10, "acl": "public-read"}),
            400,
        ),
    ] {
        let reply = api.post_json("/uploads", &body).await;
        assert_eq!(reply.status, status, "{body}: {}", reply.text);
    }
}

#[tokio::test]
async fn a_failed_job_is_retried_as_a_new_linked_job() {
    let api = Api::new(&principal("retrier"));
    let failed = api
        .submit(
            &json!({"type": "demo", "params": {"items": 3, "fail_at": 1, "fail_kind": "fatal"}}),
        )
        .await;
    assert_eq!(api.wait_terminal(&failed, JOB_TIMEOUT).await["status"], "failed");
    let reply = api.send("POST", &format!("/jobs/{failed}/retry"), None, &[]).await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    let retry_id = reply.json["job_id"].as_str().unwrap().parse::<JobId>().unwrap();
    assert_ne!(retry_id, failed);
    assert_eq!(reply.json["retry_of"], failed.as_str());
    assert_eq!(reply.header("location"), Some(format!("/jobs/{retry_id}").as_str()));
    let retried = api.wait_terminal(&retry_id, JOB_TIMEOUT).await;
    assert_eq!(retried["retry_of"], failed.as_str());
    assert_eq!(retried["type"], "demo");
    // The original is immutable.
    let original = api.get(&format!("/jobs/{failed}")).await.json;
    assert_eq!(original["status"], "failed");
    assert!(original.get("retry_of").is_none());
    // Retrying the same job again names the retry that exists (it failed too, so a third
    // job is created only because the second one failed).
    let again = api.send("POST", &format!("/jobs/{failed}/retry"), None, &[]).await;
    assert_eq!(again.status, 202, "the retry failed as well, so the key is reused: {}", again.text);
    assert_ne!(again.json["job_id"], retry_id.as_str());

    let ok = api.submit(&demo(1)).await;
    assert_eq!(api.wait_terminal(&ok, JOB_TIMEOUT).await["status"], "succeeded");
    let refused = api.send("POST", &format!("/jobs/{ok}/retry"), None, &[]).await;
    assert_eq!(refused.status, 409);
    assert_eq!(refused.json["status_now"], "succeeded");
}

#[tokio::test]
async fn a_retry_of_the_same_job_is_idempotent() {
    let api = Api::new(&principal("retry-idem"));
    // Fails after ~5 s, and so does its retry: retrying again while the retry still runs must
    // name that retry, not start another.
    let slow_fatal = json!({"type": "demo", "params": {"items": 100, "item_ms": 50, "fail_at": 99, "fail_kind": "fatal"}});
    let original = api.submit(&slow_fatal).await;
    assert_eq!(api.wait_terminal(&original, JOB_TIMEOUT).await["status"], "failed");
    let first = api.send("POST", &format!("/jobs/{original}/retry"), None, &[]).await;
    assert_eq!(first.status, 202, "{}", first.text);
    let retry_id = first.json["job_id"].as_str().unwrap().to_owned();
    let second = api.send("POST", &format!("/jobs/{original}/retry"), None, &[]).await;
    assert_eq!(
        (second.status, second.json["job_id"].as_str()),
        (200, Some(retry_id.as_str())),
        "{}",
        second.text
    );
    assert_eq!(second.header("idempotent-replayed"), Some("true"));
    api.send("DELETE", &format!("/jobs/{retry_id}"), None, &[]).await;
}

#[tokio::test]
async fn another_principal_gets_404_on_every_route() {
    let owner = Api::new(&principal("victim"));
    let attacker = Api::new(&principal("attacker"));
    let job_id = owner.submit(&fatal_demo()).await;
    assert_eq!(owner.wait_terminal(&job_id, JOB_TIMEOUT).await["status"], "failed");
    let unknown = uuid::Uuid::now_v7().to_string();
    for id in [job_id.as_str(), unknown.as_str()] {
        for (method, path) in [
            ("GET", format!("/jobs/{id}")),
            ("GET", format!("/jobs/{id}/result")),
            ("DELETE", format!("/jobs/{id}")),
            ("POST", format!("/jobs/{id}/cancel")),
            ("POST", format!("/jobs/{id}/retry")),
        ] {
            let reply = attacker.send(method, &path, None, &[]).await;
            assert_eq!(reply.status, 404, "{method} {path}: {}", reply.text);
            assert_eq!(reply.json["type"], "/problems/not-found");
        }
    }
    // Nothing happened to the job.
    let job = owner.get(&format!("/jobs/{job_id}")).await.json;
    assert_eq!(job["status"], "failed");
    assert_eq!(job["transitions"].as_array().unwrap().len(), 4);
}

/// Method, path, optional (content type, body), expected status.
type HostileCase = (&'static str, String, Option<(&'static str, Vec<u8>)>, u16);

#[tokio::test]
async fn hostile_requests_get_4xx_problems_and_change_nothing() {
    let who = principal("hostile-api");
    let api = Api::new(&who);
    let id = uuid::Uuid::now_v7().to_string();
    let json = "application/json";
    let cases: Vec<HostileCase> = vec![
        ("PUT", "/jobs".into(), None, 405),
        ("PATCH", format!("/jobs/{id}"), None, 405),
        ("GET", "/jobs/x/retry".into(), None, 405),
        ("GET", "/uploads".into(), None, 405),
        ("GET", "/nothing-here".into(), None, 404),
        ("GET", format!("/jobs/{id}/extra/segments"), None, 404),
        ("GET", "/jobs/%2e%2e".into(), None, 404),
        ("GET", "/jobs/..%2F..%2Fetc%2Fpasswd".into(), None, 404),
        ("GET", format!("/jobs/{}", id.to_uppercase()), None, 404),
        ("GET", "/jobs/00000000-0000-0000-0000-000000000000".into(), None, 404),
        ("GET", "/jobs/%00".into(), None, 404),
        ("POST", "/jobs".into(), Some((json, br#"{"type": "demo", "params": {"items": 1e300}}"#.to_vec())), 422),
        ("POST", "/jobs".into(), Some((json, br#"{"type": "demo", "params": {"items": 18446744073709551616}}"#.to_vec())), 422),
        ("POST", "/jobs".into(), Some((json, br#"{"type": "demo", "params": {"items": "ten"}}"#.to_vec())), 422),
        ("POST", "/jobs".into(), Some((json, br#"{"type": 7, "params": {}}"#.to_vec())), 400),
        ("POST", "/jobs".into(), Some((json, br#"{"type": "demo", "params": []}"#.to_vec())), 422),
        ("POST", "/jobs".into(), Some((json, br#"{"type": "demo", "params": {"items": 1}, "callback_url": "http://example.com/"}"#.to_vec())), 422),
        ("POST", "/jobs".into(), Some((json, b"\xff\xfe".to_vec())), 400),
        ("POST", "/jobs".into(), Some((json, Vec::new())), 400),
        ("POST", "/jobs".into(), None, 415),
        ("POST", "/jobs".into(), Some(("application/x-www-form-urlencoded", b"type=demo".to_vec())), 415),
        ("POST", "/uploads".into(), Some((json, vec![b' '; 70_000])), 413),
        ("POST", format!("/jobs/{id}/cancel"), Some((json, br#"{"reason": 5}"#.to_vec())), 400),
        ("DELETE", format!("/jobs/{id}"), Some(("text/plain", b"stop".to_vec())), 415),
    ];
    for (method, path, body, status) in cases {
        let reply = api.send(method, &path, body, &[]).await;
        assert_eq!(reply.status, status, "{method} {path}: {}", reply.text);
        assert_eq!(
            reply.header("content-type"),
            Some("application/problem+json"),
            "{method} {path}"
        );
    }
    let long_key = "k".repeat(300);
    for (name, value) in [("idempotency-key", ""), ("idempotency-key", long_key.as_str())] {
        let reply = api
            .send("POST", "/jobs", Some((json, demo(1).to_string().into_bytes())), &[(name, value)])
            .await;
        assert_eq!(reply.status, 400, "{name}: {}", reply.text);
    }
    assert!(
        Aws::new().await.items_of(&who).await.is_empty(),
        "a refused request wrote to the table"
    );
}

#[tokio::test]
async fn callback_urls_are_checked_against_ssrf_at_submission() {
    let who = principal("ssrf");
    let api = Api::new(&who);
    for url in [
        "http://partner.example/hook",
        "https://127.0.0.1/",
        "https://127.1/",
        "https://2130706433/",
        "https://0x7f000001/",
        "https://0177.0.0.1/",
        "https://[::1]/",
        "https://[::ffff:127.0.0.1]/",
        "https://169.254.169.254/latest/meta-data/",
        "https://127.0.0.1:9001/2018-06-01/runtime/invocation/next",
        "https://10.0.0.1/",
        "https://172.16.5.4/",
        "https://192.168.1.1/",
        "https://100.64.0.1/",
        "https://0.0.0.0/",
        "https://[::]/",
        "https://[fd00::1]/",
        "https://[fe80::1]/",
        "https://224.0.0.1/",
        "https://localhost/",
        "https://LOCALHOST./",
        "https://api.localhost/",
        "https://user:secret@partner.example/",
        "https://intranet/",
        "ftp://partner.example/",
        "https://partner.example/#frag",
    ] {
        let reply = api
            .post_json(
                "/jobs",
                &json!({"type": "demo", "params": {"items": 1}, "callback_url": url}),
            )
            .await;
        assert_eq!(reply.status, 422, "{url}: {}", reply.text);
        assert_eq!(reply.json["type"], "/problems/invalid-callback-url", "{url}");
    }
    assert!(Aws::new().await.items_of(&who).await.is_empty());
}

/// A browser app on another origin can call the API (`CorsConfiguration` of the HTTP API, as
/// API Gateway applies it): its preflight is answered before the authorizer, and a script may
/// read the headers the API's answers carry (Retry-After, Location).
#[tokio::test]
async fn a_browser_on_another_origin_can_call_the_api_and_read_its_headers() {
    let base = harness().stack.api_url.clone();
    let http = reqwest::Client::new();
    let origin = "https://app.example";
    let preflight = http
        .request(reqwest::Method::OPTIONS, format!("{base}/jobs"))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "authorization,content-type,idempotency-key")
        .send()
        .await
        .unwrap();
    assert_eq!(preflight.status(), 204, "a preflight needs no token");
    let header = |r: &reqwest::Response, name: &str| {
        r.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
    };
    assert_eq!(header(&preflight, "access-control-allow-origin"), "*");
    assert!(header(&preflight, "access-control-allow-methods").contains("POST"));
    let allowed = header(&preflight, "access-control-allow-headers");
    for name in ["authorization", "content-type", "idempotency-key"] {
        assert!(allowed.contains(name), "{name} in {allowed}");
    }

    let api = Api::new(&principal("cors"));
    let job_id = api.submit(&demo(1)).await;
    let read = http
        .get(format!("{base}/jobs/{job_id}"))
        .header("origin", origin)
        .bearer_auth(api.token.clone().expect("a token"))
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 200);
    assert_eq!(header(&read, "access-control-allow-origin"), "*");
    let exposed = header(&read, "access-control-expose-headers");
    for name in ["retry-after", "location", "idempotent-replayed", "etag"] {
        assert!(exposed.contains(name), "{name} in {exposed}");
    }
}

//! Least privilege, as the local stack enforces the template's IAM: the webhook function
//! writes its delivery records and cannot write over a job record; a function's init warm-up
//! makes the calls its role is judged on; every function's log group has a retention.
//!
//! A binary of its own: it provokes an `AccessDenied` on purpose, and the harness fails any
//! API call made after a refusal in the same stack (see `assert_no_access_denied`).

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::AttributeValue;
use longhaul_aws::jobs::{DeliveryRecord, JobStore, delivery_pk, job_pk};
use longhaul_local::function_identity;
use longhaul_local::template::Template;
use longhaul_tests::{harness, root};

/// Delivery records live in their own partition (`DELIVERY#<job id>`), the only one besides
/// secrets the webhook function's role may write: its identity records a delivery, and is
/// refused a `PutItem` on a job's partition — its record, or a delivery record where they
/// used to be kept (`JOB#<id>` / `WEBHOOK#…`), which the old grant on `JOB#*` allowed.
#[tokio::test]
async fn the_webhook_function_writes_deliveries_and_never_job_records() {
    let stack = &harness().stack;
    let table = stack.resource("JobsTable");
    let sdk = longhaul_local::sdk_config(&stack.edge_url).await;
    let webhook = aws_sdk_dynamodb::Client::new(&function_identity(&sdk, "WebhookFunction"));
    let job_id = longhaul_domain::JobId::new();

    let delivery = DeliveryRecord {
        webhook_id: format!("msg_{job_id}"),
        event: "job.succeeded".into(),
        attempt: 1,
        at: longhaul_domain::Timestamp::now(),
        status_code: Some(204),
        latency_ms: 3,
        error: None,
        outcome: longhaul_domain::webhooks::DeliveryOutcome::Delivered,
    };
    JobStore::new(webhook.clone(), table.clone())
        .record_delivery(&job_id, &delivery)
        .await
        .unwrap();
    let admin = aws_sdk_dynamodb::Client::new(&stack.emulator_sdk_config().await);
    let recorded = JobStore::new(admin.clone(), table.clone()).deliveries(&job_id).await.unwrap();
    assert_eq!(recorded, [delivery]);
    // Every record ends: the delivery carries its TTL, the record retention from now.
    let stored = admin
        .query()
        .table_name(&table)
        .key_condition_expression("pk = :pk")
        .expression_attribute_values(":pk", AttributeValue::S(delivery_pk(&job_id)))
        .send()
        .await
        .unwrap();
    let ttl: i64 = stored.items()[0]["expires_at"].as_n().unwrap().parse().unwrap();
    let expected = chrono::Utc::now().timestamp() + 2_592_000;
    assert!((expected - 60..=expected).contains(&ttl), "expires_at {ttl}, expected ≈ {expected}");

    for sk in ["JOB", "WEBHOOK#job.succeeded#0001"] {
        let item: HashMap<String, AttributeValue> = HashMap::from([
            ("pk".into(), AttributeValue::S(job_pk(&job_id))),
            ("sk".into(), AttributeValue::S(sk.into())),
            ("status".into(), AttributeValue::S("succeeded".into())),
        ]);
        let refused =
            webhook.put_item().table_name(&table).set_item(Some(item)).send().await.unwrap_err();
        assert_eq!(refused.code(), Some("AccessDeniedException"), "{sk}: {refused:?}");
    }
    let left = admin
        .query()
        .table_name(&table)
        .key_condition_expression("pk = :pk")
        .expression_attribute_values(":pk", AttributeValue::S(job_pk(&job_id)))
        .send()
        .await
        .unwrap();
    assert_eq!(left.count(), 0, "nothing was written to the job's partition");
    // (Another test here provokes denials of its own, under another principal.)
    let denials: Vec<_> =
        stack.denials.snapshot().into_iter().filter(|d| d.principal == "WebhookFunction").collect();
    assert!(denials.iter().all(|d| d.action == "dynamodb:PutItem"), "{denials:#?}");
    assert_eq!(denials.len(), 2, "{denials:#?}");
    assert!(delivery_pk(&job_id).starts_with("DELIVERY#"));
}

/// The stack runs every function's init warm-up (`Deps::warm_set`) under the function's own
/// identity at start and refuses to start if the role denied any call. That check holds only if
/// a warm set makes the very calls IAM judges: submit's, run as itself, is allowed; run as the
/// uploads function (whose role may read the warm-up item but invokes no worker), its `DryRun`
/// invocation is refused. Each adapter's `warm()` is awaited to its end (`warm_up`'s time
/// budget could stop a call on a slow machine).
#[tokio::test]
async fn a_warm_up_its_role_does_not_allow_is_denied() {
    let stack = &harness().stack;
    let sdk = longhaul_local::sdk_config(&stack.edge_url).await;
    let spec = longhaul_local::model::functions(&stack.template)
        .unwrap()
        .into_iter()
        .find(|spec| spec.logical == "SubmitFunction")
        .unwrap();
    let host = |identity: &str| {
        longhaul_local::hosting::hosted::host(
            &spec,
            &function_identity(&sdk, identity),
            &Default::default(),
            &longhaul_jobs::registry(),
        )
        .unwrap()
    };

    let own = host("SubmitFunction");
    assert_eq!(own.warm_set.len(), 2, "the table and the worker: {:?}", own.warm_set);
    for adapter in &own.warm_set {
        adapter.warm().await;
    }
    let denials = stack.denials.snapshot();
    assert!(denials.iter().all(|d| d.principal != "SubmitFunction"), "{denials:#?}");

    for adapter in &host("UploadsFunction").warm_set {
        adapter.warm().await;
    }
    let denied: Vec<_> = stack
        .denials
        .snapshot()
        .into_iter()
        .filter(|d| d.principal == "UploadsFunction")
        .map(|d| d.action)
        .collect();
    assert_eq!(denied, ["lambda:InvokeFunction"]);
}

/// Each function writes to `/aws/lambda/<its name>`; a log group of that name is declared
/// with the template's `LogRetentionDays` (30 by default), so none keeps logs forever.
#[test]
fn every_function_has_a_log_group_with_a_retention() {
    let template = Template::load(
        &root().join("template.yaml"),
        "longhaul",
        "http://127.0.0.1:1",
        "http://127.0.0.1:2",
        &BTreeMap::new(),
    )
    .unwrap();
    assert_eq!(template.parameters["LogRetentionDays"], "30");
    let mut groups = BTreeMap::new();
    for (logical, group) in template.of_type("AWS::Logs::LogGroup") {
        let props = &group["Properties"];
        let name = template.resolve_string(&props["LogGroupName"]).unwrap();
        let days = template.resolve_string(&props["RetentionInDays"]).unwrap();
        groups.insert(name, (logical.clone(), days));
    }
    let functions: Vec<_> = template.of_type("AWS::Serverless::Function").collect();
    assert!(functions.len() >= 12, "{}", functions.len());
    for (logical, _) in functions {
        let name = format!("/aws/lambda/{}", template.physical_name(logical).unwrap());
        let (_, days) = groups.get(&name).unwrap_or_else(|| panic!("no log group for {logical}"));
        assert_eq!(days, "30", "{logical}");
    }
}

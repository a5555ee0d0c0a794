//! The IAM check against the repository's template: what each role may and may not do.

use axum::http::{HeaderMap, Method, Uri};
use serde_json::Value;

use super::*;
use crate::stack::template::real_template;

fn policies() -> Policies {
    Policies::from_template(&real_template()).unwrap()
}

const TABLE: &str = "arn:aws:dynamodb:us-east-1:123456789012:table/longhaul-JobsTable";

fn get(p: &Policies, uri: &str) -> Vec<Access> {
    p.accesses(
        &format!("s3:{}", if uri.contains("list-type") { "ListObjectsV2" } else { "GetObject" }),
        &Method::GET,
        &uri.parse().unwrap(),
        &HeaderMap::new(),
        b"",
    )
    .unwrap()
}

fn dynamodb(p: &Policies, op: &str, body: Value) -> Vec<Access> {
    p.accesses(
        &format!("dynamodb:{op}"),
        &Method::POST,
        &"/".parse().unwrap(),
        &HeaderMap::new(),
        body.to_string().as_bytes(),
    )
    .unwrap()
}

/// Regression: the stage tidies a finished job by listing `checkpoints/<id>/`, and its
/// policy once granted the listing of `results/` only — every job's end failed in AWS. It
/// may now list the whole bucket, which it also needs to hear 404 for a missing key; the
/// status function may not, and reads a missing key as 403.
#[test]
fn the_stage_may_list_the_bucket_and_the_status_function_may_not() {
    let p = policies();
    for prefix in ["checkpoints/j1/", "results/j1/"] {
        let accesses = get(
            &p,
            &format!("/longhaul-databucket?list-type=2&prefix={}", prefix.replace('/', "%2F")),
        );
        assert_eq!(accesses[0].context["s3:prefix"], vec![prefix.to_owned()]);
        p.check("StageFunction", &accesses).unwrap();
        assert!(p.check("StatusFunction", &accesses).is_err());
    }
    assert!(p.may_list_bucket("StageFunction", "longhaul-databucket"));
    assert!(
        p.check("ReaperFunction", &get(&p, "/longhaul-databucket?list-type=2&prefix=uploads%2F"))
            .is_err(),
        "the reaper lists results and checkpoints only"
    );
    assert!(
        p.check("ReaperFunction", &get(&p, "/longhaul-databucket?list-type=2")).is_err(),
        "no prefix: the whole bucket"
    );
    assert!(
        p.accesses(
            "s3:GetObject",
            &Method::GET,
            &"/longhaul-databucket/results/j1/r.json?tagging".parse().unwrap(),
            &HeaderMap::new(),
            b""
        )
        .is_err(),
        "a sub-resource is another action"
    );
    assert!(
        !p.may_list_bucket("StatusFunction", "longhaul-databucket"),
        "a missing result reads as 403 to the status function"
    );
}

/// Regression: the reaper reads a running job's record and progress with a Query on the
/// table, which its policy once granted on the status index only.
#[test]
fn the_reaper_may_query_the_table_and_its_status_index_but_not_the_owner_index() {
    let p = policies();
    let query = |index: Option<&str>| {
        let key = match index {
            None => "pk",
            Some("OwnerIndex") => "gsi1pk",
            Some(_) => "gsi2pk",
        };
        let mut body = serde_json::json!({"TableName": "longhaul-JobsTable", "KeyConditionExpression": "#k = :v AND begins_with(sk, :s)",
            "ExpressionAttributeNames": {"#k": key}, "ExpressionAttributeValues": {":v": {"S": "JOB#1"}, ":s": {"S": "J"}}});
        if let Some(index) = index {
            body["IndexName"] = index.into();
        }
        dynamodb(&p, "Query", body)
    };
    assert_eq!(query(None)[0].context["dynamodb:LeadingKeys"], vec!["JOB#1".to_owned()]);
    p.check("ReaperFunction", &query(None)).unwrap();
    p.check("ReaperFunction", &query(Some("StatusIndex"))).unwrap();
    let denial = p.check("ReaperFunction", &query(Some("OwnerIndex"))).unwrap_err();
    assert_eq!(denial.resource, format!("{TABLE}/index/OwnerIndex"));
    assert!(
        denial.message.contains("is not authorized to perform: dynamodb:Query"),
        "{}",
        denial.message
    );
}

#[test]
fn leading_key_conditions_confine_a_function_to_its_items() {
    let p = policies();
    let get_item = |pk: &str| {
        dynamodb(
            &p,
            "GetItem",
            serde_json::json!({"TableName": "longhaul-JobsTable", "Key": {"pk": {"S": pk}, "sk": {"S": "x"}}}),
        )
    };
    p.check("WebhooksFunction", &get_item("SECRET#alice")).unwrap();
    p.check("WebhooksFunction", &get_item("WARMUP")).unwrap();
    assert!(
        p.check("WebhooksFunction", &get_item("JOB#1")).is_err(),
        "a job record is not the webhooks function's"
    );
    p.check("DispatcherFunction", &get_item("WARMUP")).unwrap();
    p.check("DispatcherFunction", &get_item("JOB#1")).unwrap();
    assert!(
        p.check("DispatcherFunction", &get_item("SECRET#5:alice")).is_err(),
        "the dispatcher reads jobs, never secrets"
    );
    // Running slots: each function that takes or frees them (submit: for the jobs it starts
    // itself) reaches only SLOTS#/WAITING#.
    for function in ["DispatcherFunction", "SlotsFunction", "ReaperFunction", "SubmitFunction"] {
        p.check(function, &get_item("SLOTS#T#5:alice")).unwrap();
    }
    // The slots function reads a paused job again (resumed since?), and writes none.
    p.check("SlotsFunction", &get_item("JOB#1")).unwrap();
    assert!(
        p.check("SlotsFunction", &get_item("SECRET#5:alice")).is_err(),
        "slots never reads secrets"
    );
    assert!(
        p.check("SubmitFunction", &get_item("SECRET#5:alice")).is_err(),
        "submit never reads secrets"
    );
    // The uploads function counts its principals' upload bytes, and touches nothing else.
    let update = |pk: &str| {
        dynamodb(
            &p,
            "UpdateItem",
            serde_json::json!({"TableName": "longhaul-JobsTable", "Key": {"pk": {"S": pk}, "sk": {"S": "DAY#1"}}}),
        )
    };
    p.check("UploadsFunction", &update("UPLOADQUOTA#5:alice")).unwrap();
    p.check("UploadsFunction", &get_item("WARMUP")).unwrap();
    for other in ["RATE#5:alice", "JOB#1", "SLOTS#T#5:alice"] {
        assert!(p.check("UploadsFunction", &update(other)).is_err(), "{other}");
    }
    assert!(p.check("UploadsFunction", &get_item("UPLOADQUOTA#5:alice")).is_err());
    assert!(p.check("SubmitFunction", &update("UPLOADQUOTA#5:alice")).is_err());
    // Table grants are confined to the item kinds each function works on.
    let put = |pk: &str| {
        dynamodb(
            &p,
            "PutItem",
            serde_json::json!({"TableName": "longhaul-JobsTable", "Item": {"pk": {"S": pk}, "sk": {"S": "x"}}}),
        )
    };
    p.check("SubmitFunction", &put("JOB#1")).unwrap();
    p.check("SubmitFunction", &put("IDEM#5:alice#k")).unwrap();
    assert!(
        p.check("SubmitFunction", &put("SECRET#5:alice")).is_err(),
        "submit may not write signing secrets"
    );
    p.check("WebhookFunction", &get_item("SECRET#5:alice")).unwrap();
    p.check("WebhookFunction", &get_item("JOB#1")).unwrap();
    p.check("WebhookFunction", &put("DELIVERY#1")).unwrap();
    p.check("WebhookFunction", &put("SECRET#5:alice")).unwrap();
    assert!(
        p.check("WebhookFunction", &put("JOB#1")).is_err(),
        "the deliverer writes delivery records, never over a job record"
    );
    assert!(p.check("WebhookFunction", &put("IDEM#5:alice#k")).is_err());
    assert!(p.check("WebhooksFunction", &put("DELIVERY#1")).is_err());
    assert!(
        p.check("StageFunction", &get_item("SECRET#5:alice")).is_err(),
        "a stage never reads secrets"
    );
    let unreadable = p.accesses(
        "dynamodb:GetItem",
        &Method::POST,
        &"/".parse().unwrap(),
        &HeaderMap::new(),
        serde_json::json!({"TableName": "longhaul-JobsTable", "Key": {"id": {"S": "JOB#1"}}})
            .to_string()
            .as_bytes(),
    );
    assert!(
        unreadable.is_err(),
        "a key without the partition key is refused, not allowed vacuously"
    );
}

#[test]
fn a_copy_needs_read_on_its_source_and_write_on_its_target() {
    let p = policies();
    let mut headers = HeaderMap::new();
    headers.insert(
        "x-amz-copy-source",
        "longhaul-databucket/checkpoints%2Fj1%2Fresult".parse().unwrap(),
    );
    let accesses = p
        .accesses(
            "s3:CopyObject",
            &Method::PUT,
            &"/longhaul-databucket/results/j1/report.json".parse().unwrap(),
            &headers,
            b"",
        )
        .unwrap();
    assert_eq!(accesses[1].resource, "arn:aws:s3:::longhaul-databucket/checkpoints/j1/result");
    p.check("StageFunction", &accesses).unwrap();
    assert!(p.check("StatusFunction", &accesses).is_err());
}

/// Every worker role may run a multipart result upload under results/ — create, upload,
/// complete (PutObject), list its parts and abort it — and nothing of it elsewhere.
#[test]
fn worker_roles_may_upload_results_in_parts() {
    let p = policies();
    let call = |op: &str, method: Method, uri: &str| {
        p.accesses(&format!("s3:{op}"), &method, &uri.parse().unwrap(), &HeaderMap::new(), b"")
            .unwrap()
    };
    let key = "/longhaul-databucket/results/j1/1/big.bin";
    let calls = [
        call(
            "CreateMultipartUpload",
            Method::POST,
            &format!("{key}?uploads&x-id=CreateMultipartUpload"),
        ),
        call("UploadPart", Method::PUT, &format!("{key}?x-id=UploadPart&partNumber=1&uploadId=u")),
        call("CompleteMultipartUpload", Method::POST, &format!("{key}?uploadId=u")),
        call("ListParts", Method::GET, &format!("{key}?x-id=ListParts&max-parts=1&uploadId=u")),
        call(
            "AbortMultipartUpload",
            Method::DELETE,
            &format!("{key}?x-id=AbortMultipartUpload&uploadId=u"),
        ),
    ];
    assert_eq!(calls[3][0].action, "s3:ListMultipartUploadParts");
    for accesses in &calls {
        p.check("StageFunction", accesses).unwrap();
        p.check("CsvReportWorkerFunction", accesses).unwrap();
        assert!(p.check("StatusFunction", accesses).is_err());
    }
    let elsewhere = call(
        "AbortMultipartUpload",
        Method::DELETE,
        "/longhaul-databucket/uploads/x/y/z.csv?uploadId=u",
    );
    assert!(p.check("StageFunction", &elsewhere).is_err());
}

#[test]
fn sam_policy_templates_and_batches() {
    let p = policies();
    let send = |op: &str, queue: &str| {
        let body =
            serde_json::json!({"QueueUrl": format!("http://127.0.0.1:1/123456789012/{queue}")});
        p.accesses(
            &format!("sqs:{op}"),
            &Method::POST,
            &"/".parse().unwrap(),
            &HeaderMap::new(),
            body.to_string().as_bytes(),
        )
        .unwrap()
    };
    p.check("SubmitFunction", &send("SendMessage", "longhaul-IntakeQueue")).unwrap();
    p.check("NotifierFunction", &send("SendMessageBatch", "longhaul-WebhookQueue")).unwrap();
    assert!(p.check("SubmitFunction", &send("SendMessage", "longhaul-WebhookQueue")).is_err());
    let invoke = [Access::new(
        "lambda:InvokeFunction",
        crate::template::function_arn("longhaul-StageFunction"),
    )];
    p.check("JobStateMachine", &invoke).unwrap();
    p.check_invoke(&crate::template::function_arn("longhaul-StageFunction")).unwrap();
    assert!(p.check_invoke(&crate::template::function_arn("longhaul-ReaperFunction")).is_err());
}

#[test]
fn the_signer_is_read_from_the_header_or_a_presigned_url() {
    let mut headers = HeaderMap::new();
    headers.insert("authorization", "AWS4-HMAC-SHA256 Credential=StageFunction/20261123/us-east-1/s3/aws4_request, SignedHeaders=host".parse().unwrap());
    let signed = Credential::of(&"/b/k".parse().unwrap(), &headers).unwrap();
    assert_eq!((signed.key.as_str(), signed.service.as_str()), ("StageFunction", "s3"));
    let presigned: Uri = "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=UploadsFunction%2F20261123%2Fus-east-1%2Fs3%2Faws4_request".parse().unwrap();
    let presigned = Credential::of(&presigned, &HeaderMap::new()).unwrap();
    assert_eq!((presigned.key.as_str(), presigned.service.as_str()), ("UploadsFunction", "s3"));
}

#[test]
fn every_function_of_the_template_has_a_role() {
    let p = policies();
    for name in
        ["SubmitFunction", "StatusFunction", "StageFunction", "ReaperFunction", "JobStateMachine"]
    {
        assert!(p.knows(name), "{name}");
    }
    assert!(!p.knows("longhaul"), "the administrator's key is not a role");
}

/// EventBridge Scheduler: the schedules function writes schedules in the stack's group only,
/// and passing the scheduler role to Scheduler is part of a create or update; the firing
/// function may only update (a `pause_on_failure` pause).
#[test]
fn the_schedules_function_writes_schedules_in_its_group_and_passes_the_scheduler_role() {
    let p = policies();
    let role = "arn:aws:iam::123456789012:role/longhaul-SchedulerRole";
    let write = |op: &str, method: Method, group: &str, role: &str| {
        let body = serde_json::json!({
            "GroupName": group,
            "ScheduleExpression": "rate(1 minute)",
            "Target": {"Arn": "arn:aws:sqs:us-east-1:123456789012:longhaul-ScheduleQueue", "RoleArn": role},
        });
        p.accesses(
            &format!("scheduler:{op}"),
            &method,
            &"/schedules/s1".parse().unwrap(),
            &HeaderMap::new(),
            body.to_string().as_bytes(),
        )
        .unwrap()
    };
    let create = write("CreateSchedule", Method::POST, "longhaul-schedules", role);
    assert_eq!(
        create,
        vec![
            Access::new(
                "scheduler:CreateSchedule",
                "arn:aws:scheduler:us-east-1:123456789012:schedule/longhaul-schedules/s1"
            ),
            Access::new("iam:PassRole", role)
                .with("iam:PassedToService", vec!["scheduler.amazonaws.com".into()]),
        ]
    );
    p.check("SchedulesFunction", &create).unwrap();
    assert!(p.check("FiringFunction", &create).is_err(), "the firing function never creates");
    let update = write("UpdateSchedule", Method::PUT, "longhaul-schedules", role);
    p.check("SchedulesFunction", &update).unwrap();
    p.check("FiringFunction", &update).unwrap();
    assert!(p.check("SlotsFunction", &update).is_err());
    assert!(
        p.check("SchedulesFunction", &write("CreateSchedule", Method::POST, "default", role))
            .is_err(),
        "another group"
    );
    let other_role = "arn:aws:iam::123456789012:role/longhaul-Admin";
    assert!(
        p.check(
            "SchedulesFunction",
            &write("CreateSchedule", Method::POST, "longhaul-schedules", other_role)
        )
        .is_err(),
        "another role may not be passed"
    );
    let read = |op: &str, method: Method, query: &str| {
        p.accesses(
            &format!("scheduler:{op}"),
            &method,
            &format!("/schedules/s1?{query}").parse().unwrap(),
            &HeaderMap::new(),
            b"",
        )
        .unwrap()
    };
    let get = read("GetSchedule", Method::GET, "groupName=longhaul-schedules");
    assert_eq!(
        get[0].resource,
        "arn:aws:scheduler:us-east-1:123456789012:schedule/longhaul-schedules/s1"
    );
    p.check("SchedulesFunction", &get).unwrap();
    p.check(
        "SchedulesFunction",
        &read("DeleteSchedule", Method::DELETE, "groupName=longhaul-schedules&clientToken=t"),
    )
    .unwrap();
    assert!(
        p.check("SchedulesFunction", &read("GetSchedule", Method::GET, "")).is_err(),
        "the default group"
    );
    assert!(p.check("FiringFunction", &get).is_err());
}

/// What EventBridge Scheduler sends a firing as: the template's scheduler role, which trusts
/// Scheduler (for this account) and may send to the schedule queue and its dead-letter queue
/// only.
#[test]
fn scheduler_sends_firings_as_the_scheduler_role() {
    let p = policies();
    let role = "arn:aws:iam::123456789012:role/longhaul-SchedulerRole";
    let schedule = "arn:aws:scheduler:us-east-1:123456789012:schedule/longhaul-schedules/s1";
    let send = |queue: &str| {
        [Access::send_message(&format!("arn:aws:sqs:us-east-1:123456789012:{queue}"))]
    };
    for queue in ["longhaul-ScheduleQueue", "longhaul-ScheduleDeadLetterQueue"] {
        p.check_service_role(SCHEDULER_SERVICE, role, schedule, &send(queue)).unwrap();
    }
    let refused = p
        .check_service_role(SCHEDULER_SERVICE, role, schedule, &send("longhaul-IntakeQueue"))
        .unwrap_err();
    assert_eq!(refused.action, "sqs:SendMessage");
    assert!(refused.principal.starts_with("SchedulerRole"), "{refused:?}");
    let untrusted = p
        .check_service_role("events.amazonaws.com", role, schedule, &send("longhaul-ScheduleQueue"))
        .unwrap_err();
    assert_eq!(untrusted.action, "sts:AssumeRole");
    assert!(
        p.check_service_role(
            SCHEDULER_SERVICE,
            "arn:aws:iam::123456789012:role/nobody",
            schedule,
            &send("longhaul-ScheduleQueue")
        )
        .is_err(),
        "a role the template does not have"
    );
}

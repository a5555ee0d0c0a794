//! The ports' contracts on the AWS adapters: the same tests `longhaul-memory` runs on its
//! in-memory adapters ([`longhaul_memory::contract`]), here on the DynamoDB, S3, SQS and Step
//! Functions adapters against the local stack — so what a handler's unit test relies on is
//! what the services do.

use longhaul_domain::JobId;
use longhaul_tests::job_store;

#[tokio::test(flavor = "multi_thread")]
async fn the_dynamodb_job_store_keeps_the_job_table_contract() {
    longhaul_memory::contract::job_table(&job_store().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dynamodb_job_store_keeps_the_pausing_contract() {
    longhaul_memory::contract::job_pausing(&job_store().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dynamodb_job_store_keeps_the_schedule_store_contract() {
    longhaul_memory::contract::schedule_store(&job_store().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dynamodb_job_store_keeps_the_endpoint_table_contract() {
    longhaul_memory::contract::endpoint_table(&job_store().await).await;
}

/// On a schedule group of the test's own: EventBridge Scheduler as the emulator serves it.
#[tokio::test(flavor = "multi_thread")]
async fn the_eventbridge_scheduler_keeps_the_schedule_twins_contract() {
    use longhaul_aws::scheduler::{Scheduler, SchedulerTarget};
    let config = longhaul_tests::harness().stack.emulator_sdk_config().await;
    let client = aws_sdk_scheduler::Client::new(&config);
    let group = format!("contract-{}", uuid::Uuid::new_v4());
    client.create_schedule_group().name(&group).send().await.expect("create the group");
    let arn =
        |service: &str, name: &str| format!("arn:aws:{service}:us-east-1:123456789012:{name}");
    let target = SchedulerTarget {
        group,
        queue_arn: arn("sqs", "contract-schedule-queue"),
        role_arn: "arn:aws:iam::123456789012:role/contract-scheduler".into(),
        dead_letter_arn: arn("sqs", "contract-schedule-dlq"),
    };
    longhaul_memory::contract::schedule_twins(&Scheduler::new(client, target)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dynamodb_stream_slots_keep_the_stream_caps_contract() {
    let dynamodb = longhaul_tests::Aws::new().await.dynamodb;
    let table = longhaul_tests::harness().stack.resource("JobsTable");
    longhaul_memory::contract::stream_slots(|per_job, per_tenant, per_deployment| {
        longhaul_aws::limits::StreamSlots::new(
            dynamodb.clone(),
            table.clone(),
            per_job,
            per_tenant,
            per_deployment,
        )
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dynamodb_admitter_keeps_the_slot_pools_contract() {
    use longhaul_aws::queue::{DispatchMessage, IntakeQueue};
    use longhaul_aws::slots::{Admitter, SlotStore};
    let aws = longhaul_tests::Aws::new().await;
    let table = longhaul_tests::harness().stack.resource("JobsTable");
    // Wake-ups go to a queue of this test's own, which no dispatcher drains.
    let queue = aws
        .sqs
        .create_queue()
        .queue_name(format!("contract-intake-{}", uuid::Uuid::new_v4()))
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let admitter = Admitter {
        slots: SlotStore::new(aws.dynamodb.clone(), table.clone()),
        intake: IntakeQueue::new(aws.sqs.clone(), queue.clone()),
    };
    // A second process's handle on the same pools: its guesses of a rate window are its own.
    let other = Admitter {
        slots: SlotStore::new(aws.dynamodb.clone(), table),
        intake: IntakeQueue::new(aws.sqs.clone(), queue.clone()),
    };
    longhaul_memory::contract::pool_rates(&admitter, &other).await;
    let received = std::sync::Mutex::new(Vec::<JobId>::new());
    let woken = async || {
        loop {
            let output = aws
                .sqs
                .receive_message()
                .queue_url(&queue)
                .max_number_of_messages(10)
                .send()
                .await
                .unwrap();
            if output.messages().is_empty() {
                break;
            }
            for message in output.messages() {
                let body: DispatchMessage =
                    serde_json::from_str(message.body().unwrap_or_default()).unwrap();
                received.lock().unwrap().push(body.job_id);
                let receipt = message.receipt_handle().unwrap_or_default();
                aws.sqs
                    .delete_message()
                    .queue_url(&queue)
                    .receipt_handle(receipt)
                    .send()
                    .await
                    .unwrap();
            }
        }
        received.lock().unwrap().clone()
    };
    longhaul_memory::contract::slot_pools(&admitter, woken).await;
    aws.sqs.delete_queue().queue_url(&queue).send().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dynamodb_job_store_keeps_the_status_index_contract() {
    longhaul_memory::contract::status_index(&job_store().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_s3_object_store_keeps_the_upload_links_contract() {
    let objects = longhaul_aws::objects::ObjectStore::new(
        longhaul_tests::Aws::new().await.s3,
        longhaul_tests::harness().stack.resource("DataBucket"),
    );
    longhaul_memory::contract::upload_links(&objects).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dynamodb_job_store_keeps_the_attempts_contract() {
    longhaul_memory::contract::job_attempts(&job_store().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dynamodb_job_store_keeps_the_shards_contract() {
    longhaul_memory::contract::job_shards(&job_store().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_s3_object_store_keeps_the_objects_contract() {
    // Through the edge, as the functions call S3: it names moto's `ListParts` answer as S3 does.
    let stack = &longhaul_tests::harness().stack;
    let sdk = longhaul_local::sdk_config(&stack.edge_url).await;
    let objects = longhaul_aws::objects::ObjectStore::new(
        aws_sdk_s3::Client::new(&sdk),
        stack.resource("DataBucket"),
    );
    longhaul_memory::contract::objects(&objects).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dynamodb_job_store_keeps_the_reaping_contract() {
    longhaul_memory::contract::job_reaping(&job_store().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_step_functions_executions_keep_the_executions_contract() {
    // A state machine of this test's own that waits (nothing ends its executions meanwhile).
    let aws = longhaul_tests::Aws::new().await;
    let definition = serde_json::json!({
        "StartAt": "Wait",
        "States": {"Wait": {"Type": "Wait", "Seconds": 3600, "End": true}}
    });
    let arn = aws
        .sfn
        .create_state_machine()
        .name(format!("contract-{}", uuid::Uuid::new_v4()))
        .definition(definition.to_string())
        .role_arn("arn:aws:iam::123456789012:role/contract")
        .send()
        .await
        .unwrap()
        .state_machine_arn;
    let executions = longhaul_aws::executions::Executions::new(aws.sfn.clone(), arn);
    longhaul_memory::contract::executions(&executions).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dynamodb_submission_limiter_keeps_the_rate_limit_contract() {
    let limiter = longhaul_aws::limits::TenantRateLimiter::new(
        longhaul_tests::Aws::new().await.dynamodb,
        longhaul_tests::harness().stack.resource("JobsTable"),
        2,
    );
    longhaul_memory::contract::rate_limits(&limiter).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dynamodb_upload_quota_keeps_the_upload_quota_contract() {
    let quota = longhaul_aws::limits::UploadQuota::new(
        longhaul_tests::Aws::new().await.dynamodb,
        longhaul_tests::harness().stack.resource("JobsTable"),
        100,
    );
    longhaul_memory::contract::upload_quotas(&quota).await;
}

/// A standard queue of the test's own (no function drains it), and a drain of `n` of its
/// messages' bodies (waiting while they come; a deadline only against a hang).
async fn own_queue(sqs: &aws_sdk_sqs::Client) -> String {
    sqs.create_queue()
        .queue_name(format!("contract-{}", uuid::Uuid::new_v4()))
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap()
}

async fn drain(sqs: &aws_sdk_sqs::Client, url: &str, n: usize) -> Vec<serde_json::Value> {
    let deadline =
        longhaul_tests::Deadline::new(format!("{n} messages"), std::time::Duration::from_secs(120));
    let mut bodies = Vec::new();
    while bodies.len() < n {
        let output = sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        for message in output.messages() {
            bodies.push(serde_json::from_str(message.body().unwrap()).unwrap());
            sqs.delete_message()
                .queue_url(url)
                .receipt_handle(message.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
        }
        deadline.tick(std::time::Duration::ZERO, bodies.len()).await;
    }
    bodies
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sqs_queues_keep_the_queue_contracts() {
    use longhaul_aws::queue::{DeadLetterQueue, IntakeQueue, WebhookQueue};
    let sqs = longhaul_tests::Aws::new().await.sqs;
    let url = own_queue(&sqs).await;
    let intake = IntakeQueue::new(sqs.clone(), url.clone());
    longhaul_memory::contract::dispatch_queue(&intake, async |n| drain(&sqs, &url, n).await).await;
    let url = own_queue(&sqs).await;
    let webhooks = WebhookQueue::new(sqs.clone(), url.clone());
    longhaul_memory::contract::webhook_queue(&webhooks, async |n| drain(&sqs, &url, n).await).await;
    let url = own_queue(&sqs).await;
    let dead = DeadLetterQueue::new(sqs.clone(), url.clone());
    longhaul_memory::contract::dead_letters(&dead, async |n| drain(&sqs, &url, n).await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_secrets_manager_key_keeps_the_signing_key_contract() {
    use longhaul_aws::secrets::SecretKey;
    let config = longhaul_tests::harness().stack.emulator_sdk_config().await;
    let client = aws_sdk_secretsmanager::Client::new(&config);
    // Secrets of this test's own, named (a name reads as its ARN does).
    let create = async |name: &str, value: &str| {
        client.create_secret().name(name).secret_string(value).send().await.unwrap();
    };
    let name = |label: &str| format!("contract-{label}-{}", uuid::Uuid::new_v4());
    let (key, other, later) = (name("key"), name("other"), name("later"));
    let secret = uuid::Uuid::new_v4().to_string();
    create(&key, &secret).await;
    create(&other, &uuid::Uuid::new_v4().to_string()).await;
    let reader = |name: &str| SecretKey::new(client.clone(), name.to_owned());
    let unreadable = reader(&later);
    longhaul_memory::contract::signing_key(
        &secret,
        &reader(&key),
        &reader(&key),
        &reader(&other),
        &unreadable,
        async || create(&later, "written-late").await,
    )
    .await;
}

#[tokio::test]
async fn the_system_clock_keeps_the_clock_contract() {
    // No service behind it: the machine's clock is the clock's only adapter.
    longhaul_memory::contract::clock(&longhaul_aws::ports::SystemClock).await;
}

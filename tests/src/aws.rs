//! SDK clients on the emulator, and what tests read or arrange through them.

use super::*;

/// SDK clients talking to the emulator directly (uncounted).
pub struct Aws {
    /// DynamoDB.
    pub dynamodb: aws_sdk_dynamodb::Client,
    /// S3.
    pub s3: aws_sdk_s3::Client,
    /// SQS.
    pub sqs: aws_sdk_sqs::Client,
    /// Step Functions.
    pub sfn: aws_sdk_sfn::Client,
}

impl Aws {
    /// Clients for the shared stack's emulator.
    pub async fn new() -> Self {
        let config = harness().stack.emulator_sdk_config().await;
        Aws {
            dynamodb: aws_sdk_dynamodb::Client::new(&config),
            s3: aws_sdk_s3::Client::new(&config),
            sqs: aws_sdk_sqs::Client::new(&config),
            sfn: aws_sdk_sfn::Client::new(&config),
        }
    }

    /// Every item in the job table that a submission of `owner`'s writes or that names the owner
    /// (job, idempotency, endpoint records — not progress records, which name their job's owner
    /// but are the running job's), by a full scan — fine for a test table.
    pub async fn items_of(
        &self,
        owner: &Owner,
    ) -> Vec<std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
        use aws_sdk_dynamodb::types::AttributeValue;
        let table = harness().stack.resource("JobsTable");
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .dynamodb
                .scan()
                .table_name(&table)
                // Progress records name their job's owner too (for the notifier), but they are
                // the running job's, not what a submission writes.
                .filter_expression(
                    "(#owner = :owner AND sk <> :progress) OR begins_with(pk, :idem)",
                )
                .expression_attribute_names("#owner", "owner")
                .expression_attribute_values(
                    ":progress",
                    AttributeValue::S(longhaul_aws::jobs::PROGRESS_SK.to_owned()),
                )
                .expression_attribute_values(":owner", AttributeValue::S(owner.to_string()))
                .expression_attribute_values(
                    ":idem",
                    // The idempotency records' prefix, as the store writes it (`IDEM#<len>:<owner>#`).
                    AttributeValue::S(longhaul_aws::jobs::idempotency_pk(owner, "")),
                )
                .set_exclusive_start_key(start)
                .send()
                .await
                .expect("scan");
            items.extend(page.items.unwrap_or_default());
            start = page.last_evaluated_key;
            if start.is_none() {
                return items;
            }
        }
    }

    /// Marks the job `expired` straight in the table, as the expirer's transition would (for
    /// tests of what clients see of an expired job, without running the expirer).
    pub async fn mark_expired(&self, job_id: &JobId) {
        use aws_sdk_dynamodb::types::AttributeValue;
        self.dynamodb
            .update_item()
            .table_name(harness().stack.resource("JobsTable"))
            .key("pk", AttributeValue::S(format!("JOB#{job_id}")))
            .key("sk", AttributeValue::S("JOB".into()))
            .update_expression("SET #s = :expired")
            .expression_attribute_names("#s", "status")
            .expression_attribute_values(":expired", AttributeValue::S("expired".into()))
            .send()
            .await
            .expect("mark the job expired");
    }

    /// The job's progress record, straight from the table.
    pub async fn progress_record(&self, job_id: &JobId) -> longhaul_aws::jobs::ProgressRecord {
        use aws_sdk_dynamodb::types::AttributeValue;
        let item = self
            .dynamodb
            .get_item()
            .table_name(harness().stack.resource("JobsTable"))
            .key("pk", AttributeValue::S(format!("JOB#{job_id}")))
            .key("sk", AttributeValue::S("PROGRESS".into()))
            .consistent_read(true)
            .send()
            .await
            .expect("get progress")
            .item
            .expect("a progress record");
        serde_dynamo::from_item(item).expect("a valid progress record")
    }

    /// Keys of the objects under `prefix` in the data bucket.
    pub async fn keys(&self, prefix: &str) -> Vec<String> {
        let page = self
            .s3
            .list_objects_v2()
            .bucket(harness().stack.resource("DataBucket"))
            .prefix(prefix)
            .send()
            .await
            .expect("list");
        page.contents().iter().filter_map(|o| o.key().map(str::to_owned)).collect()
    }

    fn execution_arn(execution: &str) -> String {
        harness().stack.resource("JobStateMachine").replace(":stateMachine:", ":execution:")
            + ":"
            + execution
    }

    /// The execution a job's `execution` (a dispatch's name) went on in: the one of that name,
    /// else the one its direct run handed the job over to (`<name>.h…`).
    async fn resolve(&self, execution: &str) -> String {
        if self.execution_exists(execution).await {
            return execution.to_owned();
        }
        let hand_over = format!("{execution}.h");
        self.executions_named(&hand_over)
            .await
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no execution {execution} nor a hand-over of its run"))
    }

    /// The names of the state machine's executions that start with `prefix` (a job id: the
    /// executions it ran in — its direct run's hand-over, and those continued from it).
    pub async fn executions_named(&self, prefix: &str) -> Vec<String> {
        let machine = harness().stack.resource("JobStateMachine");
        let listed = self
            .sfn
            .list_executions()
            .state_machine_arn(machine)
            .max_results(1000)
            .send()
            .await
            .expect("list executions");
        listed
            .executions()
            .iter()
            .map(|e| e.name().to_owned())
            .filter(|name| name.starts_with(prefix))
            .collect()
    }

    async fn history(&self, execution: &str) -> Vec<aws_sdk_sfn::types::HistoryEvent> {
        let execution = self.resolve(execution).await;
        let history = self
            .sfn
            .get_execution_history()
            .execution_arn(Self::execution_arn(&execution))
            .max_results(1000)
            .send()
            .await
            .expect("execution history");
        history.events().to_vec()
    }

    /// The names of the states whose Lambda task was scheduled, in order, in `execution` (a
    /// job's first dispatch is named by its id: the execution its direct run handed the job
    /// over to, `<id>.h…`, is found by it). The task states invoke the job's worker
    /// through the Lambda integration, `lambda:invoke`: a `TaskScheduled` event of resource
    /// type `lambda`.
    pub async fn scheduled_tasks(&self, execution: &str) -> Vec<String> {
        let mut state = String::new();
        let mut out = Vec::new();
        for event in self.history(execution).await {
            if let Some(entered) = event.state_entered_event_details() {
                state = entered.name().to_owned();
            }
            let lambda_task =
                event.task_scheduled_event_details().is_some_and(|t| t.resource_type() == "lambda");
            if event.r#type().as_str() == "LambdaFunctionScheduled" || lambda_task {
                out.push(state.clone());
            }
        }
        out
    }

    /// How many shard records the job has: its fanned-out stages' shards that the state
    /// machine's map ran, each in its own invocation (shards run inline keep none).
    pub async fn shard_records(&self, job_id: &str) -> usize {
        use aws_sdk_dynamodb::types::AttributeValue;
        let job_id: longhaul_domain::JobId = job_id.parse().expect("a job id");
        let page = self
            .dynamodb
            .query()
            .table_name(harness().stack.resource("JobsTable"))
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(
                ":pk",
                AttributeValue::S(longhaul_aws::jobs::shards_pk(&job_id)),
            )
            .consistent_read(true)
            .send()
            .await
            .expect("query shard records");
        page.items().len()
    }

    /// Whether an execution named `execution` exists: a job one invocation finishes runs as a
    /// direct run, with none (a job's first execution is named by its id).
    pub async fn execution_exists(&self, execution: &str) -> bool {
        let described = self
            .sfn
            .describe_execution()
            .execution_arn(Self::execution_arn(execution))
            .send()
            .await;
        match described {
            Ok(_) => true,
            Err(err) if err.as_service_error().is_some_and(|e| e.is_execution_does_not_exist()) => {
                false
            }
            Err(err) => panic!("describe execution {execution}: {err:?}"),
        }
    }

    /// The names of the states `execution` entered (each one a billed state transition), once
    /// it has ended (found as [`Self::scheduled_tasks`] finds it).
    pub async fn states_entered(&self, execution: &str) -> Vec<String> {
        let execution = self.resolve(execution).await;
        let execution = execution.as_str();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let described = self
                .sfn
                .describe_execution()
                .execution_arn(Self::execution_arn(execution))
                .send()
                .await
                .expect("execution");
            if described.status().as_str() != "RUNNING" {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "execution {execution} still running");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let history = self.history(execution).await;
        history
            .iter()
            .filter_map(|e| e.state_entered_event_details())
            .map(|d| d.name().to_owned())
            .collect()
    }
}

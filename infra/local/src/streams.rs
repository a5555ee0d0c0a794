//! DynamoDB stream event source mappings (`Type: DynamoDB` events): read the table's stream
//! from the emulator, filter, batch and invoke the function as Lambda does, with its retry,
//! bisection, partial-batch and on-failure semantics ([`shard`] keeps that bookkeeping).
//!
//! Like the SQS pollers, a mapping talks to the emulator directly: reading the stream is the
//! mapping's work, not the function's, so it is not counted in `/_local/aws-calls`. The
//! Streams API is called with raw JSON (the records already are in the attribute-value form
//! the Lambda event carries). Differences from AWS: the emulator's stream has a single shard
//! that never closes or trims, and the mapping polls it about every 250 ms when idle.
//!
//! With a state directory (`make dev`), the mapping's checkpoint — the last sequence number
//! done — is kept in `<state dir>/streams/<Function>.<Event>.json`, so a restarted stack that
//! adopts the running emulator resumes right after it: no record is replayed or skipped. A
//! checkpoint of another stream (a new emulator) is ignored and `StartingPosition` applies.

pub mod shard;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::faults::Faults;
use crate::filter::Pattern;
use crate::hosted::HostedFunction;
use crate::model::{EventSpec, StreamMappingSpec};
use crate::template::REGION;
use shard::{Next, Outcome, Policy, Shard};

/// How long an idle mapping waits before polling the stream again.
const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// Records asked for per `GetRecords` (the API's maximum) until a read fails.
const PAGE: usize = 1000;
/// The fewest records asked for per `GetRecords` (see [`smaller_page`]).
const MIN_PAGE: usize = 10;
/// First wait before retrying a failed batch; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between retries (AWS waits longer; locally, tests should not).
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Wait after the stream could not be read (the emulator restarting, a table being created).
const ERROR_WAIT: Duration = Duration::from_secs(1);

/// What every mapping needs besides its own specification.
#[derive(Clone)]
pub struct Environment {
    /// The emulator's URL (not the edge: the mapping's calls are not the function's).
    pub emulator_url: String,
    /// SQS on the emulator, for on-failure destinations.
    pub sqs: aws_sdk_sqs::Client,
    /// The fault injector (duplicate deliveries).
    pub faults: Arc<Faults>,
    /// Where checkpoints are kept (`None`: nowhere; every start begins at `StartingPosition`).
    pub state_dir: Option<PathBuf>,
}

/// Starts one poller per DynamoDB stream mapping of `functions`.
pub fn spawn(
    functions: &[HostedFunction],
    environment: &Environment,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for function in functions {
        for event in &function.spec.events {
            let EventSpec::DynamoDb(spec) = event else { continue };
            let mapping = Mapping {
                checkpoint_path: environment.state_dir.as_ref().map(|dir| {
                    dir.join("streams")
                        .join(format!("{}.{}.json", function.spec.logical, spec.name))
                }),
                function: function.clone(),
                spec: spec.clone(),
                emulator: Emulator {
                    http: reqwest::Client::new(),
                    url: environment.emulator_url.clone(),
                },
                sqs: environment.sqs.clone(),
                faults: environment.faults.clone(),
            };
            tasks.push(tokio::spawn(mapping.run()));
        }
    }
    tasks
}

/// The emulator's DynamoDB and DynamoDB Streams JSON APIs.
struct Emulator {
    http: reqwest::Client,
    url: String,
}

impl Emulator {
    async fn call(&self, target: &str, body: Value) -> anyhow::Result<Value> {
        // moto routes a request by the service its SigV4 credential scope names (and checks no
        // signature); a DynamoDB request's body does not name the service, so without this
        // header it would be taken for S3.
        let authorization = format!(
            "AWS4-HMAC-SHA256 Credential=longhaul/20200101/{REGION}/dynamodb/aws4_request, SignedHeaders=host, Signature=0"
        );
        let response = self
            .http
            .post(&self.url)
            .header("x-amz-target", target)
            .header("content-type", "application/x-amz-json-1.0")
            .header("authorization", authorization)
            .body(body.to_string())
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .with_context(|| format!("{target}: the emulator did not answer"))?;
        let status = response.status();
        let text =
            response.text().await.with_context(|| format!("{target}: reading the answer"))?;
        if !status.is_success() {
            bail!("{target}: {status}: {text}");
        }
        serde_json::from_str(&text)
            .with_context(|| format!("{target}: the answer is not JSON: {text}"))
    }

    /// The table's current stream ARN.
    async fn stream_arn(&self, table: &str) -> anyhow::Result<String> {
        let described =
            self.call("DynamoDB_20120810.DescribeTable", json!({ "TableName": table })).await?;
        described["Table"]["LatestStreamArn"].as_str().map(str::to_owned).ok_or_else(|| {
            anyhow!("table {table} has no stream (is its StreamSpecification provisioned?)")
        })
    }

    /// The stream's one shard.
    async fn shard_id(&self, stream_arn: &str) -> anyhow::Result<String> {
        let described = self
            .call("DynamoDBStreams_20120810.DescribeStream", json!({ "StreamArn": stream_arn }))
            .await?;
        let shards =
            described["StreamDescription"]["Shards"].as_array().cloned().unwrap_or_default();
        match shards.as_slice() {
            [shard] => shard["ShardId"]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| anyhow!("a shard without ShardId: {shard}")),
            _ => bail!(
                "stream {stream_arn} has {} shards; the local stack reads streams of exactly one",
                shards.len()
            ),
        }
    }

    async fn iterator(
        &self,
        stream_arn: &str,
        shard_id: &str,
        kind: &str,
        sequence: Option<&str>,
    ) -> anyhow::Result<String> {
        let mut request =
            json!({ "StreamArn": stream_arn, "ShardId": shard_id, "ShardIteratorType": kind });
        if let Some(sequence) = sequence {
            request["SequenceNumber"] = json!(sequence);
        }
        let answer = self.call("DynamoDBStreams_20120810.GetShardIterator", request).await?;
        answer["ShardIterator"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("GetShardIterator answered no iterator: {answer}"))
    }

    /// One page of records and the iterator after it (`None`: the shard is closed).
    async fn records(
        &self,
        iterator: &str,
        limit: usize,
    ) -> anyhow::Result<(Vec<Value>, Option<String>)> {
        let mut answer = self
            .call(
                "DynamoDBStreams_20120810.GetRecords",
                json!({ "ShardIterator": iterator, "Limit": limit }),
            )
            .await?;
        let records = match answer["Records"].take() {
            Value::Array(records) => records,
            Value::Null => Vec::new(),
            other => bail!("GetRecords answered Records = {other}"),
        };
        Ok((records, answer["NextShardIterator"].as_str().map(str::to_owned)))
    }
}

/// The page size after a `GetRecords` of `page` records failed. moto serialises a page of big
/// records slowly, and more slowly the busier it is: a page that took longer than the call's
/// timeout, asked for again at the same size, times out again while moto goes on serialising
/// every abandoned copy — at tens of thousands of writes the pollers kept moto busy with that
/// alone. So a failed read is retried with a quarter of the records, for good (the emulator
/// lives as long as the stack; a smaller page costs a few more calls).
fn smaller_page(page: usize) -> usize {
    (page / 4).max(MIN_PAGE)
}

/// A mapping's persisted position.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Checkpoint {
    stream_arn: String,
    shard_id: String,
    /// The last sequence number done.
    sequence_number: String,
}

fn load_checkpoint(path: &Path) -> Option<Checkpoint> {
    let text = std::fs::read_to_string(path).ok()?;
    match serde_json::from_str(&text) {
        Ok(checkpoint) => Some(checkpoint),
        Err(err) => {
            tracing::warn!(path = %path.display(), error = %err, "ignoring an unreadable stream checkpoint");
            None
        }
    }
}

/// Writes `checkpoint` atomically (a crash mid-write leaves the previous one).
fn save_checkpoint(path: &Path, checkpoint: &Checkpoint) -> anyhow::Result<()> {
    let dir = path.parent().ok_or_else(|| anyhow!("{} has no parent", path.display()))?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let temporary = path.with_extension("json.tmp");
    std::fs::write(&temporary, serde_json::to_vec(checkpoint)?)
        .with_context(|| format!("writing {}", temporary.display()))?;
    std::fs::rename(&temporary, path).with_context(|| format!("replacing {}", path.display()))
}

/// A stream record as the emulator's `GetRecords` returns it, in the form of a record of
/// Lambda's DynamoDB event; answers its sequence number too.
pub fn lambda_record(raw: &Value, stream_arn: &str) -> anyhow::Result<(String, Value)> {
    let mut change = raw["dynamodb"]
        .as_object()
        .cloned()
        .ok_or_else(|| anyhow!("a stream record without dynamodb: {raw}"))?;
    let sequence = change
        .get("SequenceNumber")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("a stream record without a SequenceNumber: {raw}"))?;
    // The Streams API answers epoch seconds with a fraction (moto: 1795355160.73); Lambda's
    // event carries whole seconds.
    if let Some(time) = change.get_mut("ApproximateCreationDateTime") {
        let seconds = match &*time {
            Value::Number(n) => n.as_f64().map(|s| s.floor() as i64),
            Value::String(s) => chrono::DateTime::parse_from_rfc3339(s).ok().map(|t| t.timestamp()),
            _ => None,
        };
        *time = seconds
            .map(Value::from)
            .ok_or_else(|| anyhow!("ApproximateCreationDateTime {time} is not a time"))?;
    }
    let record = json!({
        "eventID": raw["eventID"],
        "eventName": raw["eventName"],
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": raw["awsRegion"].as_str().unwrap_or(REGION),
        "eventSourceARN": stream_arn,
        "dynamodb": change,
    });
    Ok((sequence, record))
}

/// What Lambda sends to a stream mapping's on-failure destination for a batch it gave up on.
pub struct FailureRecord<'a> {
    /// The request id of the last invocation.
    pub request_id: &'a str,
    /// The function's ARN.
    pub function_arn: &'a str,
    /// Invocations of the batch.
    pub invocations: u32,
    /// `Unhandled` when the last invocation failed; `None` when it reported item failures.
    pub function_error: Option<&'a str>,
    /// The stream.
    pub stream_arn: &'a str,
    /// The shard.
    pub shard_id: &'a str,
    /// The batch given up on (event records, in order).
    pub batch: &'a [&'a Value],
    /// When it was given up.
    pub now: chrono::DateTime<chrono::Utc>,
}

impl FailureRecord<'_> {
    /// The message body, in AWS's shape.
    pub fn to_json(&self) -> Value {
        let sequence = |r: Option<&&Value>| {
            r.map(|r| r["dynamodb"]["SequenceNumber"].clone()).unwrap_or(Value::Null)
        };
        let arrival = |r: Option<&&Value>| {
            r.and_then(|r| r["dynamodb"]["ApproximateCreationDateTime"].as_i64())
                .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
                .map(|t| Value::from(t.format("%Y-%m-%dT%H:%M:%SZ").to_string()))
                .unwrap_or(Value::Null)
        };
        let mut response = json!({ "statusCode": 200, "executedVersion": "$LATEST" });
        if let Some(error) = self.function_error {
            response["functionError"] = json!(error);
        }
        json!({
            "requestContext": {
                "requestId": self.request_id,
                "functionArn": self.function_arn,
                "condition": "RetryAttemptsExhausted",
                "approximateInvokeCount": self.invocations,
            },
            "responseContext": response,
            "version": "1.0",
            "timestamp": self.now.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
            "DDBStreamBatchInfo": {
                "shardId": self.shard_id,
                "startSequenceNumber": sequence(self.batch.first()),
                "endSequenceNumber": sequence(self.batch.last()),
                "approximateArrivalOfFirstRecord": arrival(self.batch.first()),
                "approximateArrivalOfLastRecord": arrival(self.batch.last()),
                "batchSize": self.batch.len(),
                "streamArn": self.stream_arn,
            },
        })
    }
}

/// The `itemIdentifier`s a response reports as failed; `Err` when the response is not of
/// the documented shape (Lambda then treats the batch as failed).
fn item_failures(response: &Value) -> Result<Vec<Option<String>>, String> {
    match response.get("batchItemFailures") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(failures)) => Ok(failures
            .iter()
            .map(|f| f.get("itemIdentifier").and_then(Value::as_str).map(str::to_owned))
            .collect()),
        Some(other) => Err(format!("batchItemFailures is {other}")),
    }
}

/// A record's sequence number ("" for none), for logs.
fn sequence_of(record: Option<&Value>) -> &str {
    record.and_then(|r| r["dynamodb"]["SequenceNumber"].as_str()).unwrap_or_default()
}

fn backoff(consecutive_failures: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(1 << consecutive_failures.saturating_sub(1).min(16))
        .min(MAX_BACKOFF)
}

struct Mapping {
    function: HostedFunction,
    spec: StreamMappingSpec,
    emulator: Emulator,
    sqs: aws_sdk_sqs::Client,
    faults: Arc<Faults>,
    checkpoint_path: Option<PathBuf>,
}

/// A mapping's position on its stream.
struct Reader {
    stream_arn: String,
    shard_id: String,
    /// `None`: to be (re)opened.
    iterator: Option<String>,
    /// The last sequence number read (where a reopened iterator continues).
    read_through: Option<String>,
    shard: Shard,
    /// The checkpoint last written.
    saved: Option<String>,
    /// Failed invocations in a row (the retry backoff).
    consecutive_failures: u32,
    /// Records asked for per `GetRecords` (see [`smaller_page`]).
    page: usize,
}

/// Whether the mapping has more to do at once.
enum Step {
    Busy,
    Idle,
}

/// How the invocation(s) of a batch ended, for the bookkeeping and the on-failure record.
struct Invoked {
    outcome: Outcome,
    request_id: String,
    /// The error (type: message) when the invocation failed or answered nonsense.
    error: Option<String>,
}

impl Mapping {
    fn label(&self) -> String {
        format!("{}.{}", self.function.spec.logical, self.spec.name)
    }

    async fn run(self) {
        let mut reader = None;
        loop {
            match self.step(&mut reader).await {
                Ok(Step::Busy) => {}
                Ok(Step::Idle) => tokio::time::sleep(POLL_INTERVAL).await,
                Err(err) => {
                    let error = format!("{err:#}");
                    tracing::warn!(
                        mapping = self.label(),
                        table = self.spec.table_name,
                        error,
                        "reading the stream failed; retrying"
                    );
                    if let Some(reader) = &mut reader {
                        reader.iterator = None;
                    }
                    tokio::time::sleep(ERROR_WAIT).await;
                }
            }
        }
    }

    fn policy(&self) -> Policy {
        Policy {
            batch_size: self.spec.batch_size,
            maximum_retry_attempts: self.spec.maximum_retry_attempts,
            bisect: self.spec.bisect_batch_on_function_error,
        }
    }

    /// Finds the stream and where to resume on it.
    async fn open(&self) -> anyhow::Result<Reader> {
        let stream_arn = self.emulator.stream_arn(&self.spec.table_name).await?;
        let shard_id = self.emulator.shard_id(&stream_arn).await?;
        let checkpoint = self.checkpoint_path.as_deref().and_then(load_checkpoint);
        let done = match checkpoint {
            Some(c) if c.stream_arn == stream_arn && c.shard_id == shard_id => {
                tracing::info!(
                    mapping = self.label(),
                    sequence_number = c.sequence_number,
                    "resuming the stream after its checkpoint"
                );
                Some(c.sequence_number)
            }
            Some(c) => {
                tracing::info!(
                    mapping = self.label(),
                    old_stream = c.stream_arn,
                    "the checkpoint is of another stream (a new emulator); starting at {}",
                    self.spec.starting_position.iterator_type()
                );
                None
            }
            None => None,
        };
        Ok(Reader {
            stream_arn,
            shard_id,
            iterator: None,
            read_through: None,
            saved: done.clone(),
            shard: Shard::new(self.policy(), done),
            consecutive_failures: 0,
            page: PAGE,
        })
    }

    async fn step(&self, slot: &mut Option<Reader>) -> anyhow::Result<Step> {
        let reader = match slot {
            Some(reader) => reader,
            None => slot.insert(self.open().await?),
        };
        if reader.iterator.is_none() {
            // Reopening after an error: the table may have been recreated (a new stream).
            let current = self.emulator.stream_arn(&self.spec.table_name).await?;
            if current != reader.stream_arn {
                let (old, new) = (&reader.stream_arn, &current);
                tracing::warn!(
                    mapping = self.label(),
                    old,
                    new,
                    "the table has a new stream; starting over on it"
                );
                *slot = None;
                return Ok(Step::Busy);
            }
            let after = reader.read_through.as_deref().or(reader.shard.done());
            let iterator = match after {
                Some(sequence) => {
                    self.emulator
                        .iterator(
                            &reader.stream_arn,
                            &reader.shard_id,
                            "AFTER_SEQUENCE_NUMBER",
                            Some(sequence),
                        )
                        .await?
                }
                None => {
                    let kind = self.spec.starting_position.iterator_type();
                    self.emulator.iterator(&reader.stream_arn, &reader.shard_id, kind, None).await?
                }
            };
            reader.iterator = Some(iterator);
        }
        // Read until a full batch waits or the shard has nothing more.
        let mut caught_up = false;
        while reader.shard.wants_more() {
            let Some(iterator) = reader.iterator.as_deref() else {
                caught_up = true;
                break;
            };
            let (records, next) = match self.emulator.records(iterator, reader.page).await {
                Ok(page) => page,
                Err(err) => {
                    reader.page = smaller_page(reader.page);
                    return Err(err);
                }
            };
            for raw in &records {
                let (sequence, record) = lambda_record(raw, &reader.stream_arn)?;
                let passes = Pattern::any_matches(&self.spec.filters, &record);
                reader.read_through = Some(sequence.clone());
                reader.shard.push(sequence, passes.then_some(record));
            }
            if next.is_none() {
                tracing::warn!(mapping = self.label(), "the shard is closed; reopening it");
            }
            reader.iterator = next;
            if records.len() < reader.page {
                caught_up = true;
                break;
            }
        }
        self.save(reader);
        let batch: Vec<Value> =
            reader.shard.batch().into_iter().map(|(_, record)| record.clone()).collect();
        if batch.is_empty() {
            if reader.iterator.is_none() {
                // A closed shard (not something the emulator does): look for its successor later.
                return Err(anyhow!("the shard {} is closed", reader.shard_id));
            }
            return Ok(if caught_up { Step::Idle } else { Step::Busy });
        }
        let invoked = self.invoke(&batch).await;
        let (first, last) = (sequence_of(batch.first()), sequence_of(batch.last()));
        let function_error = invoked.error.is_some().then_some("Unhandled");
        match reader.shard.outcome(invoked.outcome) {
            Next::Done => {
                reader.consecutive_failures = 0;
                self.save(reader);
            }
            Next::Retry { attempts, bisected } => {
                reader.consecutive_failures += 1;
                let wait = backoff(reader.consecutive_failures);
                tracing::warn!(
                    mapping = self.label(),
                    batch_size = batch.len(),
                    first,
                    last,
                    attempts,
                    bisected,
                    error =
                        invoked.error.as_deref().unwrap_or("the function reported failed records"),
                    retry_in_ms = wait.as_millis() as u64,
                    "stream batch failed; retrying"
                );
                self.save(reader);
                tokio::time::sleep(wait).await;
            }
            Next::Exhausted => {
                let given_up: Vec<&Value> =
                    reader.shard.batch().into_iter().map(|(_, record)| record).collect();
                let record = FailureRecord {
                    request_id: &invoked.request_id,
                    function_arn: &crate::template::function_arn(&self.function.spec.name),
                    invocations: reader.shard.attempts(),
                    function_error,
                    stream_arn: &reader.stream_arn,
                    shard_id: &reader.shard_id,
                    batch: &given_up,
                    now: chrono::Utc::now(),
                };
                let message = record.to_json();
                self.dead_letter(&message).await;
                tracing::warn!(
                    mapping = self.label(),
                    batch_size = given_up.len(),
                    first = message["DDBStreamBatchInfo"]["startSequenceNumber"].as_str(),
                    last = message["DDBStreamBatchInfo"]["endSequenceNumber"].as_str(),
                    destination =
                        self.spec.on_failure.as_ref().map(|q| q.arn.as_str()).unwrap_or("none"),
                    error =
                        invoked.error.as_deref().unwrap_or("the function reported failed records"),
                    "stream batch failed after its retries; moving past it"
                );
                reader.shard.give_up();
                reader.consecutive_failures = 0;
                self.save(reader);
            }
        }
        Ok(Step::Busy)
    }

    /// Invokes the function with `batch` (twice at once when the fault plan says so: a batch
    /// is then done only if both invocations succeeded).
    async fn invoke(&self, batch: &[Value]) -> Invoked {
        let event = json!({ "Records": batch });
        let request_id = uuid::Uuid::new_v4().to_string();
        let responses = if self.faults.duplicate_delivery() {
            let (first, second) =
                futures::join!(self.function.invoke(event.clone()), self.function.invoke(event));
            vec![first, second]
        } else {
            vec![self.function.invoke(event).await]
        };
        let mut ids = Vec::new();
        for response in responses {
            match response {
                Err(diagnostic) => {
                    let error = format!("{}: {}", diagnostic.error_type, diagnostic.error_message);
                    return Invoked {
                        outcome: Outcome::FunctionError,
                        request_id,
                        error: Some(error),
                    };
                }
                Ok(_) if !self.spec.report_batch_item_failures => {}
                Ok(response) => match item_failures(&response) {
                    Ok(failed) => ids.extend(failed),
                    Err(error) => {
                        return Invoked {
                            outcome: Outcome::FunctionError,
                            request_id,
                            error: Some(error),
                        };
                    }
                },
            }
        }
        let outcome = if ids.is_empty() { Outcome::Success } else { Outcome::ItemFailures(ids) };
        Invoked { outcome, request_id, error: None }
    }

    /// Sends a failure record to the on-failure destination, retrying until it is taken: the
    /// batch is only moved past once its record is safe (without a destination, the warning
    /// is all there is, as on AWS).
    async fn dead_letter(&self, message: &Value) {
        let Some(destination) = &self.spec.on_failure else { return };
        let mut failures = 0;
        loop {
            match self
                .sqs
                .send_message()
                .queue_url(&destination.url)
                .message_body(message.to_string())
                .send()
                .await
            {
                Ok(_) => return,
                Err(err) => {
                    failures += 1;
                    let err =
                        longhaul_aws::AwsError::new("send to the on-failure destination", err);
                    let queue = &destination.url;
                    tracing::warn!(mapping = self.label(), queue, error = %err, "sending a stream failure record failed; retrying");
                    tokio::time::sleep(backoff(failures)).await;
                }
            }
        }
    }

    /// Persists the checkpoint if it moved (and there is a state directory).
    fn save(&self, reader: &mut Reader) {
        let (Some(path), Some(done)) = (&self.checkpoint_path, reader.shard.done()) else { return };
        if reader.saved.as_deref() == Some(done) {
            return;
        }
        let checkpoint = Checkpoint {
            stream_arn: reader.stream_arn.clone(),
            shard_id: reader.shard_id.clone(),
            sequence_number: done.to_owned(),
        };
        match save_checkpoint(path, &checkpoint) {
            Ok(()) => reader.saved = Some(checkpoint.sequence_number),
            Err(err) => tracing::warn!(
                mapping = self.label(),
                error = format!("{err:#}"),
                "saving the stream checkpoint failed"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_failed_read_asks_for_fewer_records_down_to_a_floor() {
        use super::{MIN_PAGE, PAGE, smaller_page};
        assert_eq!(smaller_page(PAGE), 250);
        assert_eq!(smaller_page(250), 62);
        assert_eq!(smaller_page(20), MIN_PAGE);
        assert_eq!(smaller_page(MIN_PAGE), MIN_PAGE);
    }

    use super::*;

    const STREAM: &str = "arn:aws:dynamodb:us-east-1:123456789012:table/longhaul-JobsTable/stream/2026-11-22T13:46:00.718859";

    /// A record as moto's GetRecords answers it (captured from moto 5.2.5).
    fn moto_record() -> Value {
        json!({
            "eventID": "a09b595a13cf427ab082fdfe7ee09481",
            "eventName": "MODIFY",
            "eventVersion": "1.0",
            "eventSource": "aws:dynamodb",
            "awsRegion": "us-east-1",
            "dynamodb": {
                "ApproximateCreationDateTime": 1795355160.754,
                "Keys": {"pk": {"S": "JOB#1"}, "sk": {"S": "JOB"}},
                "NewImage": {"pk": {"S": "JOB#1"}, "sk": {"S": "JOB"}, "status": {"S": "succeeded"}, "attempt": {"N": "1"},
                             "tags": {"L": [{"S": "x"}]}, "callback_url": {"S": "https://partner.example.com/hook"}},
                "OldImage": {"pk": {"S": "JOB#1"}, "sk": {"S": "JOB"}, "status": {"S": "running"}, "attempt": {"N": "1"}},
                "SequenceNumber": "1100000000017454423010",
                "SizeBytes": 293,
                "StreamViewType": "NEW_AND_OLD_IMAGES"
            }
        })
    }

    #[test]
    fn a_moto_record_becomes_a_lambda_record_that_the_typed_event_reads() {
        let (sequence, record) = lambda_record(&moto_record(), STREAM).unwrap();
        assert_eq!(sequence, "1100000000017454423010");
        assert_eq!(record["eventVersion"], "1.1");
        assert_eq!(record["eventSourceARN"], STREAM);
        assert_eq!(record["dynamodb"]["ApproximateCreationDateTime"], json!(1795355160));
        let event: aws_lambda_events::dynamodb::Event =
            serde_json::from_value(json!({ "Records": [record] })).unwrap();
        let record = &event.records[0];
        assert_eq!(
            (record.event_name.as_str(), record.event_id.as_str()),
            ("MODIFY", "a09b595a13cf427ab082fdfe7ee09481")
        );
        assert_eq!(record.event_source_arn.as_deref(), Some(STREAM));
        assert_eq!(record.change.approximate_creation_date_time.timestamp(), 1795355160);
        assert_eq!(record.change.sequence_number.as_deref(), Some("1100000000017454423010"));
        assert_eq!(
            record.change.new_image.get("status"),
            Some(&serde_dynamo::AttributeValue::S("succeeded".into()))
        );
        assert_eq!(record.change.old_image.len(), 4);
        assert_eq!(record.change.keys.len(), 2);
    }

    #[test]
    fn records_of_every_kind_and_an_iso_time_convert() {
        let mut insert = moto_record();
        insert["eventName"] = json!("INSERT");
        insert["dynamodb"].as_object_mut().unwrap().remove("OldImage");
        insert["dynamodb"]["ApproximateCreationDateTime"] = json!("2026-11-22T13:46:00Z");
        let mut remove = moto_record();
        remove["eventName"] = json!("REMOVE");
        remove["dynamodb"].as_object_mut().unwrap().remove("NewImage");
        let records: Vec<Value> =
            [insert, remove].iter().map(|r| lambda_record(r, STREAM).unwrap().1).collect();
        let event: aws_lambda_events::dynamodb::Event =
            serde_json::from_value(json!({ "Records": records })).unwrap();
        assert!(
            event.records[0].change.old_image.is_empty()
                && event.records[1].change.new_image.is_empty()
        );
        assert_eq!(
            event.records[0].change.approximate_creation_date_time.to_rfc3339(),
            "2026-11-22T13:46:00+00:00"
        );
    }

    #[test]
    fn a_record_without_a_sequence_number_is_an_error_not_a_silent_drop() {
        let mut raw = moto_record();
        raw["dynamodb"].as_object_mut().unwrap().remove("SequenceNumber");
        assert!(lambda_record(&raw, STREAM).is_err());
        assert!(lambda_record(&json!({"eventName": "INSERT"}), STREAM).is_err());
    }

    #[test]
    fn the_notifier_filter_applies_to_converted_records() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml");
        let template = crate::template::Template::load(
            &path,
            "longhaul",
            "http://e",
            "http://a",
            &Default::default(),
        )
        .unwrap();
        let functions = crate::model::functions(&template).unwrap();
        let notifier = functions.iter().find(|f| f.logical == "NotifierFunction").unwrap();
        let [EventSpec::DynamoDb(spec)] = notifier.events.as_slice() else { panic!() };
        let (_, record) = lambda_record(&moto_record(), STREAM).unwrap();
        assert!(Pattern::any_matches(&spec.filters, &record));
        let mut progress = moto_record();
        progress["dynamodb"]["Keys"]["sk"] = json!({"S": "PROGRESS"});
        assert!(!Pattern::any_matches(&spec.filters, &lambda_record(&progress, STREAM).unwrap().1));
    }

    #[test]
    fn the_failure_record_has_aws_shape() {
        let (_, first) = lambda_record(&moto_record(), STREAM).unwrap();
        let mut raw = moto_record();
        raw["dynamodb"]["SequenceNumber"] = json!("1100000000017454423012");
        raw["dynamodb"]["ApproximateCreationDateTime"] = json!(1795355170.1);
        let (_, last) = lambda_record(&raw, STREAM).unwrap();
        let now =
            chrono::DateTime::parse_from_rfc3339("2026-11-22T13:50:00.123Z").unwrap().to_utc();
        let record = FailureRecord {
            request_id: "r1",
            function_arn: "arn:aws:lambda:us-east-1:123456789012:function:longhaul-NotifierFunction",
            invocations: 11,
            function_error: Some("Unhandled"),
            stream_arn: STREAM,
            shard_id: "shardId-1",
            batch: &[&first, &last],
            now,
        };
        assert_eq!(
            record.to_json(),
            json!({
                "requestContext": {
                    "requestId": "r1",
                    "functionArn": "arn:aws:lambda:us-east-1:123456789012:function:longhaul-NotifierFunction",
                    "condition": "RetryAttemptsExhausted",
                    "approximateInvokeCount": 11
                },
                "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
                "version": "1.0",
                "timestamp": "2026-11-22T13:50:00.123Z",
                "DDBStreamBatchInfo": {
                    "shardId": "shardId-1",
                    "startSequenceNumber": "1100000000017454423010",
                    "endSequenceNumber": "1100000000017454423012",
                    "approximateArrivalOfFirstRecord": "2026-11-22T13:46:00Z",
                    "approximateArrivalOfLastRecord": "2026-11-22T13:46:10Z",
                    "batchSize": 2,
                    "streamArn": STREAM
                }
            })
        );
        let partial = FailureRecord { function_error: None, ..record };
        assert!(partial.to_json()["responseContext"].get("functionError").is_none());
    }

    #[test]
    fn responses_are_read_as_lambda_reads_them() {
        assert_eq!(item_failures(&json!({})), Ok(vec![]));
        assert_eq!(item_failures(&Value::Null), Ok(vec![]));
        assert_eq!(item_failures(&json!({"batchItemFailures": null})), Ok(vec![]));
        assert_eq!(
            item_failures(
                &json!({"batchItemFailures": [{"itemIdentifier": "7"}, {"itemIdentifier": null}, {}]})
            ),
            Ok(vec![Some("7".into()), None, None])
        );
        assert!(item_failures(&json!({"batchItemFailures": "7"})).is_err());
    }

    #[test]
    fn backoff_doubles_from_100_ms_to_2_s() {
        let waits: Vec<u128> = (1..=7).map(|n| backoff(n).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }

    #[test]
    fn checkpoints_survive_a_round_trip_and_replace_atomically() {
        let dir = std::env::temp_dir().join(format!("longhaul-streams-{}", uuid::Uuid::new_v4()));
        let path = dir.join("streams").join("F.E.json");
        assert_eq!(load_checkpoint(&path), None);
        let checkpoint = Checkpoint {
            stream_arn: STREAM.into(),
            shard_id: "s".into(),
            sequence_number: "42".into(),
        };
        save_checkpoint(&path, &checkpoint).unwrap();
        save_checkpoint(&path, &Checkpoint { sequence_number: "43".into(), ..checkpoint.clone() })
            .unwrap();
        assert_eq!(load_checkpoint(&path).unwrap().sequence_number, "43");
        std::fs::write(&path, "garbage").unwrap();
        assert_eq!(load_checkpoint(&path), None);
        std::fs::remove_dir_all(dir).ok();
    }
}

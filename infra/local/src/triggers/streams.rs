//! DynamoDB stream event source mappings (`Type: DynamoDB` events): read the table's stream
//! from the emulator, filter, batch and invoke the function as Lambda does, with its retry,
//! bisection, partial-batch and on-failure semantics ([`shard`] keeps that bookkeeping; `api` reads the stream, `records` converts its
//! records, `checkpoint` keeps the mapping's position).
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

mod api;
mod checkpoint;
mod records;
pub mod shard;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use serde_json::{Value, json};

use crate::checks::faults::Faults;
use crate::hosting::hosted::HostedFunction;
use crate::stack::model::{EventSpec, StreamMappingSpec};
use crate::triggers::filter::Pattern;
use api::{Emulator, PAGE, smaller_page};
use checkpoint::{Checkpoint, load_checkpoint, save_checkpoint};
pub use records::{FailureRecord, lambda_record};
use records::{item_failures, sequence_of};
use shard::{Next, Outcome, Policy, Shard};

/// How long an idle mapping waits before polling the stream again.
const POLL_INTERVAL: Duration = Duration::from_millis(250);
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
                    function_arn: &crate::stack::template::function_arn(&self.function.spec.name),
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
    use super::*;

    #[test]
    fn backoff_doubles_from_100_ms_to_2_s() {
        let waits: Vec<u128> = (1..=7).map(|n| backoff(n).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }
}

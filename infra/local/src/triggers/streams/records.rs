//! Stream records as Lambda hands them to a function, and what it sends to an on-failure
//! destination; reading the function's answer.

use anyhow::anyhow;
use serde_json::{Value, json};

use crate::stack::template::REGION;

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
pub(super) fn item_failures(response: &Value) -> Result<Vec<Option<String>>, String> {
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
pub(super) fn sequence_of(record: Option<&Value>) -> &str {
    record.and_then(|r| r["dynamodb"]["SequenceNumber"].as_str()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack::model::EventSpec;
    use crate::stack::template::real_template;
    use crate::triggers::filter::Pattern;

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
        let functions = crate::stack::model::functions(&real_template()).unwrap();
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
}

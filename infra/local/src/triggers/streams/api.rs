//! The emulator's DynamoDB and DynamoDB Streams JSON APIs, as a stream mapping calls them.

use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use serde_json::{Value, json};

use crate::stack::template::REGION;

/// Records asked for per `GetRecords` (the API's maximum) until a read fails.
pub(super) const PAGE: usize = 1000;
/// The fewest records asked for per `GetRecords` (see [`smaller_page`]).
const MIN_PAGE: usize = 10;

/// The emulator's DynamoDB and DynamoDB Streams JSON APIs.
pub(super) struct Emulator {
    pub(super) http: reqwest::Client,
    pub(super) url: String,
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
    pub(super) async fn stream_arn(&self, table: &str) -> anyhow::Result<String> {
        let described =
            self.call("DynamoDB_20120810.DescribeTable", json!({ "TableName": table })).await?;
        described["Table"]["LatestStreamArn"].as_str().map(str::to_owned).ok_or_else(|| {
            anyhow!("table {table} has no stream (is its StreamSpecification provisioned?)")
        })
    }

    /// The stream's one shard.
    pub(super) async fn shard_id(&self, stream_arn: &str) -> anyhow::Result<String> {
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

    pub(super) async fn iterator(
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
    pub(super) async fn records(
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
pub(super) fn smaller_page(page: usize) -> usize {
    (page / 4).max(MIN_PAGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_read_asks_for_fewer_records_down_to_a_floor() {
        assert_eq!(smaller_page(PAGE), 250);
        assert_eq!(smaller_page(250), 62);
        assert_eq!(smaller_page(20), MIN_PAGE);
        assert_eq!(smaller_page(MIN_PAGE), MIN_PAGE);
    }
}

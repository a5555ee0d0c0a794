//! The IAM accesses an AWS request needs, per service: the actions, the resources and the
//! condition keys (`dynamodb:LeadingKeys`, `s3:prefix`, `iam:PassedToService`) IAM would
//! judge.

use std::collections::BTreeMap;

use anyhow::{Context, anyhow, bail};
use axum::http::{HeaderMap, Method, Uri};
use percent_encoding::percent_decode_str;
use serde_json::Value;

use super::{Access, Policies};
use crate::stack::template::{ACCOUNT, REGION};

impl Policies {
    /// The IAM accesses an AWS request needs (`operation` as the edge classified it).
    pub fn accesses(
        &self,
        operation: &str,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &[u8],
    ) -> anyhow::Result<Vec<Access>> {
        let (service, op) =
            operation.split_once(':').ok_or_else(|| anyhow!("unclassified request {operation}"))?;
        match service {
            "dynamodb" => self.dynamodb(op, body),
            "sqs" => sqs(op, body),
            "states" => states(op, body),
            "secretsmanager" => secretsmanager(op, body),
            "s3" => s3(op, method, uri, headers, body),
            "scheduler" => scheduler(op, uri, body),
            _ => bail!("the local IAM check does not know the service of {operation}"),
        }
    }

    fn dynamodb(&self, op: &str, body: &[u8]) -> anyhow::Result<Vec<Access>> {
        let body: Value = serde_json::from_slice(body).context("a DynamoDB request body")?;
        let table_arn = |name: &str| format!("arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{name}");
        // AWS always knows a keyed request's partition key; a request whose key this check
        // cannot read is refused, never allowed for want of the condition key (a
        // `ForAllValues` condition over a missing key would hold vacuously).
        let keyed = |action: &str, table: &str, key: &Value| -> anyhow::Result<Access> {
            let arn = table_arn(table);
            let access = Access::new(format!("dynamodb:{action}"), arn.clone());
            let Some(hash_key) = self.hash_keys.get(&arn) else { return Ok(access) };
            let leading = key[hash_key.as_str()].as_object().and_then(scalar).ok_or_else(|| {
                anyhow!("dynamodb:{action} on {table} without a string {hash_key}")
            })?;
            Ok(access.with("dynamodb:LeadingKeys", vec![leading]))
        };
        let table = || {
            body["TableName"].as_str().ok_or_else(|| anyhow!("dynamodb:{op} without a TableName"))
        };
        Ok(match op {
            "GetItem" | "UpdateItem" | "DeleteItem" => vec![keyed(op, table()?, &body["Key"])?],
            "PutItem" => vec![keyed(op, table()?, &body["Item"])?],
            "Query" | "Scan" => {
                let mut arn = table_arn(table()?);
                if let Some(index) = body["IndexName"].as_str() {
                    arn = format!("{arn}/index/{index}");
                }
                let access = Access::new(format!("dynamodb:{op}"), arn.clone());
                match (op, self.hash_keys.get(&arn)) {
                    ("Query", Some(key)) => {
                        let value = query_partition(&body, key)
                            .ok_or_else(|| anyhow!("a Query whose {key} this check cannot read"))?;
                        vec![access.with("dynamodb:LeadingKeys", vec![value])]
                    }
                    _ => vec![access],
                }
            }
            "BatchGetItem" | "BatchWriteItem" => {
                let mut out = Vec::new();
                for (table, request) in body["RequestItems"].as_object().into_iter().flatten() {
                    let keys: Vec<&Value> = if op == "BatchGetItem" {
                        request["Keys"].as_array().into_iter().flatten().collect()
                    } else {
                        request
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|r| {
                                if r["PutRequest"].is_object() {
                                    &r["PutRequest"]["Item"]
                                } else {
                                    &r["DeleteRequest"]["Key"]
                                }
                            })
                            .collect()
                    };
                    for key in keys {
                        out.push(keyed(op, table, key)?);
                    }
                }
                out
            }
            "TransactWriteItems" | "TransactGetItems" => {
                let mut out = Vec::new();
                for item in body["TransactItems"].as_array().into_iter().flatten() {
                    let (kind, inner) = item
                        .as_object()
                        .and_then(|o| o.iter().next())
                        .ok_or_else(|| anyhow!("an empty transaction item"))?;
                    let action = match kind.as_str() {
                        "Put" => "PutItem",
                        "Update" => "UpdateItem",
                        "Delete" => "DeleteItem",
                        "ConditionCheck" => "ConditionCheckItem",
                        "Get" => "GetItem",
                        other => bail!("transaction item {other}"),
                    };
                    let table = inner["TableName"]
                        .as_str()
                        .ok_or_else(|| anyhow!("a transaction item without a TableName"))?;
                    let key = if kind == "Put" { &inner["Item"] } else { &inner["Key"] };
                    out.push(keyed(action, table, key)?);
                }
                out
            }
            "DescribeTable" | "DescribeTimeToLive" | "DescribeContinuousBackups" => {
                vec![Access::new(format!("dynamodb:{op}"), table_arn(table()?))]
            }
            "ListTables" => vec![Access::new("dynamodb:ListTables", "*")],
            other => bail!("the local IAM check does not model dynamodb:{other}"),
        })
    }
}

/// The string form of a DynamoDB scalar attribute value (`{"S": "x"}`).
fn scalar(value: &serde_json::Map<String, Value>) -> Option<String> {
    let (_, inner) = value.iter().next()?;
    inner.as_str().map(str::to_owned)
}

/// The partition key value a Query names: `<key> = :value` in its key condition.
fn query_partition(body: &Value, key: &str) -> Option<String> {
    let expression = body["KeyConditionExpression"].as_str()?;
    let names = &body["ExpressionAttributeNames"];
    let upper = expression.to_ascii_uppercase();
    let mut clauses = Vec::new();
    let mut start = 0;
    for (at, _) in upper.match_indices(" AND ") {
        clauses.push(&expression[start..at]);
        start = at + " AND ".len();
    }
    clauses.push(&expression[start..]);
    clauses.into_iter().find_map(|clause| {
        let (left, right) = clause.split_once('=')?;
        let left = left.trim().trim_start_matches('(');
        let name = if left.starts_with('#') { names[left].as_str()? } else { left };
        if name != key {
            return None;
        }
        let placeholder = right.trim().trim_end_matches(')');
        body["ExpressionAttributeValues"][placeholder].as_object().and_then(scalar)
    })
}

fn sqs(op: &str, body: &[u8]) -> anyhow::Result<Vec<Access>> {
    let body: Value =
        serde_json::from_slice(body).context("an SQS request body (AWS JSON protocol)")?;
    // Batch calls are authorised by their single-message action.
    let action = format!("sqs:{}", op.strip_suffix("Batch").unwrap_or(op));
    let resource = if let Some(url) = body["QueueUrl"].as_str() {
        let mut segments = url.trim_end_matches('/').rsplit('/');
        let (name, account) =
            (segments.next().unwrap_or_default(), segments.next().unwrap_or_default());
        format!("arn:aws:sqs:{REGION}:{account}:{name}")
    } else if let Some(name) = body["QueueName"].as_str() {
        format!("arn:aws:sqs:{REGION}:{ACCOUNT}:{name}")
    } else {
        "*".into()
    };
    Ok(vec![Access::new(action, resource)])
}

fn states(op: &str, body: &[u8]) -> anyhow::Result<Vec<Access>> {
    let body: Value = serde_json::from_slice(body).context("a Step Functions request body")?;
    let resource =
        ["executionArn", "stateMachineArn"].iter().find_map(|k| body[*k].as_str()).unwrap_or("*");
    Ok(vec![Access::new(format!("states:{op}"), resource)])
}

/// A Secrets Manager request acts on the secret its `SecretId` names (an ARN here: the
/// functions are given their secrets' ARNs).
fn secretsmanager(op: &str, body: &[u8]) -> anyhow::Result<Vec<Access>> {
    let body: Value = serde_json::from_slice(body).context("a Secrets Manager request body")?;
    let secret = body["SecretId"]
        .as_str()
        .ok_or_else(|| anyhow!("secretsmanager:{op} without a SecretId"))?;
    Ok(vec![Access::new(format!("secretsmanager:{op}"), secret)])
}

/// An EventBridge Scheduler request (REST-JSON: the schedule's name in the path, its group in
/// the body or the `groupName` query) acts on `schedule/<group>/<name>`. A schedule created
/// or updated with a target role also passes that role to Scheduler: `iam:PassRole` on it,
/// with `iam:PassedToService` `scheduler.amazonaws.com` — Scheduler refuses the call without
/// it, whatever the caller's scheduler permissions.
fn scheduler(op: &str, uri: &Uri, body: &[u8]) -> anyhow::Result<Vec<Access>> {
    let segments: Vec<&str> = uri.path().trim_start_matches('/').split('/').collect();
    let name = || -> anyhow::Result<String> {
        let name = segments.get(1).ok_or_else(|| anyhow!("scheduler:{op} without a name"))?;
        Ok(percent_decode_str(name).decode_utf8_lossy().into_owned())
    };
    let query = || -> BTreeMap<String, String> {
        url::form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect()
    };
    let body = || -> anyhow::Result<Value> {
        if body.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(body).context("an EventBridge Scheduler request body")
    };
    let schedule = |group: Option<&str>, name: &str| {
        let group = group.unwrap_or("default");
        format!("arn:aws:scheduler:{REGION}:{ACCOUNT}:schedule/{group}/{name}")
    };
    let action = format!("scheduler:{op}");
    Ok(match op {
        "CreateSchedule" | "UpdateSchedule" => {
            let body = body()?;
            if body.get("KmsKeyArn").is_some_and(|k| !k.is_null()) {
                bail!("the local IAM check does not model schedules encrypted with a KMS key");
            }
            let mut accesses =
                vec![Access::new(action, schedule(body["GroupName"].as_str(), &name()?))];
            if let Some(role) = body["Target"]["RoleArn"].as_str() {
                accesses.push(
                    Access::new("iam:PassRole", role)
                        .with("iam:PassedToService", vec![super::SCHEDULER_SERVICE.to_owned()]),
                );
            }
            accesses
        }
        "GetSchedule" | "DeleteSchedule" => {
            vec![Access::new(
                action,
                schedule(query().get("groupName").map(String::as_str), &name()?),
            )]
        }
        "ListSchedules" | "ListScheduleGroups" => vec![Access::new(action, "*")],
        "CreateScheduleGroup" | "GetScheduleGroup" | "DeleteScheduleGroup" => vec![Access::new(
            action,
            format!("arn:aws:scheduler:{REGION}:{ACCOUNT}:schedule-group/{}", name()?),
        )],
        other => bail!("the local IAM check does not model scheduler:{other}"),
    })
}

fn s3(
    op: &str,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> anyhow::Result<Vec<Access>> {
    let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
    let path = uri.path().trim_start_matches('/');
    let (bucket, key) = s3_path(uri);
    let key = decode(key);
    let object = |key: &str| format!("arn:aws:s3:::{bucket}/{key}");
    let bucket_arn = format!("arn:aws:s3:::{bucket}");
    let query: BTreeMap<String, String> =
        url::form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let copy_source = || -> anyhow::Result<Access> {
        let source = headers
            .get("x-amz-copy-source")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| anyhow!("a copy without a source"))?;
        let source = decode(source.split('?').next().unwrap_or(source));
        Ok(Access::new("s3:GetObject", format!("arn:aws:s3:::{}", source.trim_start_matches('/'))))
    };
    // Sub-resources (`?tagging`, `?acl`, `?versionId`, `?location`…) are other IAM actions:
    // refuse what this check does not name rather than judge it as the plain operation.
    const KNOWN: [&str; 17] = [
        "x-id",
        "max-parts",
        "part-number-marker",
        "list-type",
        "prefix",
        "delimiter",
        "max-keys",
        "continuation-token",
        "start-after",
        "encoding-type",
        "fetch-owner",
        "partNumber",
        "uploadId",
        "uploads",
        "delete",
        "marker",
        "response-content-disposition",
    ];
    if let Some(unknown) =
        query.keys().find(|k| !k.starts_with("X-Amz-") && !KNOWN.contains(&k.as_str()))
    {
        bail!("the local IAM check does not model S3 sub-resource ?{unknown} ({method} /{path})");
    }
    if headers.contains_key("x-amz-copy-source") && op == "UploadPart" {
        bail!("the local IAM check does not model UploadPartCopy");
    }
    Ok(match op {
        "GetObject" | "HeadObject" => vec![Access::new("s3:GetObject", object(&key))],
        "PutObject" | "UploadPart" | "CreateMultipartUpload" | "CompleteMultipartUpload" => {
            vec![Access::new("s3:PutObject", object(&key))]
        }
        "CopyObject" => vec![Access::new("s3:PutObject", object(&key)), copy_source()?],
        "DeleteObject" => vec![Access::new("s3:DeleteObject", object(&key))],
        "AbortMultipartUpload" => vec![Access::new("s3:AbortMultipartUpload", object(&key))],
        "ListParts" => vec![Access::new("s3:ListMultipartUploadParts", object(&key))],
        "DeleteObjects" => {
            // <Delete><Object><Key>k</Key></Object>…</Delete>: every key needs DeleteObject.
            let text = String::from_utf8_lossy(body);
            text.split("<Key>")
                .skip(1)
                .filter_map(|rest| rest.split_once("</Key>").map(|(k, _)| xml_unescape(k)))
                .map(|k| Access::new("s3:DeleteObject", object(&k)))
                .collect()
        }
        "ListObjectsV2" | "ListObjects" | "HeadBucket" => {
            let access = Access::new("s3:ListBucket", bucket_arn);
            if method == Method::HEAD {
                vec![access]
            } else {
                // A listing without `prefix` carries no `s3:prefix` key (so no prefix condition
                // grants it).
                match query.get("prefix") {
                    Some(prefix) => vec![access.with("s3:prefix", vec![prefix.clone()])],
                    None => vec![access],
                }
            }
        }
        "CreateBucket" => vec![Access::new("s3:CreateBucket", bucket_arn)],
        "DeleteBucket" => vec![Access::new("s3:DeleteBucket", bucket_arn)],
        other => bail!("the local IAM check does not model s3:{other} ({method} /{path})"),
    })
}

/// The bucket and the (still percent-encoded) key of a path-style S3 request.
pub(super) fn s3_path(uri: &Uri) -> (&str, &str) {
    let path = uri.path().trim_start_matches('/');
    path.split_once('/').unwrap_or((path, ""))
}

fn xml_unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

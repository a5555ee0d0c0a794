//! Names an AWS request `service:Operation` (the call meter's and the fault plan's key), from
//! its signature and protocol. A leaf: the edge counts by it, the fault plan aims by it.

use axum::http::{HeaderMap, Method};

use crate::checks::iam::Credential;

/// Names an AWS request `service:Operation`: from `X-Amz-Target` for JSON protocols
/// (DynamoDB, SQS, Step Functions), from the method and path for the REST protocols of S3,
/// EventBridge Scheduler and Lambda's `Invoke` (the name the edge counts it by, so a fault
/// plan aims at it by that name too).
pub fn classify(method: &Method, uri: &axum::http::Uri, headers: &HeaderMap) -> String {
    let service = Credential::of(uri, headers).map_or_else(|| "unknown".into(), |c| c.service);
    if let Some(target) = headers.get("x-amz-target").and_then(|v| v.to_str().ok()) {
        let operation = target.rsplit('.').next().unwrap_or(target);
        return format!("{service}:{operation}");
    }
    if service == "s3" {
        return format!("s3:{}", s3_operation(method, uri, headers));
    }
    if service == "scheduler"
        && let Some(operation) = scheduler_operation(method, uri.path())
    {
        return format!("scheduler:{operation}");
    }
    if service == "lambda" && method == Method::POST && is_invocation(uri.path()) {
        return "lambda:Invoke".into();
    }
    format!("{service}:{} {}", method, uri.path())
}

/// EventBridge Scheduler's REST-JSON operations on schedules and schedule groups (its API
/// reference's request syntax: `POST /schedules/{Name}` creates, `PUT` updates…).
fn scheduler_operation(method: &Method, path: &str) -> Option<&'static str> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    Some(match (method.as_str(), segments.as_slice()) {
        ("GET", ["schedules"]) => "ListSchedules",
        ("POST", ["schedules", _]) => "CreateSchedule",
        ("PUT", ["schedules", _]) => "UpdateSchedule",
        ("GET", ["schedules", _]) => "GetSchedule",
        ("DELETE", ["schedules", _]) => "DeleteSchedule",
        ("GET", ["schedule-groups"]) => "ListScheduleGroups",
        ("POST", ["schedule-groups", _]) => "CreateScheduleGroup",
        ("GET", ["schedule-groups", _]) => "GetScheduleGroup",
        ("DELETE", ["schedule-groups", _]) => "DeleteScheduleGroup",
        _ => return None,
    })
}

/// Lambda's `Invoke`: `POST /2015-03-31/functions/{FunctionName}/invocations`.
fn is_invocation(path: &str) -> bool {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    matches!(segments.as_slice(), ["2015-03-31", "functions", name, "invocations"] if !name.is_empty())
}

fn s3_operation(method: &Method, uri: &axum::http::Uri, headers: &HeaderMap) -> &'static str {
    let segments: Vec<&str> = uri.path().trim_start_matches('/').splitn(2, '/').collect();
    let has_key = segments.len() == 2 && !segments[1].is_empty();
    let query = uri.query().unwrap_or_default();
    let has =
        |name: &str| query.split('&').any(|kv| kv == name || kv.starts_with(&format!("{name}=")));
    match (method.as_str(), has_key) {
        ("GET", true) if has("uploadId") => "ListParts",
        ("GET", true) => "GetObject",
        ("HEAD", true) => "HeadObject",
        ("PUT", true) if has("partNumber") => "UploadPart",
        ("PUT", true) if headers.contains_key("x-amz-copy-source") => "CopyObject",
        ("PUT", true) => "PutObject",
        ("DELETE", true) if has("uploadId") => "AbortMultipartUpload",
        ("DELETE", true) => "DeleteObject",
        ("POST", true) if has("uploads") => "CreateMultipartUpload",
        ("POST", true) if has("uploadId") => "CompleteMultipartUpload",
        ("POST", false) if has("delete") => "DeleteObjects",
        ("GET", false) if has("list-type") => "ListObjectsV2",
        ("GET", false) => "ListObjects",
        ("HEAD", false) => "HeadBucket",
        ("PUT", false) => "CreateBucket",
        ("DELETE", false) => "DeleteBucket",
        _ => "Other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=test/20261122/us-east-1/dynamodb/aws4_request, SignedHeaders=x".parse().unwrap(),
        );
        headers.insert("x-amz-target", "DynamoDB_20120810.PutItem".parse().unwrap());
        assert_eq!(classify(&Method::POST, &"/".parse().unwrap(), &headers), "dynamodb:PutItem");
        let mut headers = HeaderMap::new();
        headers.insert(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=test/20261122/us-east-1/s3/aws4_request, SignedHeaders=x"
                .parse()
                .unwrap(),
        );
        assert_eq!(
            classify(&Method::PUT, &"/bucket/results/x".parse().unwrap(), &headers),
            "s3:PutObject"
        );
        assert_eq!(
            classify(&Method::GET, &"/bucket/k?x-id=GetObject".parse().unwrap(), &headers),
            "s3:GetObject"
        );
        assert_eq!(
            classify(&Method::GET, &"/bucket?list-type=2".parse().unwrap(), &headers),
            "s3:ListObjectsV2"
        );
        assert_eq!(
            classify(
                &Method::GET,
                &"/bucket/k?x-id=ListParts&uploadId=u".parse().unwrap(),
                &headers
            ),
            "s3:ListParts"
        );
        let mut headers = HeaderMap::new();
        headers.insert(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=k/20261122/us-east-1/scheduler/aws4_request, SignedHeaders=x"
                .parse()
                .unwrap(),
        );
        for (method, path, operation) in [
            (Method::POST, "/schedules/s1", "scheduler:CreateSchedule"),
            (Method::PUT, "/schedules/s1", "scheduler:UpdateSchedule"),
            (Method::GET, "/schedules/s1?groupName=g", "scheduler:GetSchedule"),
            (Method::DELETE, "/schedules/s1?groupName=g&clientToken=t", "scheduler:DeleteSchedule"),
            (Method::GET, "/schedules?ScheduleGroup=g", "scheduler:ListSchedules"),
            (Method::GET, "/schedule-groups/g", "scheduler:GetScheduleGroup"),
        ] {
            assert_eq!(classify(&method, &path.parse().unwrap(), &headers), operation, "{path}");
        }
        // Lambda's Invoke, by the name the edge meters it under (a function ARN in the path).
        let mut headers = HeaderMap::new();
        headers.insert(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=k/20261122/us-east-1/lambda/aws4_request, SignedHeaders=x"
                .parse()
                .unwrap(),
        );
        let invoke =
            "/2015-03-31/functions/arn%3Aaws%3Alambda%3Aus-east-1%3A1%3Afunction%3Af/invocations";
        assert_eq!(classify(&Method::POST, &invoke.parse().unwrap(), &headers), "lambda:Invoke");
        assert_eq!(
            classify(&Method::GET, &"/2015-03-31/functions/f".parse().unwrap(), &headers),
            "lambda:GET /2015-03-31/functions/f",
            "another Lambda call keeps its method and path"
        );
    }
}

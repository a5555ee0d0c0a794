//! The stack's functions and their triggers, derived from the template.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use serde_json::Value;

use crate::template::Template;

/// A function resource.
#[derive(Debug, Clone)]
pub struct FunctionSpec {
    /// Logical id (`SubmitFunction`).
    pub logical: String,
    /// Physical name (`longhaul-SubmitFunction`).
    pub name: String,
    /// The binary (`Metadata.BuildProperties.Binary`) — which handler to host.
    pub binary: String,
    /// `Timeout`.
    pub timeout: Duration,
    /// Resolved environment variables.
    pub env: BTreeMap<String, String>,
    /// What invokes it.
    pub events: Vec<EventSpec>,
}

/// A function's trigger.
#[derive(Debug, Clone)]
pub enum EventSpec {
    /// An HTTP API route.
    Http {
        /// `GET`, `POST`, … or `ANY`.
        method: String,
        /// `/jobs/{id}`.
        path: String,
        /// Whether the JWT authorizer guards the route.
        authorized: bool,
    },
    /// An SQS event source mapping.
    Sqs {
        /// The queue's URL.
        queue_url: String,
        /// The queue's ARN.
        queue_arn: String,
        /// Most messages per invocation.
        batch_size: i32,
        /// `FunctionResponseTypes: [ReportBatchItemFailures]`.
        report_batch_item_failures: bool,
    },
    /// A function URL (served locally under `/_fn/<LogicalId>/`).
    Url {
        /// `RESPONSE_STREAM` or `BUFFERED`.
        streaming: bool,
    },
    /// An EventBridge schedule.
    Schedule {
        /// The schedule's name (`Name`, else the event's key).
        name: String,
        /// `rate(...)`; `None` for cron expressions (fired only on demand locally).
        every: Option<Duration>,
    },
}

/// Parses `rate(5 minutes)`.
pub fn parse_rate(expr: &str) -> Option<Duration> {
    let inner = expr.trim().strip_prefix("rate(")?.strip_suffix(')')?;
    let (n, unit) = inner.trim().split_once(' ')?;
    let n: u64 = n.parse().ok()?;
    let seconds = match unit.trim().trim_end_matches('s') {
        "second" => 1,
        "minute" => 60,
        "hour" => 3600,
        "day" => 86_400,
        _ => return None,
    };
    Some(Duration::from_secs(n * seconds))
}

/// Every function in the template with its triggers.
pub fn functions(template: &Template) -> anyhow::Result<Vec<FunctionSpec>> {
    let default_auth = template
        .of_type("AWS::Serverless::HttpApi")
        .any(|(_, api)| !api["Properties"]["Auth"]["DefaultAuthorizer"].is_null());
    let mut out = Vec::new();
    for (logical, resource) in template.of_type("AWS::Serverless::Function") {
        let context = || format!("function {logical}");
        let binary = resource["Metadata"]["BuildProperties"]["Binary"]
            .as_str()
            .ok_or_else(|| anyhow!("{logical} has no Metadata.BuildProperties.Binary"))?
            .to_owned();
        let mut events = Vec::new();
        for (key, event) in resource["Properties"]["Events"].as_object().into_iter().flatten() {
            let props = &event["Properties"];
            let spec = match event["Type"].as_str().unwrap_or_default() {
                "HttpApi" => EventSpec::Http {
                    method: props["Method"].as_str().unwrap_or("ANY").to_uppercase(),
                    path: props["Path"].as_str().unwrap_or("/{proxy+}").to_owned(),
                    authorized: match &props["Auth"]["Authorizer"] {
                        Value::String(s) if s == "NONE" => false,
                        Value::String(_) => true,
                        _ => default_auth,
                    },
                },
                "SQS" => {
                    let queue_arn = template.resolve_string(&props["Queue"]).with_context(context)?;
                    let queue_name = queue_arn.rsplit(':').next().unwrap_or_default();
                    EventSpec::Sqs {
                        queue_url: format!("{}/{}/{queue_name}", template.queue_endpoint, crate::template::ACCOUNT),
                        queue_arn,
                        batch_size: props["BatchSize"].as_i64().unwrap_or(10) as i32,
                        report_batch_item_failures: props["FunctionResponseTypes"]
                            .as_array()
                            .is_some_and(|t| t.iter().any(|t| t == "ReportBatchItemFailures")),
                    }
                }
                "Schedule" | "ScheduleV2" => {
                    let expr = template.resolve_string(&props["Schedule"].clone()).or_else(|_| {
                        template.resolve_string(&props["ScheduleExpression"])
                    })?;
                    EventSpec::Schedule {
                        name: props["Name"].as_str().unwrap_or(key).to_owned(),
                        every: parse_rate(&expr),
                    }
                }
                other => bail!("{logical}: event type {other} is not supported by the local stack"),
            };
            events.push(spec);
        }
        let url = &resource["Properties"]["FunctionUrlConfig"];
        if !url.is_null() {
            events.push(EventSpec::Url { streaming: url["InvokeMode"] == "RESPONSE_STREAM" });
        }
        out.push(FunctionSpec {
            logical: logical.clone(),
            name: template.physical_name(logical)?,
            binary,
            timeout: Duration::from_secs(template.function_timeout(logical)?),
            env: template.function_environment(logical)?,
            events,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("rate(1 minute)"), Some(Duration::from_secs(60)));
        assert_eq!(parse_rate("rate(5 minutes)"), Some(Duration::from_secs(300)));
        assert_eq!(parse_rate("cron(0 * * * ? *)"), None);
    }
}

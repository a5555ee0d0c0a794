//! The stack's functions and their triggers, derived from the template.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use serde_json::Value;

use crate::stack::template::Template;
use crate::triggers::filter::Pattern;
use longhaul_lambda::{FUNCTION_VAR, Function};

/// The binary every function of the template deploys (`Metadata.BuildProperties.Binary`).
pub const LAMBDA_BINARY: &str = "longhaul-lambda";

/// A function resource.
#[derive(Debug, Clone)]
pub struct FunctionSpec {
    /// Logical id (`SubmitFunction`).
    pub logical: String,
    /// Physical name (`longhaul-SubmitFunction`).
    pub name: String,
    /// Which handler to host: the function its `LONGHAUL_FUNCTION` variable names (every
    /// function deploys the one `longhaul-lambda` binary, which chooses by that variable).
    pub function: Function,
    /// `Timeout`.
    pub timeout: Duration,
    /// Resolved environment variables.
    pub env: BTreeMap<String, String>,
    /// What invokes it.
    pub events: Vec<EventSpec>,
    /// `EventInvokeConfig`: what Lambda does with an asynchronous invocation that fails.
    pub async_invoke: AsyncInvokeSpec,
}

/// A function's `EventInvokeConfig` (Lambda's defaults where the template says nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsyncInvokeSpec {
    /// `MaximumRetryAttempts` (Lambda's default: 2).
    pub max_retries: u32,
    /// `DestinationConfig.OnFailure` of `Type: SQS`: the queue's URL.
    pub on_failure_queue_url: Option<String>,
}

impl Default for AsyncInvokeSpec {
    fn default() -> Self {
        AsyncInvokeSpec { max_retries: 2, on_failure_queue_url: None }
    }
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
        /// `FunctionUrlConfig.Cors`: answered by the URL itself, as Lambda does.
        cors: Option<UrlCors>,
    },
    /// A DynamoDB stream event source mapping.
    DynamoDb(StreamMappingSpec),
    /// An EventBridge schedule.
    Schedule {
        /// The schedule's name (`Name`, else the event's key).
        name: String,
        /// `rate(...)`; `None` for cron expressions (fired only on demand locally).
        every: Option<Duration>,
    },
}

/// A CORS configuration — a function URL's (`FunctionUrlConfig.Cors`) or the HTTP API's
/// (`CorsConfiguration`) — which Lambda or API Gateway applies to the answers itself (the
/// function never sees a preflight).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UrlCors {
    /// `AllowOrigins` (`*` for any).
    pub allow_origins: Vec<String>,
    /// `AllowMethods`.
    pub allow_methods: Vec<String>,
    /// `AllowHeaders`.
    pub allow_headers: Vec<String>,
    /// `MaxAge`, seconds.
    pub max_age: Option<u64>,
    /// `ExposeHeaders`: the response headers a page's script may read.
    pub expose_headers: Vec<String>,
}

impl UrlCors {
    /// Reads a resolved `Cors` block; a list may also be a comma-separated string (a
    /// `CommaDelimitedList` parameter resolves to one locally).
    pub fn from_json(cors: &Value) -> Self {
        let list = |value: &Value| -> Vec<String> {
            match value {
                Value::Array(items) => {
                    items.iter().filter_map(|i| i.as_str()).map(|s| s.trim().to_owned()).collect()
                }
                Value::String(s) => s.split(',').map(|s| s.trim().to_owned()).collect(),
                _ => Vec::new(),
            }
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect()
        };
        UrlCors {
            allow_origins: list(&cors["AllowOrigins"]),
            allow_methods: list(&cors["AllowMethods"]),
            allow_headers: list(&cors["AllowHeaders"]),
            max_age: cors["MaxAge"].as_u64().or_else(|| cors["MaxAge"].as_str()?.parse().ok()),
            expose_headers: list(&cors["ExposeHeaders"]),
        }
    }

    /// The `Access-Control-Allow-Origin` to answer a request from `origin` with, if it is
    /// allowed.
    pub fn allow_origin(&self, origin: &str) -> Option<String> {
        if self.allow_origins.iter().any(|o| o == "*") {
            Some("*".into())
        } else {
            self.allow_origins.iter().find(|o| o.eq_ignore_ascii_case(origin)).cloned()
        }
    }
}

/// A DynamoDB stream event source mapping (`Type: DynamoDB`).
#[derive(Debug, Clone)]
pub struct StreamMappingSpec {
    /// The event's key under `Events` (`JobEnded`): names the mapping's checkpoint.
    pub name: String,
    /// The table's logical id (`JobsTable`).
    pub table_logical: String,
    /// The table's physical name. The stream's ARN is only known at runtime (the table's
    /// `LatestStreamArn`: the emulator puts the stream's creation time in it).
    pub table_name: String,
    /// Where to start without a checkpoint.
    pub starting_position: StartingPosition,
    /// Most records per invocation (`BatchSize`, default 100).
    pub batch_size: usize,
    /// Retries of a failing batch before it goes to the on-failure destination
    /// (`MaximumRetryAttempts`; `None`: -1, retry until the batch succeeds).
    pub maximum_retry_attempts: Option<u32>,
    /// `BisectBatchOnFunctionError`.
    pub bisect_batch_on_function_error: bool,
    /// `FunctionResponseTypes: [ReportBatchItemFailures]`.
    pub report_batch_item_failures: bool,
    /// `DestinationConfig.OnFailure` (an SQS queue).
    pub on_failure: Option<QueueTarget>,
    /// `FilterCriteria.Filters[].Pattern` (none: every record invokes the function).
    pub filters: Vec<Pattern>,
}

/// Where a stream mapping starts reading when it has no checkpoint (`StartingPosition`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartingPosition {
    /// The oldest record the stream holds.
    TrimHorizon,
    /// Only records written after the mapping started.
    Latest,
}

impl StartingPosition {
    /// The `ShardIteratorType` that starts there.
    pub fn iterator_type(self) -> &'static str {
        match self {
            StartingPosition::TrimHorizon => "TRIM_HORIZON",
            StartingPosition::Latest => "LATEST",
        }
    }
}

/// An SQS queue named by ARN in the template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueTarget {
    /// Its URL (on the edge, as the functions see it).
    pub url: String,
    /// Its ARN.
    pub arn: String,
}

impl QueueTarget {
    fn from_arn(template: &Template, arn: String) -> anyhow::Result<QueueTarget> {
        let parts: Vec<&str> = arn.split(':').collect();
        let ["arn", _, "sqs", _, _, name] = parts.as_slice() else {
            bail!("{arn} is not an SQS queue ARN")
        };
        Ok(QueueTarget {
            url: format!("{}/{}/{name}", template.queue_endpoint, crate::stack::template::ACCOUNT),
            arn,
        })
    }
}

/// The properties of a `Type: DynamoDB` event the local stack honours; any other is refused
/// rather than ignored, so the stack never silently runs a mapping unlike the deployed one.
const STREAM_PROPERTIES: [&str; 11] = [
    "Stream",
    "StartingPosition",
    "BatchSize",
    "MaximumRetryAttempts",
    "BisectBatchOnFunctionError",
    "FunctionResponseTypes",
    "DestinationConfig",
    "FilterCriteria",
    "Enabled",
    "MaximumBatchingWindowInSeconds",
    "MaximumRecordAgeInSeconds",
];

/// Reads a `Type: DynamoDB` event; `None` when it is disabled (`Enabled: false`).
fn stream_mapping(
    template: &Template,
    key: &str,
    props: &Value,
) -> anyhow::Result<Option<StreamMappingSpec>> {
    for name in props.as_object().into_iter().flatten().map(|(name, _)| name) {
        if !STREAM_PROPERTIES.contains(&name.as_str()) {
            bail!("property {name} is not supported by the local stack");
        }
    }
    let flag = |name: &str, default: bool| -> anyhow::Result<bool> {
        match &props[name] {
            Value::Null => Ok(default),
            value => match template.resolve_string(value)?.as_str() {
                "true" => Ok(true),
                "false" => Ok(false),
                other => bail!("{name} must be true or false, not {other}"),
            },
        }
    };
    let number = |name: &str, default: i64| -> anyhow::Result<i64> {
        match &props[name] {
            Value::Null => Ok(default),
            value => template
                .resolve_string(value)?
                .parse()
                .with_context(|| format!("{name} must be an integer")),
        }
    };
    if !flag("Enabled", true)? {
        return Ok(None);
    }
    // Batching windows only delay invocations; the local stack invokes as soon as it has
    // records, which is what a window of 0 (the default) does.
    if number("MaximumBatchingWindowInSeconds", 0)? != 0 {
        bail!("MaximumBatchingWindowInSeconds other than 0 is not supported by the local stack");
    }
    // The emulator's stream keeps records forever, so only "no maximum age" can be honoured.
    if number("MaximumRecordAgeInSeconds", -1)? != -1 {
        bail!("MaximumRecordAgeInSeconds other than -1 is not supported by the local stack");
    }
    // `!GetAtt Table.StreamArn`: the ARN exists only at runtime, so the table is what we keep.
    let table_logical = match &props["Stream"]["Fn::GetAtt"] {
        Value::Array(parts) => match parts.as_slice() {
            [Value::String(table), Value::String(attr)] if attr == "StreamArn" => table.clone(),
            _ => bail!("Stream must be !GetAtt <Table>.StreamArn"),
        },
        Value::String(s) => match s.split_once('.') {
            Some((table, "StreamArn")) => table.to_owned(),
            _ => bail!("Stream must be !GetAtt <Table>.StreamArn"),
        },
        _ => bail!(
            "Stream must be !GetAtt <Table>.StreamArn (a literal stream ARN cannot name the emulator's stream)"
        ),
    };
    let table = template
        .resources
        .get(&table_logical)
        .ok_or_else(|| anyhow!("Stream names {table_logical}, which is not in the template"))?;
    if table["Type"] != "AWS::DynamoDB::Table" {
        bail!("Stream names {table_logical}, which is not a DynamoDB table");
    }
    if table["Properties"]["StreamSpecification"].is_null() {
        bail!("Stream names {table_logical}, which has no StreamSpecification");
    }
    let starting_position = match template.resolve_string(&props["StartingPosition"])?.as_str() {
        "TRIM_HORIZON" => StartingPosition::TrimHorizon,
        "LATEST" => StartingPosition::Latest,
        other => bail!(
            "StartingPosition {other} is not supported for DynamoDB streams (TRIM_HORIZON or LATEST)"
        ),
    };
    let batch_size = number("BatchSize", 100)?;
    if !(1..=10_000).contains(&batch_size) {
        bail!("BatchSize must be 1 to 10000, not {batch_size}");
    }
    let maximum_retry_attempts = match number("MaximumRetryAttempts", -1)? {
        -1 => None,
        n @ 0..=10_000 => Some(n as u32),
        n => bail!("MaximumRetryAttempts must be -1 or 0 to 10000, not {n}"),
    };
    let mut report_batch_item_failures = false;
    for kind in props["FunctionResponseTypes"].as_array().into_iter().flatten() {
        match kind.as_str() {
            Some("ReportBatchItemFailures") => report_batch_item_failures = true,
            _ => bail!("FunctionResponseTypes {kind} is not supported"),
        }
    }
    let on_failure = match &props["DestinationConfig"] {
        Value::Null => None,
        Value::Object(config) => {
            if let Some(other) = config.keys().find(|k| *k != "OnFailure") {
                bail!("DestinationConfig.{other} is not supported for streams (only OnFailure)");
            }
            let on_failure = &config["OnFailure"];
            match on_failure["Type"].as_str() {
                Some("SQS") | None => {}
                Some(other) => bail!(
                    "DestinationConfig.OnFailure.Type {other} is not supported by the local stack (SQS only)"
                ),
            }
            let arn = template
                .resolve_string(&on_failure["Destination"])
                .context("DestinationConfig.OnFailure.Destination")?;
            Some(
                QueueTarget::from_arn(template, arn)
                    .context("DestinationConfig.OnFailure.Destination")?,
            )
        }
        other => bail!("DestinationConfig must be an object, not {other}"),
    };
    let mut filters = Vec::new();
    match &props["FilterCriteria"] {
        Value::Null => {}
        criteria => {
            if let Some(other) =
                criteria.as_object().into_iter().flatten().map(|(k, _)| k).find(|k| *k != "Filters")
            {
                bail!("FilterCriteria.{other} is not supported");
            }
            for (i, filter) in criteria["Filters"].as_array().into_iter().flatten().enumerate() {
                let text = template
                    .resolve_string(&filter["Pattern"])
                    .with_context(|| format!("FilterCriteria.Filters[{i}].Pattern"))?;
                filters.push(
                    Pattern::parse(&text)
                        .with_context(|| format!("FilterCriteria.Filters[{i}].Pattern"))?,
                );
            }
        }
    }
    Ok(Some(StreamMappingSpec {
        name: key.to_owned(),
        table_name: template.physical_name(&table_logical)?,
        table_logical,
        starting_position,
        batch_size: batch_size as usize,
        maximum_retry_attempts,
        bisect_batch_on_function_error: flag("BisectBatchOnFunctionError", false)?,
        report_batch_item_failures,
        on_failure,
        filters,
    }))
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

/// The HTTP API's `CorsConfiguration`, resolved, if it has one.
pub fn api_cors(template: &Template) -> anyhow::Result<Option<UrlCors>> {
    let Some((logical, api)) = template.of_type("AWS::Serverless::HttpApi").next() else {
        return Ok(None);
    };
    match &api["Properties"]["CorsConfiguration"] {
        Value::Null => Ok(None),
        cors => Ok(Some(UrlCors::from_json(
            &template.resolve(cors).with_context(|| format!("{logical}'s CorsConfiguration"))?,
        ))),
    }
}

/// Every function in the template with its triggers.
pub fn functions(template: &Template) -> anyhow::Result<Vec<FunctionSpec>> {
    let default_auth = template
        .of_type("AWS::Serverless::HttpApi")
        .any(|(_, api)| !api["Properties"]["Auth"]["DefaultAuthorizer"].is_null());
    let mut out = Vec::new();
    for (logical, resource) in template.of_type("AWS::Serverless::Function") {
        let context = || format!("function {logical}");
        let binary = resource["Metadata"]["BuildProperties"]["Binary"].as_str();
        if binary != Some(LAMBDA_BINARY) {
            bail!(
                "{logical}: Metadata.BuildProperties.Binary is {binary:?}, not {LAMBDA_BINARY:?}"
            );
        }
        let env = template.function_environment(logical)?;
        let function: Function = env
            .get(FUNCTION_VAR)
            .map(String::as_str)
            .unwrap_or_default()
            .parse()
            .with_context(context)?;
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
                    let queue_arn =
                        template.resolve_string(&props["Queue"]).with_context(context)?;
                    let queue_name = queue_arn.rsplit(':').next().unwrap_or_default();
                    EventSpec::Sqs {
                        queue_url: format!(
                            "{}/{}/{queue_name}",
                            template.queue_endpoint,
                            crate::stack::template::ACCOUNT
                        ),
                        queue_arn,
                        batch_size: props["BatchSize"].as_i64().unwrap_or(10) as i32,
                        report_batch_item_failures: props["FunctionResponseTypes"]
                            .as_array()
                            .is_some_and(|t| t.iter().any(|t| t == "ReportBatchItemFailures")),
                    }
                }
                "DynamoDB" => match stream_mapping(template, key, props)
                    .with_context(|| format!("{logical}: event {key}"))?
                {
                    Some(mapping) => EventSpec::DynamoDb(mapping),
                    None => continue,
                },
                "Schedule" | "ScheduleV2" => {
                    let expr = template
                        .resolve_string(&props["Schedule"].clone())
                        .or_else(|_| template.resolve_string(&props["ScheduleExpression"]))?;
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
            let cors = match &url["Cors"] {
                Value::Null => None,
                cors => Some(UrlCors::from_json(&template.resolve(cors).with_context(context)?)),
            };
            events.push(EventSpec::Url { streaming: url["InvokeMode"] == "RESPONSE_STREAM", cors });
        }
        let async_invoke = async_invoke(template, &resource["Properties"]["EventInvokeConfig"])
            .with_context(context)?;
        out.push(FunctionSpec {
            logical: logical.clone(),
            name: template.physical_name(logical)?,
            function,
            timeout: Duration::from_secs(template.function_timeout(logical)?),
            env,
            events,
            async_invoke,
        });
    }
    Ok(out)
}

/// Reads a function's `EventInvokeConfig` (`Null`: Lambda's defaults, no destination). Only
/// an SQS on-failure destination is supported: the template declares no other.
fn async_invoke(template: &Template, config: &Value) -> anyhow::Result<AsyncInvokeSpec> {
    let mut spec = AsyncInvokeSpec::default();
    if config.is_null() {
        return Ok(spec);
    }
    if let Some(retries) = config["MaximumRetryAttempts"].as_u64() {
        spec.max_retries = u32::try_from(retries).context("MaximumRetryAttempts")?;
    }
    let on_failure = &config["DestinationConfig"]["OnFailure"];
    if !on_failure.is_null() {
        if on_failure["Type"] != "SQS" {
            bail!("EventInvokeConfig: only an SQS on-failure destination is supported locally");
        }
        let queue_arn = template.resolve_string(&on_failure["Destination"])?;
        let queue_name = queue_arn.rsplit(':').next().unwrap_or_default();
        spec.on_failure_queue_url = Some(format!(
            "{}/{}/{queue_name}",
            template.queue_endpoint,
            crate::stack::template::ACCOUNT
        ));
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack::template::real_template;

    #[test]
    fn the_worker_functions_send_runs_lambda_gave_up_on_to_the_intake_queue() {
        let functions = functions(&real_template()).unwrap();
        for worker in ["StageFunction", "CsvReportWorkerFunction"] {
            let spec = functions.iter().find(|f| f.logical == worker).unwrap();
            assert_eq!(spec.async_invoke.max_retries, 2, "{worker}");
            let queue = spec.async_invoke.on_failure_queue_url.as_deref().unwrap_or_default();
            assert!(queue.ends_with("-IntakeQueue"), "{worker}: {queue}");
        }
    }

    #[test]
    fn the_notifier_mapping_is_read_from_the_template() {
        let functions = functions(&real_template()).unwrap();
        let notifier = functions.iter().find(|f| f.logical == "NotifierFunction").unwrap();
        let [EventSpec::DynamoDb(mapping)] = notifier.events.as_slice() else {
            panic!("{:?}", notifier.events)
        };
        assert_eq!(
            (mapping.table_logical.as_str(), mapping.table_name.as_str()),
            ("JobsTable", "longhaul-JobsTable")
        );
        assert_eq!(mapping.starting_position, StartingPosition::TrimHorizon);
        assert_eq!((mapping.batch_size, mapping.maximum_retry_attempts), (100, Some(10)));
        assert!(mapping.bisect_batch_on_function_error && mapping.report_batch_item_failures);
        let dlq = mapping.on_failure.as_ref().unwrap();
        assert_eq!(dlq.url, "http://127.0.0.1:1/123456789012/longhaul-NotifierDeadLetterQueue");
        assert_eq!(dlq.arn, "arn:aws:sqs:us-east-1:123456789012:longhaul-NotifierDeadLetterQueue");
        assert_eq!(mapping.filters.len(), 2, "job ends, and progress records with their owner");
    }

    #[test]
    fn unsupported_stream_mappings_are_refused() {
        let t = real_template();
        let base = serde_json::json!({"Stream": {"Fn::GetAtt": ["JobsTable", "StreamArn"]}, "StartingPosition": "LATEST"});
        let mapping = stream_mapping(&t, "E", &base).unwrap().unwrap();
        assert_eq!(
            (mapping.batch_size, mapping.maximum_retry_attempts, mapping.on_failure),
            (100, None, None)
        );
        let refused = |edit: serde_json::Value| {
            let mut props = base.clone();
            props.as_object_mut().unwrap().extend(edit.as_object().unwrap().clone());
            format!("{:#}", stream_mapping(&t, "E", &props).unwrap_err())
        };
        assert!(
            refused(serde_json::json!({"ParallelizationFactor": 2}))
                .contains("ParallelizationFactor")
        );
        assert!(
            refused(serde_json::json!({"MaximumRecordAgeInSeconds": 60}))
                .contains("MaximumRecordAgeInSeconds")
        );
        assert!(
            refused(serde_json::json!({"MaximumBatchingWindowInSeconds": 1}))
                .contains("MaximumBatchingWindowInSeconds")
        );
        assert!(
            refused(serde_json::json!({"StartingPosition": "AT_TIMESTAMP"}))
                .contains("AT_TIMESTAMP")
        );
        assert!(refused(serde_json::json!({"Stream": "arn:aws:dynamodb:x"})).contains("StreamArn"));
        assert!(
            refused(serde_json::json!({"Stream": {"Fn::GetAtt": ["IntakeQueue", "StreamArn"]}}))
                .contains("not a DynamoDB table")
        );
        assert!(
            refused(serde_json::json!({"MaximumRetryAttempts": -2}))
                .contains("MaximumRetryAttempts")
        );
        let sns = serde_json::json!({"DestinationConfig": {"OnFailure": {"Type": "SNS", "Destination": "arn:aws:sns:x"}}});
        assert!(refused(sns).contains("SNS"));
        let suffix = serde_json::json!({"FilterCriteria": {"Filters": [{"Pattern": "{\"a\": [{\"suffix\": \"x\"}]}"}]}});
        assert!(refused(suffix).contains("suffix"));
        assert!(stream_mapping(&t, "E", &serde_json::json!({"Enabled": false})).unwrap().is_none());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("rate(1 minute)"), Some(Duration::from_secs(60)));
        assert_eq!(parse_rate("rate(5 minutes)"), Some(Duration::from_secs(300)));
        assert_eq!(parse_rate("cron(0 * * * ? *)"), None);
    }

    /// The events function URL answers CORS (browsers' EventSource from other origins), as
    /// its `FunctionUrlConfig.Cors` says; a list of origins allows only those.
    #[test]
    fn the_events_url_cors_is_read_from_the_template() {
        let functions = functions(&real_template()).unwrap();
        let events = functions.iter().find(|f| f.logical == "EventsFunction").unwrap();
        let cors = events
            .events
            .iter()
            .find_map(|e| match e {
                EventSpec::Url { cors, .. } => cors.clone(),
                _ => None,
            })
            .expect("the events URL has a CORS configuration");
        assert_eq!(cors.allow_origin("https://console.example").as_deref(), Some("*"));
        assert_eq!(cors.allow_methods, ["GET"]);
        assert!(cors.allow_headers.iter().any(|h| h == "last-event-id"));

        let listed = UrlCors::from_json(
            &serde_json::json!({"AllowOrigins": "https://a.example, https://b.example"}),
        );
        assert_eq!(listed.allow_origin("https://b.example").as_deref(), Some("https://b.example"));
        assert_eq!(listed.allow_origin("https://evil.example"), None);
    }
}

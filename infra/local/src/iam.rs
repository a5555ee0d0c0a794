//! IAM, as the deployed stack enforces it: every AWS call a hosted function makes is checked
//! against that function's role policies in `template.yaml`, and refused with the service's
//! own `AccessDenied` error when no statement allows it.
//!
//! Why: the emulator accepts any credentials, so without this a function could call what its
//! role does not grant and every local test would pass while the deployed stack fails (a stage
//! that lists `checkpoints/` under a policy that only grants `results/` did exactly that).
//!
//! Who is calling: each hosted function signs with its own access key id, its logical name
//! (see [`access_key_id`]), so the edge knows the caller of every request — SDK calls at init
//! and from spawned tasks, and presigned URLs a client follows, included. Requests signed
//! with any other key (the local stack's own provisioning, the tests' direct clients) are not
//! checked: they play the account's administrator.
//!
//! What is modelled: `Allow` and `Deny` statements with `Action`, `Resource` (`*` and `?`
//! wildcards), and `Condition` blocks with `StringEquals`/`StringLike` (plain,
//! `ForAllValues:` and `ForAnyValue:`); the SAM policy templates the template uses; the
//! managed policies SAM attaches for SQS and DynamoDB stream event sources. For each request,
//! the IAM actions it needs, the resources and the condition keys `dynamodb:LeadingKeys` and
//! `s3:prefix`. Anything else — another policy template, a managed policy, a condition
//! operator, a request the edge cannot name — is an error, never a silent allow, so a template
//! or code change the check does not understand fails loudly.

use std::collections::{BTreeMap, HashMap};

use anyhow::{Context, anyhow, bail};
use axum::http::{HeaderMap, Method, Uri};
use percent_encoding::percent_decode_str;
use serde_json::Value;

use crate::template::{ACCOUNT, REGION, Template};

/// The access key id the local stack itself and the tests sign with: the account's
/// administrator, never checked.
pub const ADMIN_KEY: &str = "longhaul";

/// The access key id a hosted function signs with: its logical name.
pub fn access_key_id(logical: &str) -> String {
    logical.to_owned()
}

/// One action on one resource, with the request's condition keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// `service:Action`, as IAM names it (`s3:GetObject` for a HeadObject too).
    pub action: String,
    /// The resource's ARN (`*` where the action has no resource).
    pub resource: String,
    /// Condition keys and their values (`dynamodb:LeadingKeys`, `s3:prefix`).
    pub context: BTreeMap<String, Vec<String>>,
}

impl Access {
    fn new(action: impl Into<String>, resource: impl Into<String>) -> Self {
        Self { action: action.into(), resource: resource.into(), context: BTreeMap::new() }
    }

    /// `lambda:InvokeFunction` on `function_arn`.
    pub fn invoke(function_arn: &str) -> Self {
        Self::new("lambda:InvokeFunction", function_arn)
    }

    fn with(mut self, key: &str, values: Vec<String>) -> Self {
        self.context.insert(key.to_owned(), values);
        self
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Denial {
    /// The caller (a function's or state machine's logical name).
    pub principal: String,
    /// What it tried.
    pub action: String,
    /// On what.
    pub resource: String,
    /// In words, as AWS says it.
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    Allow,
    Deny,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quantifier {
    Single,
    ForAll,
    ForAny,
}

#[derive(Debug, Clone)]
struct Condition {
    quantifier: Quantifier,
    like: bool,
    key: String,
    values: Vec<String>,
}

#[derive(Debug, Clone)]
struct Statement {
    effect: Effect,
    actions: Vec<String>,
    resources: Vec<String>,
    conditions: Vec<Condition>,
}

/// Every principal's statements, resolved from the template.
#[derive(Debug, Clone, Default)]
pub struct Policies {
    by_principal: HashMap<String, Vec<Statement>>,
    /// The partition key of each table and index, by ARN (for `dynamodb:LeadingKeys`).
    hash_keys: HashMap<String, String>,
    /// The state machines (the callers of the Lambda Invoke API).
    state_machines: Vec<String>,
}

impl Policies {
    /// The role policies of every function and state machine of `template`.
    pub fn from_template(template: &Template) -> anyhow::Result<Self> {
        let mut by_principal = HashMap::new();
        let state_machines = template
            .of_type("AWS::Serverless::StateMachine")
            .map(|(logical, _)| logical.clone())
            .collect();
        for kind in ["AWS::Serverless::Function", "AWS::Serverless::StateMachine"] {
            for (logical, resource) in template.of_type(kind) {
                let statements = role_statements(template, resource)
                    .with_context(|| format!("the policies of {logical}"))?;
                by_principal.insert(logical.clone(), statements);
            }
        }
        let mut hash_keys = HashMap::new();
        for (logical, table) in template.of_type("AWS::DynamoDB::Table") {
            let arn = template.attribute(logical, "Arn")?;
            let props = &table["Properties"];
            if let Some(key) = hash_key(&props["KeySchema"]) {
                hash_keys.insert(arn.clone(), key);
            }
            for index in props["GlobalSecondaryIndexes"].as_array().into_iter().flatten() {
                if let (Some(name), Some(key)) =
                    (index["IndexName"].as_str(), hash_key(&index["KeySchema"]))
                {
                    hash_keys.insert(format!("{arn}/index/{name}"), key);
                }
            }
        }
        Ok(Self { by_principal, hash_keys, state_machines })
    }

    /// Whether `principal` is one whose calls are checked.
    pub fn knows(&self, principal: &str) -> bool {
        self.by_principal.contains_key(principal)
    }

    /// Checks that a state machine may invoke the function `function_arn` (the emulator's
    /// interpreter does not say which machine is calling: one that may is enough).
    pub fn check_invoke(&self, function_arn: &str) -> Result<(), Denial> {
        let access = [Access::invoke(function_arn)];
        let mut refusal = None;
        for machine in &self.state_machines {
            match self.check(machine, &access) {
                Ok(()) => return Ok(()),
                Err(denial) => refusal = Some(denial),
            }
        }
        Err(refusal.unwrap_or_else(|| Denial {
            principal: "states.amazonaws.com".into(),
            action: "lambda:InvokeFunction".into(),
            resource: function_arn.into(),
            message: format!("no state machine in the template may invoke {function_arn}"),
        }))
    }

    /// Whether `principal` may list all of `bucket` (no prefix condition). S3 answers a GET
    /// or HEAD of a key that does not exist with 404 only to a caller that may; to others it
    /// answers 403, so as not to tell them which keys exist.
    pub fn may_list_bucket(&self, principal: &str, bucket: &str) -> bool {
        self.check(principal, &[Access::new("s3:ListBucket", format!("arn:aws:s3:::{bucket}"))])
            .is_ok()
    }

    /// Whether S3 answers `principal` 403 rather than 404 for a GET or HEAD of a missing key at
    /// `uri` (path-style: `/<bucket>/<key>`), because it may not list the bucket.
    pub fn hides_missing_keys(&self, principal: &str, uri: &Uri) -> bool {
        !self.may_list_bucket(principal, s3_path(uri).0)
    }

    /// Checks every access of a request; the first refused one is the answer.
    pub fn check(&self, principal: &str, accesses: &[Access]) -> Result<(), Denial> {
        let statements = self.by_principal.get(principal).map(Vec::as_slice).unwrap_or_default();
        for access in accesses {
            let applies = |s: &&Statement| {
                s.actions
                    .iter()
                    .any(|a| glob(&a.to_ascii_lowercase(), &access.action.to_ascii_lowercase()))
                    && s.resources.iter().any(|r| glob(r, &access.resource))
                    && s.conditions.iter().all(|c| c.holds(&access.context))
            };
            let denied =
                statements.iter().filter(|s| s.effect == Effect::Deny).any(|s| applies(&s));
            let allowed =
                statements.iter().filter(|s| s.effect == Effect::Allow).any(|s| applies(&s));
            if denied || !allowed {
                let why = if denied {
                    "with an explicit deny"
                } else {
                    "because no identity-based policy allows it"
                };
                return Err(Denial {
                    principal: principal.to_owned(),
                    action: access.action.clone(),
                    resource: access.resource.clone(),
                    message: format!(
                        "User: arn:aws:sts::{ACCOUNT}:assumed-role/{principal}Role/{principal} is not authorized to perform: {} on resource: {} {why}{}",
                        access.action,
                        access.resource,
                        if access.context.is_empty() {
                            String::new()
                        } else {
                            format!(" (context {:?})", access.context)
                        },
                    ),
                });
            }
        }
        Ok(())
    }

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

impl Condition {
    fn holds(&self, context: &BTreeMap<String, Vec<String>>) -> bool {
        let matches = |value: &String| {
            self.values
                .iter()
                .any(|pattern| if self.like { glob(pattern, value) } else { pattern == value })
        };
        match (self.quantifier, context.get(&self.key)) {
            // IAM: a set operator over a key the request does not carry is vacuously true
            // (ForAllValues) or false (ForAnyValue); a single-valued one is false.
            (Quantifier::ForAll, None) => true,
            (Quantifier::ForAll, Some(values)) => values.iter().all(matches),
            (Quantifier::ForAny | Quantifier::Single, None) => false,
            (Quantifier::ForAny | Quantifier::Single, Some(values)) => values.iter().any(matches),
        }
    }
}

/// The statements of a function's or state machine's role: its `Policies`, and what SAM
/// attaches for its event sources.
fn role_statements(template: &Template, resource: &Value) -> anyhow::Result<Vec<Statement>> {
    let props = &resource["Properties"];
    let mut out = Vec::new();
    let policies = match &props["Policies"] {
        Value::Null => vec![],
        Value::Array(items) => items.clone(),
        other => vec![other.clone()],
    };
    for policy in &policies {
        let Some(object) = policy.as_object() else {
            bail!("managed policy {policy} is not modelled by the local IAM check");
        };
        for (name, args) in object {
            let args = template.resolve(args)?;
            let arg = |key: &str| {
                args[key].as_str().map(str::to_owned).ok_or_else(|| anyhow!("{name} needs {key}"))
            };
            match name.as_str() {
                "Statement" => {
                    let statements = match &args {
                        Value::Array(items) => items.clone(),
                        other => vec![other.clone()],
                    };
                    for statement in &statements {
                        out.push(parse_statement(statement)?);
                    }
                }
                "Version" => {}
                // SAM's policy templates, as SAM expands them.
                "SQSSendMessagePolicy" => out.push(allow(
                    &["sqs:SendMessage*"],
                    &[format!("arn:aws:sqs:{REGION}:{ACCOUNT}:{}", arg("QueueName")?)],
                )),
                "LambdaInvokePolicy" => out.push(allow(
                    &["lambda:InvokeFunction"],
                    &[format!(
                        "arn:aws:lambda:{REGION}:{ACCOUNT}:function:{}*",
                        arg("FunctionName")?
                    )],
                )),
                other => bail!(
                    "policy template {other} is not modelled by the local IAM check (infra/local/src/iam.rs)"
                ),
            }
        }
    }
    // The managed policies SAM attaches for event sources (the Lambda service polls with the
    // function's role).
    for event in props["Events"].as_object().into_iter().flatten().map(|(_, e)| e) {
        match event["Type"].as_str().unwrap_or_default() {
            "SQS" => out.push(allow(
                &["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"],
                &["*".into()],
            )),
            "DynamoDB" => out.push(allow(
                &[
                    "dynamodb:DescribeStream",
                    "dynamodb:GetRecords",
                    "dynamodb:GetShardIterator",
                    "dynamodb:ListStreams",
                ],
                &["*".into()],
            )),
            _ => {}
        }
    }
    Ok(out)
}

fn allow(actions: &[&str], resources: &[String]) -> Statement {
    Statement {
        effect: Effect::Allow,
        actions: actions.iter().map(|a| (*a).to_owned()).collect(),
        resources: resources.to_vec(),
        conditions: vec![],
    }
}

fn strings(value: &Value) -> anyhow::Result<Vec<String>> {
    match value {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(items) => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned).ok_or_else(|| anyhow!("{v} is not a string")))
            .collect(),
        other => bail!("{other} is neither a string nor a list of strings"),
    }
}

fn parse_statement(statement: &Value) -> anyhow::Result<Statement> {
    for key in statement.as_object().into_iter().flatten().map(|(k, _)| k) {
        if !["Effect", "Action", "Resource", "Condition", "Sid"].contains(&key.as_str()) {
            bail!("statement key {key} is not modelled by the local IAM check");
        }
    }
    let effect = match statement["Effect"].as_str() {
        Some("Allow") => Effect::Allow,
        Some("Deny") => Effect::Deny,
        other => bail!("statement effect {other:?}"),
    };
    let mut conditions = Vec::new();
    for (operator, keys) in statement["Condition"].as_object().into_iter().flatten() {
        let (quantifier, base) = match operator.split_once(':') {
            Some(("ForAllValues", base)) => (Quantifier::ForAll, base),
            Some(("ForAnyValue", base)) => (Quantifier::ForAny, base),
            None => (Quantifier::Single, operator.as_str()),
            Some(_) => {
                bail!("condition operator {operator} is not modelled by the local IAM check")
            }
        };
        let like = match base {
            "StringLike" => true,
            "StringEquals" => false,
            _ => bail!("condition operator {operator} is not modelled by the local IAM check"),
        };
        for (key, values) in
            keys.as_object().ok_or_else(|| anyhow!("condition {operator} needs keys"))?
        {
            // Condition key names are case-insensitive in IAM; only these are ever set.
            let key = &key.to_ascii_lowercase();
            let key = match key.as_str() {
                "dynamodb:leadingkeys" => &"dynamodb:LeadingKeys".to_owned(),
                "s3:prefix" => key,
                _ => bail!("condition key {key} is not modelled by the local IAM check"),
            };
            conditions.push(Condition {
                quantifier,
                like,
                key: key.clone(),
                values: strings(values)?,
            });
        }
    }
    Ok(Statement {
        effect,
        actions: strings(&statement["Action"])?,
        resources: strings(&statement["Resource"])?,
        conditions,
    })
}

fn hash_key(schema: &Value) -> Option<String> {
    schema
        .as_array()?
        .iter()
        .find(|k| k["KeyType"] == "HASH")
        .and_then(|k| k["AttributeName"].as_str())
        .map(str::to_owned)
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
fn s3_path(uri: &Uri) -> (&str, &str) {
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

/// IAM's wildcard match: `*` any run of characters, `?` any one.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// The credential scope a SigV4 request is signed under
/// (`<access key id>/<date>/<region>/<service>/aws4_request`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// The access key id: who is calling.
    pub key: String,
    /// The service the request is signed for (`dynamodb`, `s3`…).
    pub service: String,
}

impl Credential {
    /// The scope of the `Authorization` header, or of a presigned URL's `X-Amz-Credential`.
    pub fn of(uri: &Uri, headers: &HeaderMap) -> Option<Self> {
        let scope = match headers.get("authorization").and_then(|v| v.to_str().ok()) {
            Some(auth) => auth.split("Credential=").nth(1)?.split([',', ' ']).next()?.to_owned(),
            None => url::form_urlencoded::parse(uri.query()?.as_bytes())
                .find(|(k, _)| k == "X-Amz-Credential")?
                .1
                .into_owned(),
        };
        let parts: Vec<&str> = scope.split('/').collect();
        Some(Credential { key: (*parts.first()?).to_owned(), service: (*parts.get(3)?).to_owned() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policies() -> Policies {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml");
        let template = Template::load(
            &path,
            "longhaul",
            "http://127.0.0.1:1",
            "http://127.0.0.1:2",
            &BTreeMap::new(),
        )
        .unwrap();
        Policies::from_template(&template).unwrap()
    }

    const TABLE: &str = "arn:aws:dynamodb:us-east-1:123456789012:table/longhaul-JobsTable";

    fn get(p: &Policies, uri: &str) -> Vec<Access> {
        p.accesses(
            &format!(
                "s3:{}",
                if uri.contains("list-type") { "ListObjectsV2" } else { "GetObject" }
            ),
            &Method::GET,
            &uri.parse().unwrap(),
            &HeaderMap::new(),
            b"",
        )
        .unwrap()
    }

    fn dynamodb(p: &Policies, op: &str, body: Value) -> Vec<Access> {
        p.accesses(
            &format!("dynamodb:{op}"),
            &Method::POST,
            &"/".parse().unwrap(),
            &HeaderMap::new(),
            body.to_string().as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn wildcards() {
        assert!(glob("results/*", "results/a/b.json"));
        assert!(glob("*", ""));
        assert!(glob("sqs:SendMessage*", "sqs:SendMessage"));
        assert!(glob("a?c", "abc"));
        assert!(!glob("results/*", "checkpoints/a"));
        assert!(!glob("a?c", "ac"));
        assert!(glob("arn:*:x", "arn:aws:states:x"));
    }

    /// Regression: the stage tidies a finished job by listing `checkpoints/<id>/`, and its
    /// policy once granted the listing of `results/` only — every job's end failed in AWS. It
    /// may now list the whole bucket, which it also needs to hear 404 for a missing key; the
    /// status function may not, and reads a missing key as 403.
    #[test]
    fn the_stage_may_list_the_bucket_and_the_status_function_may_not() {
        let p = policies();
        for prefix in ["checkpoints/j1/", "results/j1/"] {
            let accesses = get(
                &p,
                &format!("/longhaul-databucket?list-type=2&prefix={}", prefix.replace('/', "%2F")),
            );
            assert_eq!(accesses[0].context["s3:prefix"], vec![prefix.to_owned()]);
            p.check("StageFunction", &accesses).unwrap();
            assert!(p.check("StatusFunction", &accesses).is_err());
        }
        assert!(p.may_list_bucket("StageFunction", "longhaul-databucket"));
        assert!(
            p.check(
                "ReaperFunction",
                &get(&p, "/longhaul-databucket?list-type=2&prefix=uploads%2F")
            )
            .is_err(),
            "the reaper lists results and checkpoints only"
        );
        assert!(
            p.check("ReaperFunction", &get(&p, "/longhaul-databucket?list-type=2")).is_err(),
            "no prefix: the whole bucket"
        );
        assert!(
            p.accesses(
                "s3:GetObject",
                &Method::GET,
                &"/longhaul-databucket/results/j1/r.json?tagging".parse().unwrap(),
                &HeaderMap::new(),
                b""
            )
            .is_err(),
            "a sub-resource is another action"
        );
        assert!(
            !p.may_list_bucket("StatusFunction", "longhaul-databucket"),
            "a missing result reads as 403 to the status function"
        );
    }

    /// Regression: the reaper reads a running job's record and progress with a Query on the
    /// table, which its policy once granted on the status index only.
    #[test]
    fn the_reaper_may_query_the_table_and_its_status_index_but_not_the_owner_index() {
        let p = policies();
        let query = |index: Option<&str>| {
            let key = match index {
                None => "pk",
                Some("OwnerIndex") => "gsi1pk",
                Some(_) => "gsi2pk",
            };
            let mut body = serde_json::json!({"TableName": "longhaul-JobsTable", "KeyConditionExpression": "#k = :v AND begins_with(sk, :s)",
                "ExpressionAttributeNames": {"#k": key}, "ExpressionAttributeValues": {":v": {"S": "JOB#1"}, ":s": {"S": "J"}}});
            if let Some(index) = index {
                body["IndexName"] = index.into();
            }
            dynamodb(&p, "Query", body)
        };
        assert_eq!(query(None)[0].context["dynamodb:LeadingKeys"], vec!["JOB#1".to_owned()]);
        p.check("ReaperFunction", &query(None)).unwrap();
        p.check("ReaperFunction", &query(Some("StatusIndex"))).unwrap();
        let denial = p.check("ReaperFunction", &query(Some("OwnerIndex"))).unwrap_err();
        assert_eq!(denial.resource, format!("{TABLE}/index/OwnerIndex"));
        assert!(
            denial.message.contains("is not authorized to perform: dynamodb:Query"),
            "{}",
            denial.message
        );
    }

    #[test]
    fn leading_key_conditions_confine_a_function_to_its_items() {
        let p = policies();
        let get_item = |pk: &str| {
            dynamodb(
                &p,
                "GetItem",
                serde_json::json!({"TableName": "longhaul-JobsTable", "Key": {"pk": {"S": pk}, "sk": {"S": "x"}}}),
            )
        };
        p.check("WebhooksFunction", &get_item("SECRET#alice")).unwrap();
        p.check("WebhooksFunction", &get_item("WARMUP")).unwrap();
        assert!(
            p.check("WebhooksFunction", &get_item("JOB#1")).is_err(),
            "a job record is not the webhooks function's"
        );
        p.check("DispatcherFunction", &get_item("WARMUP")).unwrap();
        p.check("DispatcherFunction", &get_item("JOB#1")).unwrap();
        assert!(
            p.check("DispatcherFunction", &get_item("SECRET#5:alice")).is_err(),
            "the dispatcher reads jobs, never secrets"
        );
        // Running slots: each function that takes or frees them reaches only SLOTS#/WAITING#.
        for function in ["DispatcherFunction", "SlotsFunction", "ReaperFunction"] {
            p.check(function, &get_item("SLOTS#T#5:alice")).unwrap();
        }
        assert!(p.check("SlotsFunction", &get_item("JOB#1")).is_err(), "slots never reads jobs");
        assert!(p.check("SubmitFunction", &get_item("SLOTS#T#5:alice")).is_err());
        // Table grants are confined to the item kinds each function works on.
        let put = |pk: &str| {
            dynamodb(
                &p,
                "PutItem",
                serde_json::json!({"TableName": "longhaul-JobsTable", "Item": {"pk": {"S": pk}, "sk": {"S": "x"}}}),
            )
        };
        p.check("SubmitFunction", &put("JOB#1")).unwrap();
        p.check("SubmitFunction", &put("IDEM#5:alice#k")).unwrap();
        assert!(
            p.check("SubmitFunction", &put("SECRET#5:alice")).is_err(),
            "submit may not write signing secrets"
        );
        p.check("WebhookFunction", &get_item("SECRET#5:alice")).unwrap();
        p.check("WebhookFunction", &get_item("JOB#1")).unwrap();
        p.check("WebhookFunction", &put("DELIVERY#1")).unwrap();
        p.check("WebhookFunction", &put("SECRET#5:alice")).unwrap();
        assert!(
            p.check("WebhookFunction", &put("JOB#1")).is_err(),
            "the deliverer writes delivery records, never over a job record"
        );
        assert!(p.check("WebhookFunction", &put("IDEM#5:alice#k")).is_err());
        assert!(p.check("WebhooksFunction", &put("DELIVERY#1")).is_err());
        assert!(
            p.check("StageFunction", &get_item("SECRET#5:alice")).is_err(),
            "a stage never reads secrets"
        );
        let unreadable = p.accesses(
            "dynamodb:GetItem",
            &Method::POST,
            &"/".parse().unwrap(),
            &HeaderMap::new(),
            serde_json::json!({"TableName": "longhaul-JobsTable", "Key": {"id": {"S": "JOB#1"}}})
                .to_string()
                .as_bytes(),
        );
        assert!(
            unreadable.is_err(),
            "a key without the partition key is refused, not allowed vacuously"
        );
    }

    #[test]
    fn a_copy_needs_read_on_its_source_and_write_on_its_target() {
        let p = policies();
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-amz-copy-source",
            "longhaul-databucket/checkpoints%2Fj1%2Fresult".parse().unwrap(),
        );
        let accesses = p
            .accesses(
                "s3:CopyObject",
                &Method::PUT,
                &"/longhaul-databucket/results/j1/report.json".parse().unwrap(),
                &headers,
                b"",
            )
            .unwrap();
        assert_eq!(accesses[1].resource, "arn:aws:s3:::longhaul-databucket/checkpoints/j1/result");
        p.check("StageFunction", &accesses).unwrap();
        assert!(p.check("StatusFunction", &accesses).is_err());
    }

    /// Every worker role may run a multipart result upload under results/ — create, upload,
    /// complete (PutObject), list its parts and abort it — and nothing of it elsewhere.
    #[test]
    fn worker_roles_may_upload_results_in_parts() {
        let p = policies();
        let call = |op: &str, method: Method, uri: &str| {
            p.accesses(&format!("s3:{op}"), &method, &uri.parse().unwrap(), &HeaderMap::new(), b"")
                .unwrap()
        };
        let key = "/longhaul-databucket/results/j1/1/big.bin";
        let calls = [
            call(
                "CreateMultipartUpload",
                Method::POST,
                &format!("{key}?uploads&x-id=CreateMultipartUpload"),
            ),
            call(
                "UploadPart",
                Method::PUT,
                &format!("{key}?x-id=UploadPart&partNumber=1&uploadId=u"),
            ),
            call("CompleteMultipartUpload", Method::POST, &format!("{key}?uploadId=u")),
            call("ListParts", Method::GET, &format!("{key}?x-id=ListParts&max-parts=1&uploadId=u")),
            call(
                "AbortMultipartUpload",
                Method::DELETE,
                &format!("{key}?x-id=AbortMultipartUpload&uploadId=u"),
            ),
        ];
        assert_eq!(calls[3][0].action, "s3:ListMultipartUploadParts");
        for accesses in &calls {
            p.check("StageFunction", accesses).unwrap();
            p.check("CsvReportWorkerFunction", accesses).unwrap();
            assert!(p.check("StatusFunction", accesses).is_err());
        }
        let elsewhere = call(
            "AbortMultipartUpload",
            Method::DELETE,
            "/longhaul-databucket/uploads/x/y/z.csv?uploadId=u",
        );
        assert!(p.check("StageFunction", &elsewhere).is_err());
    }

    #[test]
    fn sam_policy_templates_and_batches() {
        let p = policies();
        let send = |op: &str, queue: &str| {
            let body =
                serde_json::json!({"QueueUrl": format!("http://127.0.0.1:1/123456789012/{queue}")});
            p.accesses(
                &format!("sqs:{op}"),
                &Method::POST,
                &"/".parse().unwrap(),
                &HeaderMap::new(),
                body.to_string().as_bytes(),
            )
            .unwrap()
        };
        p.check("SubmitFunction", &send("SendMessage", "longhaul-IntakeQueue")).unwrap();
        p.check("NotifierFunction", &send("SendMessageBatch", "longhaul-WebhookQueue")).unwrap();
        assert!(p.check("SubmitFunction", &send("SendMessage", "longhaul-WebhookQueue")).is_err());
        let invoke = [Access::new(
            "lambda:InvokeFunction",
            crate::template::function_arn("longhaul-StageFunction"),
        )];
        p.check("JobStateMachine", &invoke).unwrap();
        p.check_invoke(&crate::template::function_arn("longhaul-StageFunction")).unwrap();
        assert!(p.check_invoke(&crate::template::function_arn("longhaul-ReaperFunction")).is_err());
    }

    #[test]
    fn the_signer_is_read_from_the_header_or_a_presigned_url() {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "AWS4-HMAC-SHA256 Credential=StageFunction/20261123/us-east-1/s3/aws4_request, SignedHeaders=host".parse().unwrap());
        let signed = Credential::of(&"/b/k".parse().unwrap(), &headers).unwrap();
        assert_eq!((signed.key.as_str(), signed.service.as_str()), ("StageFunction", "s3"));
        let presigned: Uri = "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=UploadsFunction%2F20261123%2Fus-east-1%2Fs3%2Faws4_request".parse().unwrap();
        let presigned = Credential::of(&presigned, &HeaderMap::new()).unwrap();
        assert_eq!((presigned.key.as_str(), presigned.service.as_str()), ("UploadsFunction", "s3"));
    }

    #[test]
    fn every_function_of_the_template_has_a_role() {
        let p = policies();
        for name in [
            "SubmitFunction",
            "StatusFunction",
            "StageFunction",
            "ReaperFunction",
            "JobStateMachine",
        ] {
            assert!(p.knows(name), "{name}");
        }
        assert!(!p.knows("longhaul"), "the administrator's key is not a role");
    }
}

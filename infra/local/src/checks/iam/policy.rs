//! The role policies of the template's functions and state machines, parsed: their own
//! statements, the SAM policy templates they use and what SAM attaches for event sources;
//! and the template's plain `AWS::IAM::Role`s a service acts as (EventBridge Scheduler's
//! role): their inline policies and their trust policy.

use anyhow::{anyhow, bail};
use serde_json::Value;

use crate::stack::template::{ACCOUNT, REGION, Template};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Effect {
    Allow,
    Deny,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Quantifier {
    Single,
    ForAll,
    ForAny,
}

#[derive(Debug, Clone)]
pub(super) struct Condition {
    pub(super) quantifier: Quantifier,
    pub(super) like: bool,
    pub(super) key: String,
    pub(super) values: Vec<String>,
}

#[derive(Debug, Clone)]
pub(super) struct Statement {
    pub(super) effect: Effect,
    pub(super) actions: Vec<String>,
    pub(super) resources: Vec<String>,
    pub(super) conditions: Vec<Condition>,
}

/// The statements of a function's or state machine's role: its `Policies`, and what SAM
/// attaches for its event sources.
pub(super) fn role_statements(
    template: &Template,
    resource: &Value,
) -> anyhow::Result<Vec<Statement>> {
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
                    "policy template {other} is not modelled by the local IAM check (infra/local/src/checks/iam/policy.rs)"
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

/// A statement of a role's trust policy: the services it lets assume the role (`Principal:
/// {Service: …}`), and the statement itself (`sts:AssumeRole` on `*`, with its conditions).
#[derive(Debug, Clone)]
pub(super) struct Trust {
    pub(super) services: Vec<String>,
    pub(super) statement: Statement,
}

/// The statements of a plain `AWS::IAM::Role`: its inline `Policies`
/// (`PolicyName`/`PolicyDocument`), and its trust policy (`AssumeRolePolicyDocument`), whose
/// principals may only be services. A managed policy is an error, as for functions.
pub(super) fn iam_role(
    template: &Template,
    resource: &Value,
) -> anyhow::Result<(Vec<Statement>, Vec<Trust>)> {
    let props = template.resolve(&resource["Properties"])?;
    for key in props.as_object().into_iter().flatten().map(|(k, _)| k) {
        if !["AssumeRolePolicyDocument", "Policies", "RoleName", "Description", "Path", "Tags"]
            .contains(&key.as_str())
        {
            bail!("role property {key} is not modelled by the local IAM check");
        }
    }
    let list = |value: &Value| match value {
        Value::Null => vec![],
        Value::Array(items) => items.clone(),
        other => vec![other.clone()],
    };
    let mut statements = Vec::new();
    for policy in list(&props["Policies"]) {
        for statement in list(&policy["PolicyDocument"]["Statement"]) {
            statements.push(parse_statement(&statement)?);
        }
    }
    let mut trust = Vec::new();
    for statement in list(&props["AssumeRolePolicyDocument"]["Statement"]) {
        let principal = &statement["Principal"];
        if principal.as_object().is_none_or(|p| p.keys().any(|k| k != "Service")) {
            bail!(
                "trust principal {principal} is not modelled by the local IAM check (services only)"
            );
        }
        let services = strings(&principal["Service"])?;
        let mut rest = statement.clone();
        if let Some(rest) = rest.as_object_mut() {
            rest.remove("Principal");
            rest.insert("Resource".into(), Value::String("*".into()));
        }
        trust.push(Trust { services, statement: parse_statement(&rest)? });
    }
    Ok((statements, trust))
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
                "iam:passedtoservice" => &"iam:PassedToService".to_owned(),
                // In trust policies: who asks a service to assume the role.
                "aws:sourceaccount" => &"aws:SourceAccount".to_owned(),
                "aws:sourcearn" => &"aws:SourceArn".to_owned(),
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

//! Judging a request's accesses against the caller's statements, as IAM does: an explicit
//! deny wins, else some allow must apply (actions and resources with wildcards, conditions).

use std::collections::{BTreeMap, HashMap};

use anyhow::Context;
use axum::http::Uri;
use serde_json::Value;

use super::policy::{Condition, Effect, Quantifier, Statement, Trust, iam_role, role_statements};
use super::requests::s3_path;
use super::{Access, Denial};
use crate::stack::template::{ACCOUNT, Template};

/// EventBridge Scheduler's service principal (what a schedule's role must trust).
pub const SCHEDULER_SERVICE: &str = "scheduler.amazonaws.com";

/// Every principal's statements, resolved from the template.
#[derive(Debug, Clone, Default)]
pub struct Policies {
    by_principal: HashMap<String, Vec<Statement>>,
    /// The partition key of each table and index, by ARN (for `dynamodb:LeadingKeys`).
    pub(super) hash_keys: HashMap<String, String>,
    /// The state machines (the callers of the Lambda Invoke API).
    state_machines: Vec<String>,
    /// The template's plain roles (a service acts as them) by ARN: their logical ids.
    roles: HashMap<String, String>,
    /// Their trust policies, by logical id.
    trusts: HashMap<String, Vec<Trust>>,
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
        let (mut roles, mut trusts) = (HashMap::new(), HashMap::new());
        for (logical, resource) in template.of_type("AWS::IAM::Role") {
            let (statements, trust) = iam_role(template, resource)
                .with_context(|| format!("the policies of {logical}"))?;
            by_principal.insert(logical.clone(), statements);
            trusts.insert(logical.clone(), trust);
            roles.insert(template.attribute(logical, "Arn")?, logical.clone());
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
        Ok(Self { by_principal, hash_keys, state_machines, roles, trusts })
    }

    /// Checks that `service` may act as the role `role_arn` on behalf of `source_arn` (a
    /// schedule) — the role is one of the template's and trusts the service, as its trust
    /// policy's conditions on `aws:SourceAccount` and `aws:SourceArn` allow — and that the role
    /// grants `accesses`.
    pub fn check_service_role(
        &self,
        service: &str,
        role_arn: &str,
        source_arn: &str,
        accesses: &[Access],
    ) -> Result<(), Denial> {
        let refuse = |message: String| Denial {
            principal: service.to_owned(),
            action: "sts:AssumeRole".into(),
            resource: role_arn.to_owned(),
            message,
        };
        let Some(logical) = self.roles.get(role_arn) else {
            return Err(refuse(format!(
                "{service} cannot assume {role_arn}: the template has no such role"
            )));
        };
        let assume = Access::new("sts:AssumeRole", "*")
            .with("aws:SourceAccount", vec![ACCOUNT.to_owned()])
            .with("aws:SourceArn", vec![source_arn.to_owned()]);
        let trusting: Vec<&Statement> = self.trusts[logical]
            .iter()
            .filter(|t| t.services.iter().any(|s| s == service))
            .map(|t| &t.statement)
            .collect();
        if let Some(why) = refusal(&trusting, &assume) {
            return Err(refuse(format!(
                "{service} is not authorized to perform: sts:AssumeRole on resource: {role_arn} (for {source_arn}) {why}"
            )));
        }
        self.check(logical, accesses).map_err(|mut denial| {
            denial.principal = format!("{logical} (assumed by {service})");
            denial
        })
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
        let statements: Vec<&Statement> =
            self.by_principal.get(principal).into_iter().flatten().collect();
        for access in accesses {
            if let Some(why) = refusal(&statements, access) {
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
}

/// Why `statements` refuse `access` (an explicit deny, or no allow applies); `None` if they
/// allow it.
fn refusal(statements: &[&Statement], access: &Access) -> Option<&'static str> {
    let applies = |s: &&&Statement| {
        s.actions.iter().any(|a| glob(&a.to_ascii_lowercase(), &access.action.to_ascii_lowercase()))
            && s.resources.iter().any(|r| glob(r, &access.resource))
            && s.conditions.iter().all(|c| c.holds(&access.context))
    };
    if statements.iter().filter(|s| s.effect == Effect::Deny).any(|s| applies(&s)) {
        Some("with an explicit deny")
    } else if !statements.iter().filter(|s| s.effect == Effect::Allow).any(|s| applies(&s)) {
        Some("because no identity-based policy allows it")
    } else {
        None
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

fn hash_key(schema: &Value) -> Option<String> {
    schema
        .as_array()?
        .iter()
        .find(|k| k["KeyType"] == "HASH")
        .and_then(|k| k["AttributeName"].as_str())
        .map(str::to_owned)
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

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
//! managed policies SAM attaches for SQS and DynamoDB stream event sources; plain
//! `AWS::IAM::Role`s a service acts as (EventBridge Scheduler sending a schedule's firing as
//! the schedule's role: the role's inline policies, and its trust policy's service principals
//! with `aws:SourceAccount`/`aws:SourceArn` conditions). For each request, the IAM actions it
//! needs, the resources and the condition keys `dynamodb:LeadingKeys`, `s3:prefix` and
//! `iam:PassedToService` (a schedule created or updated with a role passes it to Scheduler:
//! `iam:PassRole`). Anything else — another policy template, a managed policy, a condition
//! operator, a request the edge cannot name — is an error, never a silent allow, so a template
//! or code change the check does not understand fails loudly.
//!
//! One file per concern: `policy` parses the role policies of the template, `requests` names
//! the IAM accesses a request needs (per service), `evaluate` judges them against the policies;
//! this file names the callers.

mod evaluate;
mod policy;
mod requests;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use axum::http::{HeaderMap, Uri};

pub use evaluate::{Policies, SCHEDULER_SERVICE};

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
    pub(super) fn new(action: impl Into<String>, resource: impl Into<String>) -> Self {
        Self { action: action.into(), resource: resource.into(), context: BTreeMap::new() }
    }

    /// `lambda:InvokeFunction` on `function_arn`.
    pub fn invoke(function_arn: &str) -> Self {
        Self::new("lambda:InvokeFunction", function_arn)
    }

    /// `sqs:SendMessage` to the queue `queue_arn`.
    pub fn send_message(queue_arn: &str) -> Self {
        Self::new("sqs:SendMessage", queue_arn)
    }

    pub(super) fn with(mut self, key: &str, values: Vec<String>) -> Self {
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

//! The fault plan a test installs (`POST /_local/faults`), and the counts it reads back.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Which faults to inject, and how often. All probabilities are per opportunity (per AWS
/// call, per batch) and default to zero: no plan, no faults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultPlan {
    /// Logical names of the functions whose invocations may crash (empty: none).
    pub crash_functions: Vec<String>,
    /// Probability that an invocation crashes just before an AWS call.
    pub crash_before_call: f64,
    /// Probability that an invocation crashes just after an AWS call took effect.
    pub crash_after_call: f64,
    /// When set, crashes strike only the calls it matches (a test aiming at one moment of one
    /// job); `None`: any call of the planned functions.
    pub crash_only: Option<CallMatch>,
    /// Most crashes injected into the invocations of any one job (0: unlimited). Keeps every
    /// job within the state machine's retry budget, so that a correct system finishes every
    /// job and a lost or failed one is a finding, not bad luck.
    pub max_crashes_per_job: u32,
    /// Probability that the edge answers an AWS call with a throttling error.
    pub throttle: f64,
    /// When set, the edge refuses every call it matches with `AccessDenied`, worded as IAM
    /// words it (the caller's role ARN with the account, the resource's ARN): an AWS error
    /// whose text names our infrastructure, for tests that check no client is ever shown it.
    pub deny: Option<CallMatch>,
    /// When set, throttling strikes only the calls it matches (a test holding one job's
    /// `StartExecution` back, say); `None`: any call.
    pub throttle_only: Option<CallMatch>,
    /// Probability that an SQS or DynamoDB stream batch is delivered to its function twice at once.
    pub duplicate_delivery: f64,
    /// Probability that a job's start is delivered twice: the edge sends a `StartExecution`
    /// twice, answering with the second answer (the first is lost after it took effect), or
    /// runs a function's asynchronous invocation (a direct run) twice, as Lambda may deliver an
    /// event more than once.
    pub duplicate_start: f64,
    /// Logical names of the functions whose invocations may pause (empty: none).
    pub pause_functions: Vec<String>,
    /// Probability that an invocation holding a job's lease pauses just before an AWS call
    /// (at most once per job).
    pub pause_before_call: f64,
    /// When set, pauses strike only the calls it matches (a test aiming at one write, say a
    /// stage boundary); `None`: any call of the planned functions.
    pub pause_only: Option<CallMatch>,
    /// Most pauses in all (0: unlimited). A test at scale pauses only its first jobs, while
    /// few jobs run and the reaper, fired often, examines every running job each time.
    pub max_pauses: u64,
    /// How long a pause lasts, in milliseconds: make it longer than the reaper's heartbeat
    /// timeout, so that the paused attempt is declared dead while it still lives. (The hosted
    /// functions' SDK runs without stalled-stream protection, whose timers would otherwise cut
    /// a pause short, where a frozen sandbox freezes them too.)
    pub pause_ms: u64,
    /// Whether to keep the journal of DynamoDB writes.
    pub journal: bool,
    /// Seed of the fault dice (runs with the same seed and timing draw the same faults).
    pub seed: u64,
}

/// The calls a fault plan aims at: one operation, whose request (URI or body) contains a text.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CallMatch {
    /// `service:Operation`, as the edge names calls (`dynamodb:PutItem`, `s3:PutObject`…), or
    /// several separated by `|` (`lambda:Invoke|states:StartExecution`: a job's start either way).
    pub operation: String,
    /// Text the request's URI or body contains (a job id, a key prefix…).
    pub contains: String,
}

impl CallMatch {
    pub(super) fn matches(&self, operation: &str, uri: &str, body: Option<&[u8]>) -> bool {
        let needle = self.contains.as_bytes();
        let contains = |haystack: &[u8]| {
            needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
        };
        self.operation.split('|').any(|o| o == operation)
            && (contains(uri.as_bytes()) || body.is_some_and(contains))
    }
}

/// How many faults were injected, by kind (`GET /_local/faults`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultCounts {
    /// Invocations crashed before an AWS call.
    pub crashed_before_call: u64,
    /// Invocations crashed after an AWS call took effect.
    pub crashed_after_call: u64,
    /// AWS calls answered with a throttling error.
    pub throttled: u64,
    /// AWS calls refused with `AccessDenied` ([`FaultPlan::deny`]).
    #[serde(default)]
    pub denied: u64,
    /// SQS and stream batches delivered twice.
    pub duplicated_batches: u64,
    /// `StartExecution` calls sent twice.
    pub duplicated_starts: u64,
    /// Invocations paused before an AWS call.
    pub paused: u64,
    /// Pauses that are over: the call went out and was answered, or the invocation died (or
    /// the SDK gave up on the call) meanwhile.
    pub pauses_over: u64,
    /// Crashes by where they struck: `"<function> <service:Operation> before|after"`.
    pub crash_sites: BTreeMap<String, u64>,
    /// Pauses by where they struck: `"<function> <service:Operation>"`.
    pub pause_sites: BTreeMap<String, u64>,
}

//! Fault injection: the failures AWS and Lambda inflict on a job system, on demand.
//!
//! A test installs a [`FaultPlan`] (`POST /_local/faults`) and the stack then
//! * **crashes** invocations of the chosen functions just *before* an AWS call leaves the
//!   function, or just *after* the call took effect and before the function saw the answer
//!   (the invocation ends as a Lambda sandbox crash does: `Runtime.ExitError`, or a 502 from
//!   API Gateway for an API function), at most `max_crashes_per_job` times per job (or per
//!   submission, for the API: per `Idempotency-Key`), counted per function, AWS operation and
//!   side of the call;
//! * **pauses** an invocation that holds a job's lease just before an AWS call, for longer
//!   than the reaper's heartbeat timeout, then lets the call go: a worker frozen (a throttled
//!   sandbox, a long stop of the world) while the reaper declares it dead and a new attempt
//!   takes the job, whose stale writes must then be refused;
//! * **delivers `StartExecution` twice** at the edge, the first answer lost, as when the SDK
//!   retries a call whose answer timed out after it took effect;
//! * **throttles** AWS calls at the edge (`ThrottlingException`, S3 `SlowDown`), which the
//!   SDK retries and the code must survive when retries run out;
//! * **delivers SQS and stream batches twice**, concurrently, as at-least-once delivery may;
//! * keeps a **journal** of every DynamoDB write that took effect, and of every write made
//!   under a lease that the table refused, in the order the table applied them, with the
//!   lease of the attempt that made it — so a checker can prove that no write of an attempt
//!   landed after a newer attempt took the job, and that stale attempts did try.
//!
//! Crashes happen in the SDK's HTTP client ([`FaultyHttpClient`]), which knows the
//! invocation it runs in through a task-local set by the host ([`Invocation`]); throttling
//! and the journal happen in the edge, which sees every call's wire form.
//!
//! One file per concern: `plan` (what to inject), `injector` (the dice and the counts),
//! `journal` (the writes), `invocation` (which invocation a call belongs to) and `client` (the
//! SDK's faulty HTTP client).

mod client;
mod injector;
mod invocation;
mod journal;
mod plan;

pub use client::FaultyHttpClient;
pub use injector::{Crash, Faults};
pub use invocation::{AwsUse, Invocation};
pub use journal::JournalEntry;
pub use plan::{CallMatch, FaultCounts, FaultPlan};

/// The header that carries an attempt's lease from the function to the edge's journal.
pub const LEASE_HEADER: &str = "x-longhaul-lease";
/// The header that names the function making a call, for the edge's per-function counts.
pub const FUNCTION_HEADER: &str = "x-longhaul-function";
/// The header that names the invocation making a call (see [`Faults::journal_write`]).
pub const INVOCATION_HEADER: &str = "x-longhaul-invocation";

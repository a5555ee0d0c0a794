//! The submission rate counted on the tenant pool's holders item, so that a new job's slot and
//! its submission are charged in **one** conditional write.
//!
//! Where a deployment bounds each tenant's running jobs (`LONGHAUL_TENANT_MAX_RUNNING` > 0),
//! the submit function takes a new job's slot of its tenant's pool before it writes the job
//! (`dispatcher::seated`). The tenant's submission counter lives on that pool's holders item
//! (`SLOTS#T#<len>:<owner>` / `HOLDERS`) as two attributes, `rate_window` (the minute's
//! index) and `rate_n` (its count), so that write also counts the submission: a job that
//! starts at once costs one request for both instead of two. A submission that does not take
//! a slot (the pool is full: it waits) is charged on the same item alone
//! ([`SlotStore::charge`]), so a tenant has one counter however its jobs start. Without a
//! tenant pool, the counter is an item per minute (`crate::limits::TenantRateLimiter`).
//!
//! The window is the fixed one-minute window of [`RateWindow`]. DynamoDB has no `max()` in
//! an update expression, so a charge either adds to the stored window or opens a newer one
//! ([`WindowCharge`]), and a refused charge reads the item returned with its refusal to tell
//! which it should have been: at most one extra request, for the first charge a process makes
//! in a window another process opened (each process remembers the window it last saw stored
//! per pool).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use longhaul_domain::limits::{RateWindow, WindowCharge};
use longhaul_domain::{JobId, Owner};

use crate::AwsError;
use crate::limits::Admission;
use crate::ports::{Clock, RateLimits, SlotPools, Warm};
use crate::slots::{HOLDERS_SK, Pool, SlotStore, run_attribute};

/// The charges a process remembers the window of (one per tenant pool); past it, it forgets
/// them all and its next charges guess again.
const REMEMBERED_POOLS: usize = 10_000;

/// How many writes one charge tries: a refusal reads the item, so the second try is right
/// unless another process changed the window meanwhile.
const TRIES: usize = 4;

/// A submission to count with a slot: the tenant's limit per minute (0: none) and the time
/// the submission is counted at (epoch seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateCharge {
    /// Submissions one tenant may make per minute; 0: unlimited (nothing is counted).
    pub per_minute: u32,
    /// When the submission is made (epoch seconds): the window it counts in.
    pub now: i64,
}

/// What [`SlotStore::acquire_counting`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charged {
    /// The job holds a slot of the pool, and its submission is counted.
    Taken,
    /// The pool is full: nothing changed (neither a slot taken nor a submission counted).
    Full,
    /// The tenant used up this window's submissions: nothing changed; retry after this many
    /// seconds.
    Limited {
        /// Seconds to the next window.
        retry_after: u64,
    },
}

impl Charged {
    /// A plain acquire's answer: [`Charged::Taken`] if the job holds a slot, else
    /// [`Charged::Full`].
    pub fn of_acquire(taken: bool) -> Self {
        if taken { Charged::Taken } else { Charged::Full }
    }
}

/// The windows a process last saw stored, by pool: the first guess of its next charge.
#[derive(Debug, Clone, Default)]
pub struct SeenWindows(Arc<Mutex<HashMap<String, i64>>>);

impl SeenWindows {
    fn get(&self, pool: &str) -> Option<i64> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).get(pool).copied()
    }

    fn set(&self, pool: &str, window: i64) {
        let mut seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.len() >= REMEMBERED_POOLS && !seen.contains_key(pool) {
            seen.clear();
        }
        seen.insert(pool.to_owned(), window);
    }
}

/// A slot to take in the same write as the charge.
#[derive(Debug, Clone, Copy)]
struct SlotTake<'a> {
    limit: u32,
    job_id: &'a JobId,
    run: u32,
}

impl SlotStore {
    /// Takes a slot of `pool` (of `limit`) for run `run` of `job_id`, as
    /// [`SlotStore::acquire`] does, and counts the submission `rate` (`per_minute` > 0) in the
    /// same write: both, or neither. A full pool answers [`Charged::Full`] (whatever the window
    /// says: the submission may still be refused for its backlog, which is checked before its
    /// rate); a full window [`Charged::Limited`].
    pub async fn acquire_counting(
        &self,
        pool: &Pool,
        limit: u32,
        job_id: &JobId,
        run: u32,
        rate: RateCharge,
    ) -> Result<Charged, AwsError> {
        debug_assert!(rate.per_minute > 0, "a plain acquire has no window to count in");
        self.charge_write(pool, Some(SlotTake { limit, job_id, run }), rate).await
    }

    /// Counts the submission `rate` (`per_minute` > 0) on `pool`'s item alone (a submission
    /// that takes no slot).
    pub async fn count_submission(
        &self,
        pool: &Pool,
        rate: RateCharge,
    ) -> Result<Admission, AwsError> {
        debug_assert!(rate.per_minute > 0, "no limit: nothing to count");
        match self.charge_write(pool, None, rate).await? {
            Charged::Limited { retry_after } => Ok(Admission::Limited { retry_after }),
            Charged::Taken | Charged::Full => Ok(Admission::Admitted),
        }
    }

    async fn charge_write(
        &self,
        pool: &Pool,
        slot: Option<SlotTake<'_>>,
        rate: RateCharge,
    ) -> Result<Charged, AwsError> {
        let window = RateWindow::at(rate.now);
        let pk = pool.holders_pk();
        let mut charge = WindowCharge::first(window.index, self.seen_windows.get(&pk));
        for _ in 0..TRIES {
            let mut adds: Vec<&str> = Vec::new();
            let mut sets: Vec<&str> = Vec::new();
            let mut conditions: Vec<&str> = Vec::new();
            let mut update = self
                .client
                .update_item()
                .table_name(&self.table)
                .key("pk", AttributeValue::S(pk.clone()))
                .key("sk", AttributeValue::S(HOLDERS_SK.into()))
                .expression_attribute_values(":w", n(charge.index()))
                .expression_attribute_values(":one", n(1))
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                );
            match charge {
                WindowCharge::Add { .. } => {
                    adds.push("rate_n :one");
                    conditions.push("rate_window = :w AND rate_n < :per_minute");
                    update = update.expression_attribute_values(":per_minute", n(rate.per_minute));
                }
                WindowCharge::Open { index } => {
                    sets.push("rate_window = :w, rate_n = :one");
                    // Older, or further ahead than the next minute (a clock far off): stale.
                    conditions.push(
                        "(attribute_not_exists(rate_window) OR rate_window < :w OR rate_window > :ahead)",
                    );
                    update = update.expression_attribute_values(":ahead", n(index + 1));
                }
            }
            if let Some(slot) = slot {
                adds.push("holders :job");
                sets.push("#run = :run");
                conditions.push(
                    "(attribute_not_exists(holders) OR size(holders) < :limit OR contains(holders, :id))",
                );
                update = update
                    .expression_attribute_names("#run", run_attribute(slot.job_id))
                    .expression_attribute_values(":run", n(slot.run))
                    .expression_attribute_values(
                        ":job",
                        AttributeValue::Ss(vec![slot.job_id.to_string()]),
                    )
                    .expression_attribute_values(":id", AttributeValue::S(slot.job_id.to_string()))
                    .expression_attribute_values(":limit", n(slot.limit));
            }
            let mut clauses = Vec::with_capacity(2);
            if !adds.is_empty() {
                clauses.push(format!("ADD {}", adds.join(", ")));
            }
            if !sets.is_empty() {
                clauses.push(format!("SET {}", sets.join(", ")));
            }
            let expression = clauses.join(" ");
            let result = update
                .update_expression(expression)
                .condition_expression(conditions.join(" AND "))
                .send()
                .await;
            let item = match result {
                Ok(_) => {
                    self.seen_windows.set(&pk, charge.index());
                    return Ok(Charged::Taken);
                }
                Err(err) => match err.as_service_error() {
                    Some(UpdateItemError::ConditionalCheckFailedException(refused)) => {
                        refused.item().cloned().unwrap_or_default()
                    }
                    _ => {
                        let what = match slot {
                            Some(slot) => format!("take a slot for job {}", slot.job_id),
                            None => "count a submission".to_owned(),
                        };
                        return Err(AwsError::new(what, err));
                    }
                },
            };
            if let Some(slot) = slot
                && !has_room(&item, slot)
            {
                return Ok(Charged::Full);
            }
            let stored = stored_window(&item);
            if let Some((stored, _)) = stored {
                self.seen_windows.set(&pk, stored);
            }
            match WindowCharge::after_refusal(window.index, stored, rate.per_minute) {
                Some(next) => charge = next,
                None => return Ok(Charged::Limited { retry_after: window.retry_after }),
            }
        }
        Err(AwsError::new(
            "count a submission",
            std::io::Error::other(format!(
                "the window of {pk} changed under each of {TRIES} tries"
            )),
        ))
    }
}

/// Whether the holders item as it was (`item`) had a slot for `slot`'s job, as the acquire's
/// condition asks.
fn has_room(item: &HashMap<String, AttributeValue>, slot: SlotTake<'_>) -> bool {
    match item.get("holders") {
        Some(AttributeValue::Ss(holders)) => {
            holders.len() < slot.limit as usize || holders.iter().any(|h| h == slot.job_id.as_str())
        }
        _ => true,
    }
}

/// The window and count stored on the item, if it has both.
fn stored_window(item: &HashMap<String, AttributeValue>) -> Option<(i64, u64)> {
    let number = |name: &str| match item.get(name) {
        Some(AttributeValue::N(text)) => text.parse().ok(),
        _ => None,
    };
    Some((number("rate_window")?, number("rate_n")? as u64))
}

fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

/// The submission limit of a deployment that bounds tenants' running jobs: charged on each
/// tenant pool's holders item through the slot pools' port, in the clock's minutes (see the
/// module). [`SlotPools::acquire_charged`] charges the same counter when it takes a slot.
#[derive(Debug, Clone)]
pub struct PoolRateLimiter {
    slots: Arc<dyn SlotPools>,
    per_minute: u32,
    clock: Arc<dyn Clock>,
}

impl PoolRateLimiter {
    /// `per_minute` submissions per tenant (0: off), counted on `slots`' tenant pools.
    pub fn new(slots: Arc<dyn SlotPools>, per_minute: u32, clock: Arc<dyn Clock>) -> Self {
        PoolRateLimiter { slots, per_minute, clock }
    }

    /// The charge of a submission made now.
    pub fn charge_now(&self) -> RateCharge {
        RateCharge { per_minute: self.per_minute, now: self.clock.now().timestamp() }
    }
}

#[async_trait::async_trait]
impl Warm for PoolRateLimiter {}

#[async_trait::async_trait]
impl RateLimits for PoolRateLimiter {
    async fn charge(&self, owner: &Owner) -> Result<Admission, AwsError> {
        self.slots.charge(&Pool::Tenant(owner.to_owned()), self.charge_now()).await
    }
}

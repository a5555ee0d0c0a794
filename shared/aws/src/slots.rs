//! Running-job slots and waiting lists, kept in the job table (the rules and the admission
//! order are [`longhaul_domain::admission`]).
//!
//! | item | pk / sk |
//! |------|---------|
//! | a pool's holders | `SLOTS#T#<len>:<owner>` or `SLOTS#K#<len>:<kind>` / `HOLDERS` — `holders` (string set of job ids); a tenant pool's also `rate_window`, `rate_n` (its submissions: [`crate::pool_rate`]) |
//! | a job waiting in a tenant pool | `WAITING#T#<len>:<owner>` / `<priority>#<created_at>#<job id>` — `job_id`, `owner` |
//! | a job waiting in a kind pool (its tenant's list) | `WAITING#K#<len>:<kind>#T#<len>:<owner>` / `<priority>#<created_at>#<job id>` — `job_id`, `owner` |
//! | a tenant's place in a kind pool's ring | `WAITING#K#<len>:<kind>` / `RING#<served>#<len>:<owner>` — `owner`, `served` |
//! | which place is the tenant's | `WAITING#K#<len>:<kind>` / `MEMBER#<len>:<owner>` — `owner`, `ring` (the place's sort key), `served` |
//!
//! A slot is taken by one conditional `UpdateItem` (`ADD holders :job` if the set has room or
//! already holds the job: idempotent) and given back by one unconditional `DELETE holders
//! :job` (idempotent too), so a redelivered message or a retried stream record never takes two
//! slots or frees someone else's. The set names its holders, which is what lets the reaper
//! reconcile a pool with the jobs that really run (a counter could only be trusted).
//!
//! Each holder's **run** is kept beside the set (`run#<job id>`: how many times the job had
//! been resumed when it took the slot). A pause gives its slot back on condition that the
//! holder is still the paused run ([`SlotStore::give_back_run`]): once the job is resumed and
//! its next run has taken the slot (the id was still in the set, so `acquire` only moved the
//! run on), a late give-back of the pause is refused instead of freeing the running job's
//! slot. (A holder written before runs were kept has none, and is given back as before.)
//!
//! A new job may take its slots **before its record is written** (submit seats a job that
//! starts at once, then writes it `queued`: `dispatcher::seated`). Its holder then names a
//! job that does not exist yet, so a reconciliation that finds a holder's job missing gives
//! the slot back only once [`UNWRITTEN_HOLDER_GRACE`] has passed since the job id was made
//! (a UUIDv7 carries the time): a request that took a slot and died before writing its job
//! leaves it held that long, and no request that can still write its job loses its slot.
//!
//! The holders item also carries the pool's **waiting mark** (`waiters`): whoever puts a job
//! in one of the pool's lists (or seats a tenant in its ring) sets it afterwards to a value
//! no one set before, and an admission that reads the lists and finds no job waiting removes
//! it on condition that it still holds the value the give-back returned. A give-back returns
//! the item, so the slots function, which frees a slot each time a job ends, reads the lists
//! only when the mark says a job may wait (most ends free a slot nobody waits for). Because
//! the mark is set after the entry is written, and taken away only if unchanged since a read
//! found nothing, a job in a list always has its mark set after it — unless its writer died
//! between the two writes, or (in a kind pool) an admission read the ring in the moment
//! another admission moved the tenant's place: then the reaper, which reads a pool's lists
//! whatever the mark says ([`Admitter::admit`]), wakes the job on its next run.
//!
//! A tenant pool's waiting list is a partition read in key order: priority, then submission
//! time. A kind pool is shared by tenants and admits them in turn: each tenant has its own list
//! (ordered the same way), and the pool's **ring** holds one place per tenant with waiting
//! jobs, ordered by when it was last served. Admitting reads the ring's first place, takes that
//! tenant's turn (its place moves to the back), and wakes the tenant's first job; a tenant
//! whose list is empty leaves the ring. About eight requests per admitted job, whatever the
//! backlog. A tenant joins the ring when a job of it enters its list.
//!
//! The tenant's `MEMBER#` item is the truth about its place: joining is a put of it on
//! condition that there is none (idempotent), taking a turn a put on condition that it still
//! names the place read (of two admitters at once, one takes the turn), leaving a delete on
//! the same condition. The `RING#` places are the order in which to read the members: each
//! change writes the member first, then the places. A place its member does not name (left
//! by a race or a crash between the two writes) is deleted by the admission that reads it; a
//! member whose place is missing (a crash after the member's write) is found by the reaper,
//! which checks the place of every tenant with waiting jobs once a run. No transaction: a
//! cancelled one would cost as much as the writes, and the local emulator's rollback of one
//! loses the table's stream.
//!
//! One file over 600 lines on purpose: the pools' holders, waiting lists and rings are written
//! together by conditional writes whose conditions must be read side by side.

use longhaul_domain::{JobId, Owner};
use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use longhaul_domain::admission::{RING_PREFIX, WaitReason, job_of_waiting_key, ring_key};
use longhaul_domain::format_rfc3339;

use crate::AwsError;
use crate::queue::{DispatchMessage, IntakeQueue};

fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

/// How long after a job id was made a slot held by that id counts as taken for a job about
/// to be written, if no job has it: longer than the request that took it can run (the
/// submit function's 15-second timeout, API Gateway's 30-second integration limit).
pub const UNWRITTEN_HOLDER_GRACE: std::time::Duration = std::time::Duration::from_secs(120);

/// Sort key of a pool's holders item.
pub(crate) const HOLDERS_SK: &str = "HOLDERS";

/// The holders item's attribute keeping which run of `job_id` holds its slot.
pub(crate) fn run_attribute(job_id: &JobId) -> String {
    format!("run#{job_id}")
}

/// The holders item's attribute marking that a job may wait in the pool's lists.
const WAITING_MARK: &str = "waiters";

/// A pool's holders item as a give-back left it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Held {
    /// How many jobs hold a slot of the pool.
    pub holders: usize,
    /// The pool's waiting mark (see the module doc): `None` when no job entered a waiting
    /// list of the pool since an admission last found the lists empty.
    pub waiting_mark: Option<String>,
}

impl Held {
    /// What a holders item (as an update returned it, or a read) says.
    fn of(attributes: Option<HashMap<String, AttributeValue>>) -> Held {
        let mut attributes = attributes.unwrap_or_default();
        Held {
            holders: attributes
                .remove("holders")
                .and_then(|v| v.as_ss().ok().map(Vec::len))
                .unwrap_or(0),
            waiting_mark: attributes.remove(WAITING_MARK).and_then(|v| v.as_s().ok().cloned()),
        }
    }
}

/// What an admission's first read of the waiting items found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Admission {
    /// How many jobs it woke.
    woken: usize,
    /// Whether that read found no job waiting at all (an empty list, or an empty ring).
    none_waiting: bool,
}

/// A limit on running jobs: its slots and its waiting list.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pool {
    /// One tenant's jobs (`LONGHAUL_TENANT_MAX_RUNNING`).
    Tenant(Owner),
    /// One kind's jobs (its policy's `concurrency_limit`).
    Kind(String),
}

impl Pool {
    /// The key part naming the pool; names are length-prefixed, so no owner or kind name can
    /// reach another's items.
    fn name(&self) -> String {
        match self {
            Pool::Tenant(owner) => format!("T#{}:{owner}", owner.len()),
            Pool::Kind(kind) => format!("K#{}:{kind}", kind.len()),
        }
    }

    /// Partition key of the pool's holders.
    pub fn holders_pk(&self) -> String {
        format!("SLOTS#{}", self.name())
    }

    /// Partition key of the pool's waiting items: a tenant pool's waiting list, a kind pool's
    /// ring (its tenants' lists are [`Pool::waiting_list_pk`]).
    pub fn waiting_pk(&self) -> String {
        format!("WAITING#{}", self.name())
    }

    /// Partition key of the list `owner`'s jobs wait in: a tenant pool's own list (the pool is
    /// `owner`'s), or `owner`'s list in a kind pool. Names are length-prefixed, so no tenant's
    /// list is another pool's partition.
    pub fn waiting_list_pk(&self, owner: &Owner) -> String {
        match self {
            Pool::Tenant(_) => self.waiting_pk(),
            Pool::Kind(_) => format!("{}#T#{}:{owner}", self.waiting_pk(), owner.len()),
        }
    }

    /// Whether the pool admits its tenants in turn (a kind pool, shared by tenants).
    fn takes_turns(&self) -> bool {
        matches!(self, Pool::Kind(_))
    }

    /// What a job refused by this pool waits for.
    pub fn reason(&self) -> WaitReason {
        match self {
            Pool::Tenant(_) => WaitReason::TenantLimit,
            Pool::Kind(_) => WaitReason::KindLimit,
        }
    }
}

/// The pools a job takes a slot of, with their limits: its tenant's (unless the tenant limit
/// is 0, off) and its kind's (if the kind has a `concurrency_limit`, copied onto the job at
/// submit).
pub fn pools_of(
    owner: &Owner,
    job_type: &str,
    kind_limit: Option<u32>,
    tenant_limit: u32,
) -> Vec<(Pool, u32)> {
    let mut pools = Vec::with_capacity(2);
    if tenant_limit > 0 {
        pools.push((Pool::Tenant(owner.to_owned()), tenant_limit));
    }
    if let Some(limit) = kind_limit.filter(|l| *l > 0) {
        pools.push((Pool::Kind(job_type.to_owned()), limit));
    }
    pools
}

/// A job in a waiting list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingEntry {
    /// Its sort key in the list.
    pub position: String,
    /// The job.
    pub job_id: JobId,
    /// Its owner (the message group of its dispatch message).
    pub owner: Owner,
}

/// A tenant's place in a kind pool's ring, as read from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// Its sort key in the ring ([`ring_key`]).
    pub key: String,
    /// The tenant.
    pub owner: Owner,
    /// When the tenant was last served (or joined the ring), as in the key.
    pub served: String,
}

/// Sort key of the item that names a tenant's place in a kind pool's ring.
fn member_sk(owner: &Owner) -> String {
    format!("MEMBER#{}:{owner}", owner.len())
}

/// Most ring places one admission passes without waking a job — places no member names any
/// more, tenants with no job left in their list (cancelled, or found a slot on their own): each
/// costs a few requests, so a run of them is cut off there and left to the next admission, or
/// the reaper's.
const MAX_EMPTY_TURNS: usize = 10;

/// What a conditional write of a tenant's `MEMBER#` item came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingChange {
    /// Written.
    Done,
    /// Refused by its condition: someone else changed the tenant's place first (or, on
    /// joining, the tenant has one already).
    Raced,
}

/// The condition of a write of a tenant's `MEMBER#` item.
#[derive(Debug, Clone, Copy)]
enum MemberIf<'a> {
    /// There is none (joining).
    Absent,
    /// It names this place (taking a turn, leaving).
    At(&'a str),
}

/// A tenant's place in a kind pool's ring, as the reaper found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seat {
    /// The tenant had its place.
    Seated,
    /// It had none: it joined the ring (at the back).
    Joined,
    /// Its member named a place that was missing: the place is written again.
    Restored,
}

/// The slot and waiting-list items of the job table.
#[derive(Debug, Clone)]
pub struct SlotStore {
    pub(crate) client: aws_sdk_dynamodb::Client,
    pub(crate) table: String,
    /// The submission window last seen stored on each tenant pool ([`crate::pool_rate`]).
    pub(crate) seen_windows: crate::pool_rate::SeenWindows,
}

impl SlotStore {
    /// An adapter for the slots kept in `table`.
    pub fn new(client: aws_sdk_dynamodb::Client, table: String) -> Self {
        SlotStore { client, table, seen_windows: Default::default() }
    }

    /// Takes a slot of `pool` (of `limit`) for run `run` of `job_id`: `true` if the job holds
    /// one now (also when it already did: the slot is then its run `run`'s), `false` if the
    /// pool is full.
    pub async fn acquire(
        &self,
        pool: &Pool,
        limit: u32,
        job_id: &JobId,
        run: u32,
    ) -> Result<bool, AwsError> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(pool.holders_pk()))
            .key("sk", s(HOLDERS_SK))
            .update_expression("ADD holders :job SET #run = :run")
            .expression_attribute_names("#run", run_attribute(job_id))
            .expression_attribute_values(":run", AttributeValue::N(run.to_string()))
            .condition_expression(
                "attribute_not_exists(holders) OR size(holders) < :limit OR contains(holders, :id)",
            )
            .expression_attribute_values(":job", AttributeValue::Ss(vec![job_id.to_string()]))
            .expression_attribute_values(":id", s(job_id))
            .expression_attribute_values(":limit", AttributeValue::N(limit.to_string()))
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(err) if crate::condition_refused(&err) => Ok(false),
            Err(err) => Err(AwsError::new(format!("take a slot for job {job_id}"), err)),
        }
    }

    /// Gives back the slots of `pool` that `job_ids` hold (none held: nothing changes);
    /// answers the holders item as it is afterwards (none given back: as read).
    pub async fn release(&self, pool: &Pool, job_ids: &[JobId]) -> Result<Held, AwsError> {
        if job_ids.is_empty() {
            return self.held(pool).await;
        }
        let runs: Vec<String> = (0..job_ids.len()).map(|i| format!("#run{i}")).collect();
        let output = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(pool.holders_pk()))
            .key("sk", s(HOLDERS_SK))
            .update_expression(format!("DELETE holders :jobs REMOVE {}", runs.join(", ")))
            .set_expression_attribute_names(Some(
                runs.into_iter().zip(job_ids.iter().map(run_attribute)).collect(),
            ))
            .expression_attribute_values(
                ":jobs",
                AttributeValue::Ss(job_ids.iter().map(String::from).collect()),
            )
            .return_values(ReturnValue::AllNew)
            .send()
            .await
            .map_err(|e| AwsError::new(format!("give back the slots of {job_ids:?}"), e))?;
        Ok(Held::of(output.attributes))
    }

    /// Gives back `job_id`'s slot of `pool` only if no later run than `run` holds it (a
    /// dispatch that read the job before `run` may have written an earlier run): `Some` with
    /// the holders item as it is afterwards, `None` if a later run of the job holds it
    /// (nothing changes). A job that holds no slot frees none (`Some`).
    pub async fn give_back_run(
        &self,
        pool: &Pool,
        job_id: &JobId,
        run: u32,
    ) -> Result<Option<Held>, AwsError> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(pool.holders_pk()))
            .key("sk", s(HOLDERS_SK))
            .update_expression("DELETE holders :job REMOVE #run")
            .condition_expression("attribute_not_exists(#run) OR #run <= :run")
            .expression_attribute_names("#run", run_attribute(job_id))
            .expression_attribute_values(":job", AttributeValue::Ss(vec![job_id.to_string()]))
            .expression_attribute_values(":run", AttributeValue::N(run.to_string()))
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        match result {
            Ok(output) => Ok(Some(Held::of(output.attributes))),
            Err(err) if crate::condition_refused(&err) => Ok(None),
            Err(err) => {
                Err(AwsError::new(format!("give back the slot of job {job_id}'s run {run}"), err))
            }
        }
    }

    /// `pool`'s holders item (a consistent read).
    async fn holders_item(
        &self,
        pool: &Pool,
    ) -> Result<Option<HashMap<String, AttributeValue>>, AwsError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(pool.holders_pk()))
            .key("sk", s(HOLDERS_SK))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new("read a pool's slot holders", e))?;
        Ok(output.item)
    }

    /// `pool`'s holders item as it is (a consistent read).
    pub async fn held(&self, pool: &Pool) -> Result<Held, AwsError> {
        Ok(Held::of(self.holders_item(pool).await?))
    }

    /// The jobs that hold a slot of `pool` (a consistent read).
    pub async fn holders(&self, pool: &Pool) -> Result<Vec<JobId>, AwsError> {
        let holders = self
            .holders_item(pool)
            .await?
            .and_then(|mut item| item.remove("holders"))
            .and_then(|v| v.as_ss().ok().cloned())
            .unwrap_or_default();
        // Only `acquire` writes the set, of job ids: one that is not is a corrupt item.
        holders
            .iter()
            .map(|id| {
                id.parse().map_err(|e| AwsError::new(format!("a pool's slot holder {id:?}"), e))
            })
            .collect()
    }

    /// Puts `job_id` of `owner` in its waiting list of `pool` at `position`, and in a kind pool
    /// makes sure its tenant has a place in the ring (idempotent, both); then sets the pool's
    /// waiting mark.
    pub async fn enter_waiting(
        &self,
        pool: &Pool,
        position: &str,
        job_id: &JobId,
        owner: &Owner,
    ) -> Result<(), AwsError> {
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(HashMap::from([
                ("pk".to_owned(), s(pool.waiting_list_pk(owner))),
                ("sk".to_owned(), s(position)),
                ("job_id".to_owned(), s(job_id)),
                ("owner".to_owned(), s(owner)),
            ])))
            .send()
            .await
            .map_err(|e| AwsError::new(format!("put job {job_id} in a waiting list"), e))?;
        if pool.takes_turns() {
            self.join_ring(pool, owner).await?;
        }
        self.mark_waiting(pool).await
    }

    /// Sets `pool`'s waiting mark to a value no one set before (a fresh job id's text): an
    /// admission that found the lists empty before this write cannot take it away.
    async fn mark_waiting(&self, pool: &Pool) -> Result<(), AwsError> {
        self.client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(pool.holders_pk()))
            .key("sk", s(HOLDERS_SK))
            .update_expression("SET #mark = :mark")
            .expression_attribute_names("#mark", WAITING_MARK)
            .expression_attribute_values(":mark", s(JobId::new()))
            .send()
            .await
            .map_err(|e| AwsError::new("mark that jobs wait for a pool", e))?;
        Ok(())
    }

    /// Takes `pool`'s waiting mark away if it is still `mark` (refused: a job entered a list
    /// since, and the mark stays).
    async fn unmark_waiting(&self, pool: &Pool, mark: &str) -> Result<(), AwsError> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(pool.holders_pk()))
            .key("sk", s(HOLDERS_SK))
            .update_expression("REMOVE #mark")
            .condition_expression("#mark = :mark")
            .expression_attribute_names("#mark", WAITING_MARK)
            .expression_attribute_values(":mark", s(mark))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) if crate::condition_refused(&err) => Ok(()),
            Err(err) => Err(AwsError::new("take away a pool's waiting mark", err)),
        }
    }

    /// Takes the entry at `position` out of `owner`'s waiting list of `pool` (idempotent).
    /// A kind pool's ring keeps the tenant's place: the next admission that finds its list
    /// empty takes the place out.
    pub async fn leave_waiting(
        &self,
        pool: &Pool,
        owner: &Owner,
        position: &str,
    ) -> Result<(), AwsError> {
        self.claim_waiting(pool, owner, position).await.map(drop)
    }

    /// Takes the entry at `position` out of `owner`'s waiting list of `pool`: `true` if this
    /// call took it out, `false` if it was not there (another admitter took it first).
    async fn claim_waiting(
        &self,
        pool: &Pool,
        owner: &Owner,
        position: &str,
    ) -> Result<bool, AwsError> {
        let output = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key("pk", s(pool.waiting_list_pk(owner)))
            .key("sk", s(position))
            .return_values(ReturnValue::AllOld)
            .send()
            .await
            .map_err(|e| AwsError::new(format!("take {position} out of a waiting list"), e))?;
        Ok(output.attributes.is_some_and(|old| !old.is_empty()))
    }

    /// Whether `owner`'s waiting list of `pool` holds `position` (one eventually consistent
    /// read of that key: what the reaper checks a waiting job with, whatever the list's length).
    pub async fn is_waiting(
        &self,
        pool: &Pool,
        owner: &Owner,
        position: &str,
    ) -> Result<bool, AwsError> {
        self.exists(pool.waiting_list_pk(owner), position.to_owned()).await
    }

    async fn exists(&self, pk: String, sk: String) -> Result<bool, AwsError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(pk))
            .key("sk", s(sk))
            .projection_expression("sk")
            .send()
            .await
            .map_err(|e| AwsError::new("read a waiting-list item", e))?;
        Ok(output.item.is_some_and(|item| !item.is_empty()))
    }

    /// Makes sure `owner`, whose jobs wait in kind pool `pool`, has its place in the ring: its
    /// member read, and the place it names (two reads when all is well). A place it has to
    /// give the tenant again sets the pool's waiting mark, as an entry does.
    pub async fn seat(&self, pool: &Pool, owner: &Owner) -> Result<Seat, AwsError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(pool.waiting_pk()))
            .key("sk", s(member_sk(owner)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new("read a tenant's place in a ring", e))?;
        let named = output.item.and_then(|item| {
            let key = item.get("ring")?.as_s().ok()?.clone();
            let served = item.get("served")?.as_s().ok()?.clone();
            Some((key, served))
        });
        let Some((key, served)) = named else {
            return Ok(match self.join_ring(pool, owner).await? {
                RingChange::Done => {
                    self.mark_waiting(pool).await?;
                    Seat::Joined
                }
                RingChange::Raced => Seat::Seated,
            });
        };
        if self.exists(pool.waiting_pk(), key).await? {
            return Ok(Seat::Seated);
        }
        self.put_place(pool, owner, &served).await?;
        self.mark_waiting(pool).await?;
        Ok(Seat::Restored)
    }

    /// The first `n` entries of `owner`'s waiting list of `pool`, in admission order.
    pub async fn first_waiting(
        &self,
        pool: &Pool,
        owner: &Owner,
        n: usize,
    ) -> Result<Vec<WaitingEntry>, AwsError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let output = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", s(pool.waiting_list_pk(owner)))
            .consistent_read(true)
            .limit(n.min(1_000) as i32)
            .send()
            .await
            .map_err(|e| AwsError::new("read a waiting list", e))?;
        Ok(output
            .items
            .unwrap_or_default()
            .into_iter()
            .filter_map(|item| {
                let position = item.get("sk")?.as_s().ok()?.clone();
                let job_id = job_of_waiting_key(&position)?;
                let owner = item.get("owner")?.as_s().ok()?.parse().ok()?;
                Some(WaitingEntry { position, job_id, owner })
            })
            .collect())
    }

    /// The place first in kind pool `pool`'s ring: the tenant served least recently.
    pub async fn first_turn(&self, pool: &Pool) -> Result<Option<Turn>, AwsError> {
        let output = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk AND begins_with(sk, :ring)")
            .expression_attribute_values(":pk", s(pool.waiting_pk()))
            .expression_attribute_values(":ring", s(RING_PREFIX))
            .consistent_read(true)
            .limit(1)
            .send()
            .await
            .map_err(|e| AwsError::new("read a kind pool's ring", e))?;
        Ok(output.items.unwrap_or_default().into_iter().find_map(|item| {
            Some(Turn {
                key: item.get("sk")?.as_s().ok()?.clone(),
                owner: item.get("owner")?.as_s().ok()?.parse().ok()?,
                served: item.get("served")?.as_s().ok()?.clone(),
            })
        }))
    }

    /// Writes `owner`'s `MEMBER#` item of `pool`'s ring, naming its place of `served`, on
    /// `condition`.
    async fn put_member(
        &self,
        pool: &Pool,
        owner: &Owner,
        served: &str,
        condition: MemberIf<'_>,
    ) -> Result<RingChange, AwsError> {
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("pk", s(pool.waiting_pk()))
            .item("sk", s(member_sk(owner)))
            .item("owner", s(owner))
            .item("ring", s(ring_key(served, owner)))
            .item("served", s(served));
        let put = match condition {
            MemberIf::Absent => put.condition_expression("attribute_not_exists(pk)"),
            MemberIf::At(place) => put
                .condition_expression("#ring = :ring")
                .expression_attribute_names("#ring", "ring")
                .expression_attribute_values(":ring", s(place)),
        };
        match put.send().await {
            Ok(_) => Ok(RingChange::Done),
            Err(err) if crate::condition_refused(&err) => Ok(RingChange::Raced),
            Err(err) => Err(AwsError::new(format!("write tenant {owner}'s place in a ring"), err)),
        }
    }

    /// Writes `owner`'s place in `pool`'s ring, served (or joined) at `served`; answers its key.
    async fn put_place(
        &self,
        pool: &Pool,
        owner: &Owner,
        served: &str,
    ) -> Result<String, AwsError> {
        let key = ring_key(served, owner);
        self.client
            .put_item()
            .table_name(&self.table)
            .item("pk", s(pool.waiting_pk()))
            .item("sk", s(&key))
            .item("owner", s(owner))
            .item("served", s(served))
            .send()
            .await
            .map_err(|e| AwsError::new(format!("put tenant {owner} in a ring"), e))?;
        Ok(key)
    }

    /// Deletes the place `key` of `pool`'s ring (idempotent).
    async fn delete_place(&self, pool: &Pool, key: &str) -> Result<(), AwsError> {
        self.client
            .delete_item()
            .table_name(&self.table)
            .key("pk", s(pool.waiting_pk()))
            .key("sk", s(key))
            .send()
            .await
            .map_err(|e| AwsError::new(format!("take {key} out of a ring"), e))?;
        Ok(())
    }

    /// Gives `owner` a place at the back of kind pool `pool`'s ring, unless it has one
    /// ([`RingChange::Raced`]).
    pub async fn join_ring(&self, pool: &Pool, owner: &Owner) -> Result<RingChange, AwsError> {
        let served = format_rfc3339(chrono::Utc::now());
        let joined = self.put_member(pool, owner, &served, MemberIf::Absent).await?;
        if joined == RingChange::Done {
            self.put_place(pool, owner, &served).await?;
        }
        Ok(joined)
    }

    /// Takes `turn`: its tenant moves to the back of `pool`'s ring, and the answer is its new
    /// place. `None` if the member named another place (the place read was left by a race or a
    /// crash): that place is deleted, and the turn is no one's.
    async fn take_turn(&self, pool: &Pool, turn: &Turn) -> Result<Option<String>, AwsError> {
        // Later than the place it leaves, even on a clock behind the one that wrote it.
        let now = chrono::Utc::now();
        let served = chrono::DateTime::parse_from_rfc3339(&turn.served)
            .map(|at| at.to_utc() + chrono::Duration::milliseconds(1))
            .map_or(now, |after| after.max(now));
        let served = format_rfc3339(served);
        let taken = self.put_member(pool, &turn.owner, &served, MemberIf::At(&turn.key)).await?;
        let back = match taken {
            RingChange::Done => Some(self.put_place(pool, &turn.owner, &served).await?),
            RingChange::Raced => None,
        };
        self.delete_place(pool, &turn.key).await?;
        Ok(back)
    }

    /// Takes `owner` out of `pool`'s ring (its list is empty), unless its place is no longer
    /// `place`. A job that entered the list meanwhile, seeing the member still there, did not
    /// join the ring: the list is read once more after, and a tenant found waiting joins again
    /// (at the back).
    async fn leave_ring(&self, pool: &Pool, owner: &Owner, place: &str) -> Result<(), AwsError> {
        let left = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key("pk", s(pool.waiting_pk()))
            .key("sk", s(member_sk(owner)))
            .condition_expression("#ring = :ring")
            .expression_attribute_names("#ring", "ring")
            .expression_attribute_values(":ring", s(place))
            .send()
            .await;
        match left {
            Ok(_) => {}
            Err(err) if crate::condition_refused(&err) => return Ok(()),
            Err(err) => {
                return Err(AwsError::new(format!("take tenant {owner} out of a ring"), err));
            }
        }
        self.delete_place(pool, place).await?;
        if !self.first_waiting(pool, owner, 1).await?.is_empty() {
            self.join_ring(pool, owner).await?;
        }
        Ok(())
    }
}

/// Frees and hands out slots: what the dispatcher, the slots function and the reaper share.
#[derive(Debug, Clone)]
pub struct Admitter {
    /// The slot items.
    pub slots: SlotStore,
    /// Where an admitted waiting job's dispatch message goes.
    pub intake: IntakeQueue,
}

impl Admitter {
    /// The admitter of the slots in `table`, waking jobs through the queue at
    /// `intake_queue_url`. It takes the function's clients rather than building its own: a
    /// client built twice costs its construction twice (BENCHMARKS.md, "Cold start"), and
    /// clients of one service share everything anyway.
    pub fn new(
        dynamodb: aws_sdk_dynamodb::Client,
        sqs: impl Into<crate::client::LazyClient<aws_sdk_sqs::Client>>,
        table: &str,
        intake_queue_url: &str,
    ) -> Self {
        Admitter {
            slots: SlotStore::new(dynamodb, table.to_owned()),
            intake: IntakeQueue::new(sqs, intake_queue_url.to_owned()),
        }
    }

    /// Gives back `job_ids`' slots of `pool` and admits as many waiting jobs as are free, if
    /// the pool's waiting mark says any may wait ([`Admitter::admit_marked`]).
    pub async fn release(
        &self,
        pool: &Pool,
        limit: u32,
        job_ids: &[JobId],
    ) -> Result<usize, AwsError> {
        let held = self.slots.release(pool, job_ids).await?;
        self.admit_marked(pool, limit, &held).await
    }

    /// [`Admitter::admit`] for a pool whose holders item a give-back returned as `held`: no
    /// request at all when its waiting mark is not set or no slot is free; and when the lists
    /// turn out empty, the mark is taken away (on condition that it is still the one read).
    pub async fn admit_marked(
        &self,
        pool: &Pool,
        limit: u32,
        held: &Held,
    ) -> Result<usize, AwsError> {
        let Some(mark) = &held.waiting_mark else { return Ok(0) };
        let free = longhaul_domain::admission::free_slots(limit, held.holders);
        if free == 0 {
            return Ok(0);
        }
        let admission = self.admit_free(pool, free).await?;
        if admission.none_waiting {
            self.slots.unmark_waiting(pool, mark).await?;
        }
        Ok(admission.woken)
    }

    /// Wakes as many waiting jobs of `pool` as its free slots (`limit` less `held`) can
    /// take; answers how many. Admitting only wakes a job (a dispatch message): the dispatcher
    /// takes the slot, or finds it gone to a newcomer and puts the job back in its list at the
    /// same position (priority, then submission time: the key does not depend on when it
    /// re-enters). A woken job leaves its list, so that the next wake-up reaches the next job
    /// even while this one's dispatch is in flight; a wake-up message that is lost leaves the
    /// job waiting outside its list, and the reaper puts it back.
    ///
    /// A tenant pool wakes its first jobs in list order. A kind pool wakes one job per turn of
    /// its ring (see the module doc): at most five requests per job woken, plus two per place
    /// of a tenant with no job left (at most [`MAX_EMPTY_TURNS`] of them), whatever the backlog.
    ///
    /// This reads the lists whatever the pool's waiting mark says: it is what the reaper
    /// admits with, which wakes a job whose mark was lost.
    pub async fn admit(&self, pool: &Pool, limit: u32, held: usize) -> Result<usize, AwsError> {
        let free = longhaul_domain::admission::free_slots(limit, held);
        Ok(self.admit_free(pool, free).await?.woken)
    }

    /// Wakes `free` waiting jobs of `pool` (or fewer, if fewer wait).
    async fn admit_free(&self, pool: &Pool, free: usize) -> Result<Admission, AwsError> {
        let admission = match pool {
            Pool::Tenant(owner) => self.admit_in_order(pool, owner, free).await?,
            Pool::Kind(_) => self.admit_by_turns(pool, free).await?,
        };
        if admission.woken > 0 {
            tracing::info!(pool = ?pool, admitted = admission.woken, "waiting jobs admitted");
        }
        Ok(admission)
    }

    /// The first `free` jobs of a tenant pool's list: each is sent its message, then leaves
    /// the list.
    async fn admit_in_order(
        &self,
        pool: &Pool,
        owner: &Owner,
        free: usize,
    ) -> Result<Admission, AwsError> {
        let waiting = self.slots.first_waiting(pool, owner, free).await?;
        for entry in &waiting {
            let message = DispatchMessage::new(entry.job_id.clone());
            self.intake.send(&message, &entry.owner).await?;
            self.slots.leave_waiting(pool, owner, &entry.position).await?;
        }
        Ok(Admission { woken: waiting.len(), none_waiting: free > 0 && waiting.is_empty() })
    }

    /// `free` jobs of a kind pool, one per turn: the tenant first in the ring takes its turn
    /// (to the back of the ring), and its first job leaves its list (a conditional delete: of
    /// two admitters at once only one wakes it) and is sent its message; a tenant with no more
    /// jobs in its list leaves the ring.
    async fn admit_by_turns(&self, pool: &Pool, free: usize) -> Result<Admission, AwsError> {
        let (mut admitted, mut passed, mut none_waiting) = (0, 0, false);
        while admitted < free && passed < MAX_EMPTY_TURNS {
            let Some(turn) = self.slots.first_turn(pool).await? else {
                // An empty ring: no tenant has a job in its list (a tenant joins the ring
                // before its job's mark is set).
                none_waiting = admitted == 0 && passed == 0;
                break;
            };
            let Some(place) = self.slots.take_turn(pool, &turn).await? else {
                passed += 1; // a place no member names: deleted
                continue;
            };
            let waiting = self.slots.first_waiting(pool, &turn.owner, 2).await?;
            let Some(entry) = waiting.first() else {
                // Its jobs left the list without a turn (cancelled, or their dispatch found a
                // slot after all).
                self.slots.leave_ring(pool, &turn.owner, &place).await?;
                passed += 1;
                continue;
            };
            if self.slots.claim_waiting(pool, &turn.owner, &entry.position).await? {
                let message = DispatchMessage::new(entry.job_id.clone());
                self.intake.send(&message, &entry.owner).await?;
                admitted += 1;
            }
            if waiting.len() == 1 {
                self.slots.leave_ring(pool, &turn.owner, &place).await?;
            }
        }
        if passed >= MAX_EMPTY_TURNS {
            tracing::warn!(pool = ?pool, passed, "many ring places without a waiting job; the next admission goes on");
        }
        Ok(Admission { woken: admitted, none_waiting })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(name: &str) -> Owner {
        name.parse().unwrap()
    }

    #[test]
    fn pool_keys_cannot_collide_across_names() {
        // Owner "a:b" and kind "a" with a crafted suffix never share a partition.
        let keys = [
            Pool::Tenant(owner("a")).holders_pk(),
            Pool::Tenant(owner("a:b")).holders_pk(),
            Pool::Kind("a".into()).holders_pk(),
            Pool::Kind("T#1:a".into()).holders_pk(),
        ];
        let unique: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(unique.len(), keys.len(), "{keys:?}");
        assert_eq!(Pool::Tenant(owner("alice")).waiting_pk(), "WAITING#T#5:alice");
    }

    #[test]
    fn a_kind_pool_gives_each_tenant_its_own_list() {
        let kind = Pool::Kind("demo".into());
        assert_eq!(kind.waiting_list_pk(&owner("alice")), "WAITING#K#4:demo#T#5:alice");
        assert_ne!(kind.waiting_list_pk(&owner("alice")), kind.waiting_list_pk(&owner("bob")));
        // No kind's ring is another kind's tenant list, however the names are chosen.
        assert_ne!(Pool::Kind("demo#T#1:a".into()).waiting_pk(), kind.waiting_list_pk(&owner("a")));
        let tenant = Pool::Tenant(owner("alice"));
        assert_eq!(tenant.waiting_list_pk(&owner("alice")), tenant.waiting_pk());
        assert!(!member_sk(&owner("a")).starts_with(RING_PREFIX));
    }

    #[test]
    fn pools_follow_the_limits() {
        assert_eq!(pools_of(&owner("o"), "k", None, 0), vec![]);
        assert_eq!(pools_of(&owner("o"), "k", None, 2), vec![(Pool::Tenant(owner("o")), 2)]);
        assert_eq!(
            pools_of(&owner("o"), "k", Some(3), 2),
            vec![(Pool::Tenant(owner("o")), 2), (Pool::Kind("k".into()), 3)]
        );
        assert_eq!(pools_of(&owner("o"), "k", Some(0), 0), vec![], "a limit of 0 is no limit");
    }
}

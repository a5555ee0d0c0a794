//! The other services in memory: executions, queues, the rate limit, objects, a signing key.

use longhaul_domain::Owner;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use longhaul_aws::executions::StartOutcome;
use longhaul_aws::limits::Admission;
use longhaul_aws::ports::{
    Clock, DeadLetters, DispatchQueue, JobExecutions, ObjectCleanup, ObjectLinks, RateLimits,
    SigningKey, UploadPresence, UploadQuotas, Warm, WebhookDispatch, WorkerInvocations,
};
use longhaul_aws::queue::{DispatchMessage, WebhookMessage};
use longhaul_aws::{AwsError, Refusal};
use longhaul_domain::limits::RateWindow;
use secrecy::SecretString;

use crate::Outage;

/// The objects as a stage reads and writes them, and multipart uploads: `objects.rs`.
mod objects;

mod links;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn refused(context: &str, refusal: Refusal, detail: &str) -> AwsError {
    AwsError { context: context.to_owned(), detail: detail.to_owned(), refusal: Some(refusal) }
}

/// One execution started on [`MemoryExecutions`].
#[derive(Debug, Clone, PartialEq)]
pub struct Started {
    /// Its name.
    pub name: String,
    /// Its input.
    pub input: serde_json::Value,
    /// `RUNNING` until a test or a stop ends it.
    pub status: String,
    /// The cause a stop gave.
    pub stopped_because: Option<String>,
}

/// The job state machine's executions in memory. Names are unique: a second start of a name
/// is [`StartOutcome::AlreadyExists`] (an identical repeat while it runs gets the same
/// execution back, as Step Functions does). Nothing runs them: a test ends one with
/// [`MemoryExecutions::finish`].
#[derive(Debug, Default)]
pub struct MemoryExecutions {
    executions: Mutex<Vec<Started>>,
    /// Every start asked for, by name, repeats included.
    start_calls: Mutex<Vec<String>>,
    outage: Outage,
}

impl MemoryExecutions {
    /// No executions yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every execution started so far, in order.
    pub fn started(&self) -> Vec<Started> {
        lock(&self.executions).clone()
    }

    /// The name of every start asked for that reached the service, in order, repeats of a
    /// name included (the execution a repeat names is started only once: [`Self::started`]).
    pub fn start_calls(&self) -> Vec<String> {
        lock(&self.start_calls).clone()
    }

    /// Ends execution `name` with `status` (`SUCCEEDED`, `FAILED`, …).
    pub fn finish(&self, name: &str, status: &str) {
        if let Some(execution) = lock(&self.executions).iter_mut().find(|e| e.name == name) {
            execution.status = status.to_owned();
        }
    }

    /// While `down`, every call fails as an unreachable service does.
    pub fn set_unavailable(&self, down: bool) {
        self.outage.set(down);
    }
}

#[async_trait]
impl Warm for MemoryExecutions {}

#[async_trait]
impl JobExecutions for MemoryExecutions {
    async fn start(&self, name: &str, input: &serde_json::Value) -> Result<StartOutcome, AwsError> {
        self.outage.check("start execution")?;
        lock(&self.start_calls).push(name.to_owned());
        let mut executions = lock(&self.executions);
        let arn = format!("arn:memory:states:execution:{name}");
        match executions.iter().find(|e| e.name == name) {
            Some(same) if same.status == "RUNNING" && &same.input == input => {
                Ok(StartOutcome::Started { execution_arn: arn })
            }
            Some(_) => Ok(StartOutcome::AlreadyExists),
            None => {
                executions.push(Started {
                    name: name.to_owned(),
                    input: input.clone(),
                    status: "RUNNING".to_owned(),
                    stopped_because: None,
                });
                Ok(StartOutcome::Started { execution_arn: arn })
            }
        }
    }

    async fn status(&self, name: &str) -> Result<Option<String>, AwsError> {
        self.outage.check("describe execution")?;
        Ok(lock(&self.executions).iter().find(|e| e.name == name).map(|e| e.status.clone()))
    }

    async fn stop(&self, name: &str, cause: &str) -> Result<(), AwsError> {
        self.outage.check("stop execution")?;
        let mut executions = lock(&self.executions);
        if let Some(execution) = executions.iter_mut().find(|e| e.name == name)
            && execution.status == "RUNNING"
        {
            execution.status = "ABORTED".to_owned();
            execution.stopped_because = Some(cause.to_owned());
        }
        Ok(())
    }
}

/// Asynchronous invocations in memory: what was queued, in order (function ARN, payload).
/// Nothing runs them: a test runs one by calling the worker's handler with its payload.
#[derive(Debug, Default)]
pub struct MemoryInvocations {
    queued: Mutex<Vec<(String, serde_json::Value)>>,
    outage: Outage,
}

impl MemoryInvocations {
    /// Nothing queued yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every invocation queued so far: the function's ARN and the payload.
    pub fn queued(&self) -> Vec<(String, serde_json::Value)> {
        lock(&self.queued).clone()
    }

    /// While `down`, every call fails as an unreachable service does.
    pub fn set_unavailable(&self, down: bool) {
        self.outage.set(down);
    }
}

#[async_trait]
impl Warm for MemoryInvocations {}

#[async_trait]
impl WorkerInvocations for MemoryInvocations {
    async fn invoke_async(
        &self,
        function: &str,
        payload: &serde_json::Value,
    ) -> Result<(), AwsError> {
        self.outage.check("invoke")?;
        lock(&self.queued).push((function.to_owned(), payload.clone()));
        Ok(())
    }
}

/// The intake queue in memory: what was sent, with its delay and owner, in order.
#[derive(Debug, Default)]
pub struct MemoryDispatchQueue {
    sent: Mutex<Vec<(DispatchMessage, u32, Owner)>>,
    outage: Outage,
}

impl MemoryDispatchQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every message sent so far: the message, its delay in seconds and its owner.
    pub fn sent(&self) -> Vec<(DispatchMessage, u32, Owner)> {
        lock(&self.sent).clone()
    }

    /// While `down`, every send fails as an unreachable queue does.
    pub fn set_unavailable(&self, down: bool) {
        self.outage.set(down);
    }
}

#[async_trait]
impl Warm for MemoryDispatchQueue {}

#[async_trait]
impl DispatchQueue for MemoryDispatchQueue {
    async fn send(&self, message: &DispatchMessage, owner: &Owner) -> Result<(), AwsError> {
        self.send_delayed(message, 0, owner).await
    }

    async fn send_delayed(
        &self,
        message: &DispatchMessage,
        delay_seconds: u32,
        owner: &Owner,
    ) -> Result<(), AwsError> {
        self.outage.check("send dispatch message")?;
        if delay_seconds > 900 {
            return Err(refused(
                "send dispatch message",
                Refusal::Invalid,
                "DelaySeconds must be at most 900",
            ));
        }
        lock(&self.sent).push((message.clone(), delay_seconds, owner.to_owned()));
        Ok(())
    }
}

/// The webhook queue in memory: what was sent, with its delay, in order.
#[derive(Debug, Default)]
pub struct MemoryWebhookQueue {
    sent: Mutex<Vec<(WebhookMessage, u64)>>,
    outage: Outage,
}

impl MemoryWebhookQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every message sent so far, with its delay in seconds.
    pub fn sent(&self) -> Vec<(WebhookMessage, u64)> {
        lock(&self.sent).clone()
    }

    /// While `down`, every send fails as an unreachable queue does.
    pub fn set_unavailable(&self, down: bool) {
        self.outage.set(down);
    }
}

#[async_trait]
impl Warm for MemoryWebhookQueue {}

#[async_trait]
impl WebhookDispatch for MemoryWebhookQueue {
    async fn send(&self, message: &WebhookMessage, delay_seconds: u64) -> Result<(), AwsError> {
        self.outage.check("send webhook message")?;
        // As the SQS adapter: a delay beyond SQS's 15 minutes is sent as 15 minutes.
        lock(&self.sent).push((message.clone(), delay_seconds.min(900)));
        Ok(())
    }

    async fn send_batch(&self, messages: &[WebhookMessage]) -> Result<Vec<bool>, AwsError> {
        assert!(messages.len() <= 10, "SQS takes at most ten messages per batch");
        self.outage.check("send webhook messages")?;
        lock(&self.sent).extend(messages.iter().map(|m| (m.clone(), 0)));
        Ok(vec![true; messages.len()])
    }
}

/// A dead-letter queue in memory.
#[derive(Debug, Default)]
pub struct MemoryDeadLetters {
    kept: Mutex<Vec<serde_json::Value>>,
    outage: Outage,
}

impl MemoryDeadLetters {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// What was kept, in order.
    pub fn kept(&self) -> Vec<serde_json::Value> {
        lock(&self.kept).clone()
    }

    /// While `down`, every send fails as an unreachable queue does.
    pub fn set_unavailable(&self, down: bool) {
        self.outage.set(down);
    }
}

#[async_trait]
impl Warm for MemoryDeadLetters {}

#[async_trait]
impl DeadLetters for MemoryDeadLetters {
    async fn send(&self, body: &serde_json::Value) -> Result<(), AwsError> {
        self.outage.check("send to dead-letter queue")?;
        lock(&self.kept).push(body.clone());
        Ok(())
    }
}

/// The per-owner submission limit in memory: the same fixed one-minute windows as the table's
/// counters ([`RateWindow`]); 0 per minute means unlimited.
#[derive(Debug, Default)]
pub struct MemoryRateLimits {
    per_minute: u32,
    counts: Mutex<HashMap<(Owner, i64), u32>>,
    outage: Outage,
    /// The clock whose minutes it counts in (none: the machine's, as the table's counters).
    clock: Option<std::sync::Arc<dyn Clock>>,
}

impl MemoryRateLimits {
    /// `per_minute` submissions per owner and window (0: off), in the machine's minutes.
    pub fn new(per_minute: u32) -> Self {
        MemoryRateLimits { per_minute, ..Self::default() }
    }

    /// [`MemoryRateLimits::new`] counting in `clock`'s minutes: a handler test gives it the
    /// handler's clock, so that a test's charges never straddle two of the machine's minutes.
    pub fn on_clock(per_minute: u32, clock: std::sync::Arc<dyn Clock>) -> Self {
        MemoryRateLimits { per_minute, clock: Some(clock), ..Self::default() }
    }

    /// While `down`, every charge fails as an unavailable table does.
    pub fn set_unavailable(&self, down: bool) {
        self.outage.set(down);
    }
}

#[async_trait]
impl Warm for MemoryRateLimits {}

#[async_trait]
impl RateLimits for MemoryRateLimits {
    async fn charge(&self, owner: &Owner) -> Result<Admission, AwsError> {
        if self.per_minute == 0 {
            return Ok(Admission::Admitted);
        }
        self.outage.check("count a submission")?;
        let now = self.clock.as_ref().map_or_else(chrono::Utc::now, |clock| clock.now());
        let window = RateWindow::at(now.timestamp());
        let mut counts = lock(&self.counts);
        let count = counts.entry((owner.to_owned(), window.index)).or_default();
        if *count >= self.per_minute {
            return Ok(Admission::Limited { retry_after: window.retry_after });
        }
        *count += 1;
        Ok(Admission::Admitted)
    }
}

/// The per-owner daily quota of upload bytes in memory: the same UTC-day windows as the
/// table's counters ([`RateWindow::day_of`]); 0 bytes a day means no quota.
#[derive(Debug, Default)]
pub struct MemoryUploadQuota {
    bytes_per_day: u64,
    counted: Mutex<HashMap<(Owner, i64), u64>>,
    outage: Outage,
}

impl MemoryUploadQuota {
    /// `bytes_per_day` per owner and day (0: off).
    pub fn new(bytes_per_day: u64) -> Self {
        MemoryUploadQuota { bytes_per_day, ..Self::default() }
    }

    /// While `down`, every charge fails as an unavailable table does.
    pub fn set_unavailable(&self, down: bool) {
        self.outage.set(down);
    }
}

#[async_trait]
impl Warm for MemoryUploadQuota {}

#[async_trait]
impl UploadQuotas for MemoryUploadQuota {
    async fn charge(&self, owner: &Owner, bytes: u64) -> Result<Admission, AwsError> {
        if self.bytes_per_day == 0 {
            return Ok(Admission::Admitted);
        }
        self.outage.check("count an upload's bytes")?;
        let window = RateWindow::day_of(chrono::Utc::now().timestamp());
        let mut counted = lock(&self.counted);
        let today = counted.entry((owner.to_owned(), window.index)).or_default();
        // `attribute_not_exists(bytes) OR bytes <= :room`, `:room` = the quota less `bytes`.
        match self.bytes_per_day.checked_sub(bytes) {
            Some(room) if *today <= room => {
                *today += bytes;
                Ok(Admission::Admitted)
            }
            _ => Ok(Admission::Limited { retry_after: window.retry_after }),
        }
    }
}

/// The bucket in memory: objects by key, with their content type. A link is a URL on the
/// reserved `.invalid` domain naming the key and its lifetime, so a test can check what a
/// handler handed out.
#[derive(Debug, Default)]
pub struct MemoryObjects {
    objects: Mutex<BTreeMap<String, (Vec<u8>, String)>>,
    outage: Outage,
    /// Multipart uploads, and the ETags of the objects they made (`objects.rs`; locked after
    /// `objects` when both are).
    multipart: Mutex<objects::Multipart>,
    /// How many times an upload's presence was asked ([`UploadPresence::exists`], a HEAD).
    heads: AtomicUsize,
    /// How many times objects were listed ([`ObjectCleanup::delete_prefix`] and
    /// [`ObjectCleanup::first_key`]: a ListObjectsV2 each on S3, at least).
    lists: AtomicUsize,
    /// How many objects were deleted by key ([`ObjectCleanup::delete`]: a DeleteObject each).
    deletes: AtomicUsize,
}

impl MemoryObjects {
    /// An empty bucket.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores `body` at `key` (a test's arrangement).
    pub fn insert(&self, key: &str, body: &[u8], content_type: &str) {
        lock(&self.objects).insert(key.to_owned(), (body.to_vec(), content_type.to_owned()));
    }

    /// The keys stored, in order.
    pub fn keys(&self) -> Vec<String> {
        lock(&self.objects).keys().cloned().collect()
    }

    /// While `down`, every call fails as an unreachable bucket does.
    pub fn set_unavailable(&self, down: bool) {
        self.outage.set(down);
    }

    /// How many times an upload's presence was asked so far ([`UploadPresence::exists`]: one
    /// HEAD request each on S3), answered or not.
    pub fn heads(&self) -> usize {
        self.heads.load(Ordering::SeqCst)
    }

    /// How many times objects were listed so far (a prefix's delete or first key: at least
    /// one LIST request each on S3), answered or not.
    pub fn lists(&self) -> usize {
        self.lists.load(Ordering::SeqCst)
    }

    /// How many deletes by key were asked so far (one DeleteObject each on S3), answered or
    /// not.
    pub fn deletes(&self) -> usize {
        self.deletes.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Warm for MemoryObjects {}

#[async_trait]
impl ObjectLinks for MemoryObjects {
    async fn presign_get(&self, key: &str, expires_in: Duration) -> Result<String, AwsError> {
        self.outage.check("presign a result link")?;
        Ok(format!("https://bucket.memory.invalid/{key}?X-Amz-Expires={}", expires_in.as_secs()))
    }
}

#[async_trait]
impl UploadPresence for MemoryObjects {
    async fn exists(&self, key: &str) -> Result<bool, AwsError> {
        self.heads.fetch_add(1, Ordering::SeqCst);
        self.outage.check("head an upload")?;
        Ok(lock(&self.objects).contains_key(key))
    }
}

#[async_trait]
impl ObjectCleanup for MemoryObjects {
    async fn delete(&self, key: &str) -> Result<(), AwsError> {
        self.deletes.fetch_add(1, Ordering::SeqCst);
        self.outage.check("delete object")?;
        lock(&self.objects).remove(key);
        Ok(())
    }

    async fn delete_prefix(&self, prefix: &str) -> Result<usize, AwsError> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        self.outage.check("delete objects")?;
        let mut objects = lock(&self.objects);
        let doomed: Vec<String> =
            objects.keys().filter(|k| k.starts_with(prefix)).cloned().collect();
        for key in &doomed {
            objects.remove(key);
        }
        Ok(doomed.len())
    }

    async fn first_key(&self, prefix: &str) -> Result<Option<String>, AwsError> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        self.outage.check("list objects")?;
        Ok(lock(&self.objects).keys().find(|k| k.starts_with(prefix)).cloned())
    }
}

/// A fixed signing key.
#[derive(Debug)]
pub struct MemorySigningKey {
    secret: SecretString,
    outage: Outage,
}

impl MemorySigningKey {
    /// The key `secret`.
    pub fn new(secret: &str) -> Self {
        MemorySigningKey {
            secret: SecretString::from(secret.to_owned()),
            outage: Outage::default(),
        }
    }

    /// While `down`, every read fails as a secret that cannot be read does (and, as the
    /// Secrets Manager adapter, a failed read is not remembered).
    pub fn set_unavailable(&self, down: bool) {
        self.outage.set(down);
    }
}

#[async_trait]
impl Warm for MemorySigningKey {}

#[async_trait]
impl SigningKey for MemorySigningKey {
    async fn get(&self) -> Result<&SecretString, AwsError> {
        self.outage.check("read a signing key")?;
        Ok(&self.secret)
    }
}

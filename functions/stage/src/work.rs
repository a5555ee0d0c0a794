//! The `work` op (the state machine's `Run` state): claim the job if this execution holds no
//! lease yet, work through its stages until it is done or the Lambda deadline nears
//! (checkpointing), and record the success itself.

use std::time::{Duration, Instant};

use longhaul_aws::jobs::{JobRecord, JobView, Lease, StoreError, TransitionRequest};
use longhaul_aws::logs;
use longhaul_aws::metrics::{self, Metric};
use longhaul_aws::objects::result_key;
use longhaul_domain::inline_result::InlineResult;
use longhaul_domain::{JobId, JobStatus};
use longhaul_worker::{Cadence, StageOutcome};

use crate::engine::{Ctx, KindRun};
use crate::failure_message::{Failure, PublicMessage};
use crate::fan_out::MapHost;
use crate::park::{self, Parked};
use crate::wire::{FanOutTask, Next, RunOutput, TaskLease};
use crate::{Deps, StageError, end_job, finish_cancellation, store_failed};
use longhaul_worker::fan_out::Distributed;

/// `queued → running` for `execution` (idempotent per execution), minting the lease.
pub(crate) async fn claim(
    deps: &Deps,
    job_id: &JobId,
    execution: &str,
) -> Result<(TaskLease, JobView), StageError> {
    claim_as(deps, job_id, execution, None).await?.map_err(|current| {
        StageError::NotClaimable(format!(
            "job {job_id} is {}",
            current.map(|j| j.status.as_str()).unwrap_or("missing")
        ))
    })
}

/// [`claim`] for a direct run's invocation `claimant` (none: an execution's); a refusal
/// answers the job as it is (`None`: missing). The claim answers the job and its progress as
/// it left them ([`work`] starts from them, reading nothing again).
pub(crate) async fn claim_as(
    deps: &Deps,
    job_id: &JobId,
    execution: &str,
    claimant: Option<&str>,
) -> Result<Result<(TaskLease, JobView), Option<Box<JobRecord>>>, StageError> {
    let (lease, view) = match deps.jobs.claim_as(job_id, execution, claimant).await {
        Ok(claimed) => claimed,
        Err(StoreError::Conflict { current }) => return Ok(Err(current)),
        Err(other) => return Err(store_failed(other)),
    };
    let job = &view.job;
    logs::record_job(&tracing::Span::current(), job);
    tracing::info!("claimed");
    // The wait before the job's first run (a resumed one's claim is not it).
    if lease.attempt == 1
        && job.resumes == 0
        && let Some(started) = job.started_at
    {
        metrics::emit(Metric::QueueWait, started.since(job.created_at).as_millis() as f64, job);
    }
    let lease = TaskLease { lease, principal: Some(job.owner.clone()) };
    Ok(Ok((lease, view)))
}

/// Works through the job's stages until it needs the state machine again: stage boundaries
/// are crossed within the invocation, and success is recorded here, not in a state of its own.
/// `claimed`: the job and its progress as this invocation's claim left them (else read).
/// `fanned`: the stage whose shards the `FanOut` map just ran, if this call follows it.
pub(crate) async fn work(
    deps: &Deps,
    job_id: &JobId,
    lease: &TaskLease,
    loops: u32,
    deadline: Instant,
    mut claimed: Option<JobView>,
    mut fanned: Option<String>,
) -> Result<RunOutput, StageError> {
    loop {
        let output =
            run(deps, job_id, lease, loops, deadline, claimed.take(), fanned.take()).await?;
        match output.next {
            // The next stage reads the progress record `run` just moved on (one strong read).
            Next::NextStage => continue,
            // Parked at the final checkpoint the kind saved for the owner's pause, or (its
            // stage waiting for a signal) at the last one it saved before the wait.
            Next::Paused => match park::park(deps, job_id, lease, output.wait.as_ref()).await? {
                Parked::Paused => return Ok(output),
                // A resume withdrew the pause first: the stage goes on from that checkpoint.
                Parked::Withdrawn => continue,
                Parked::Cancelled(job) => {
                    let next = finish_cancellation(deps, job_id, lease, Some(&job)).await?;
                    return Ok(RunOutput { next, result_key: None, ..output });
                }
            },
            Next::Done => match complete(deps, job_id, lease, &output).await {
                Ok(()) => return Ok(output),
                // The owner cancelled while the last stage finished (the job as this
                // invocation read it, or as its claim left it, predates the request): the job
                // ends `cancelled`, as the owner was told it would, its result deleted.
                Err(StageError::Cancelled) => {
                    let next = finish_cancellation(deps, job_id, lease, None).await?;
                    return Ok(RunOutput { next, result_key: None, ..output });
                }
                Err(err) => return Err(err),
            },
            _ => return Ok(output),
        }
    }
}

/// `running → succeeded` with the result `run` stored (fenced; refused, as
/// [`StageError::Cancelled`], once the owner asked to cancel the job).
async fn complete(
    deps: &Deps,
    job_id: &JobId,
    lease: &Lease,
    run: &RunOutput,
) -> Result<(), StageError> {
    let ttl = run
        .result_ttl_seconds
        .map(Duration::from_secs)
        .unwrap_or_else(|| deps.result_ttl.default_ttl());
    let expires =
        deps.clock.now() + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::days(7));
    let request = TransitionRequest::new(
        job_id,
        &[JobStatus::Running],
        JobStatus::Succeeded,
        "result stored",
    )
    .fenced(&lease.token)
    .unless_cancelled()
    .indexed_at(longhaul_domain::format_rfc3339(expires));
    let request = match (&run.result_inline, &run.result_key) {
        (Some(inline), _) => request.set("result_inline", inline),
        (None, Some(key)) => request.set("result_key", key),
        (None, None) => {
            return Err(StageError::Fatal(Failure::new(PublicMessage::fixed(
                "the job ended without a result",
            ))));
        }
    };
    let request = match &run.summary {
        Some(summary) => request.set("summary", summary),
        None => request,
    };
    let request = match &run.ended_at_stage {
        Some(end) => request.set("ended_at_stage", end),
        None => request,
    };
    end_job(deps, request, lease, run.leftovers.as_deref()).await?;
    tracing::info!("succeeded");
    Ok(())
}

async fn run(
    deps: &Deps,
    job_id: &JobId,
    lease: &TaskLease,
    loops: u32,
    deadline: Instant,
    claimed: Option<JobView>,
    fanned: Option<String>,
) -> Result<RunOutput, StageError> {
    let view = match claimed {
        Some(view) => Some(view),
        None => deps.jobs.view(job_id).await.map_err(store_failed)?,
    };
    let view = view.ok_or_else(|| {
        StageError::Fatal(Failure::new(PublicMessage::fixed("the job does not exist")))
    })?;
    let job = &view.job;
    if lease.principal.is_none() {
        logs::record_principal(&tracing::Span::current(), &job.owner);
    }
    let ours = job.lease.as_deref() == Some(&lease.token);
    let ended = |next: Next, result_key: Option<String>| RunOutput {
        next,
        loops,
        result_key,
        ..RunOutput::default()
    };
    match job.status {
        JobStatus::Running if ours => {}
        // A retried call whose end already landed: answer it again, so the end's follow-up
        // (metrics, tidying), which may not have happened, is done again.
        JobStatus::Succeeded if ours => {
            return Ok(RunOutput {
                result_inline: job.result_inline.clone(),
                ..ended(Next::Done, job.result_key.clone())
            });
        }
        JobStatus::Cancelled if ours => {
            finish_cancellation(deps, job_id, lease, Some(job)).await?;
            return Ok(ended(Next::Cancelled, None));
        }
        // A retried call whose move into compensating landed: its undos run without it (what
        // followed the move, which may not have happened, is done again).
        JobStatus::Compensating if ours => {
            crate::compensate::handed_over(deps, job, lease).await?;
            return Ok(ended(Next::Compensating, None));
        }
        _ => {
            return Err(StageError::LeaseLost(format!(
                "job is {} under another lease",
                job.status
            )));
        }
    }
    let (kind, run) = kind_run(deps, job)?;
    let stages = kind.stages();
    let result_retention = match &job.policy {
        Some(stored) => stored.result_retention(),
        None => kind.policy().result_retention,
    };
    let progress = view.progress.clone().unwrap_or_default();
    let mut ctx = Ctx::new(deps, job, lease, stages, &progress, deadline, &run);
    let outcome = if job.cancellation.is_some() || progress.cancel_requested_at.is_some() {
        Err(StageError::Cancelled)
    } else if job.pause.is_some() || progress.pause_requested_at.is_some() {
        // Asked to pause before this stage began (or at the boundary that led to it): parked
        // before anything runs.
        Err(StageError::Paused)
    } else {
        // A stage whose earlier invocations of this attempt used up its time runs no more.
        match ctx.check_stage_timeout() {
            Ok(()) => match deps.fan_out.as_ref().filter(|_| kind.fans_out(ctx.stage, &job.params))
            {
                None => kind.run_stage(&mut ctx, &job.params).await.map_err(StageError::from),
                Some(settings) => {
                    let came_back = fanned.as_deref() == Some(ctx.stage);
                    match distributed(deps, kind, &mut ctx, job, lease, came_back).await? {
                        Fanned::Outcome(outcome) => outcome,
                        Fanned::Map(manifest) => {
                            let task = FanOutTask {
                                bucket: settings.bucket.clone(),
                                manifest,
                                stage_index: ctx.stage_index,
                                max_concurrency: kind
                                    .policy()
                                    .max_parallel_shards
                                    .min(settings.max_parallel_shards)
                                    .max(1),
                            };
                            return Ok(RunOutput {
                                next: Next::FanOut,
                                stage: ctx.stage.into(),
                                loops,
                                fan_out: Some(task),
                                ..RunOutput::default()
                            });
                        }
                    }
                }
            },
            Err(err) => Err(err),
        }
    };
    let output = |next: Next, result_key: Option<String>, stage: &str| RunOutput {
        next,
        stage: stage.into(),
        loops,
        result_key,
        result_inline: None,
        result_ttl_seconds: None,
        summary: None,
        leftovers: None,
        ended_at_stage: None,
        wait: None,
        fan_out: None,
    };
    match outcome {
        // The owner cancelled and the stage stopped as asked (having saved its final
        // checkpoint), or finished anyway: the job ends `cancelled`, any result deleted.
        Ok(_) if ctx.cancelled() => {
            let next = finish_cancellation(deps, job_id, lease, Some(job)).await?;
            Ok(output(next, None, ctx.stage))
        }
        // The owner paused the job and the stage stopped as asked (its final checkpoint
        // saved): parked by `work`. (A stage that finished anyway goes on: its result counts.)
        // Paused by the owner, or by the kind's own wait for a signal (propagated, or answered
        // with `Paused`).
        Err(StageError::Paused) => {
            Ok(RunOutput { wait: ctx.waiting().cloned(), ..output(Next::Paused, None, ctx.stage) })
        }
        Ok(StageOutcome::Paused) if ctx.pausing() || ctx.waiting().is_some() => {
            Ok(RunOutput { wait: ctx.waiting().cloned(), ..output(Next::Paused, None, ctx.stage) })
        }
        Ok(StageOutcome::Paused) if loops >= deps.runs_per_execution => {
            Ok(output(Next::ContinueAsNew, None, ctx.stage))
        }
        Ok(StageOutcome::Paused) => Ok(output(Next::Continue, None, ctx.stage)),
        Ok(StageOutcome::StageDone) => {
            let next = stages[ctx.stage_index as usize];
            match ctx.advance(next).await {
                Ok(()) => {}
                // The boundary write is refused because the owner cancelled meanwhile: the
                // job ends `cancelled`, never `failed` (Job.Cancelled is not a failure).
                Err(StageError::Cancelled) => {
                    let next = finish_cancellation(deps, job_id, lease, Some(job)).await?;
                    return Ok(output(next, None, ctx.stage));
                }
                Err(err) => return Err(err),
            }
            tracing::info!(stage = next, "stage boundary");
            Ok(output(Next::NextStage, None, next))
        }
        Ok(StageOutcome::Finished(result)) => {
            // `ResultRef`s come from this host's `write_result`/`publish`; one that names
            // anything but this attempt's results (another job's, say) is refused, so no kind
            // can point a job's result link elsewhere. An inline one carries its bytes.
            let own = result_key(job_id, &format!("{}/", lease.attempt));
            let (result_key, result_inline) = match (result.location(), result.inline()) {
                (Some(location), _) if location.starts_with(&own) => {
                    (Some(location.to_owned()), None)
                }
                (None, Some((content_type, body))) => {
                    match InlineResult::of(content_type, body.to_vec()) {
                        Some(inline) => (None, Some(inline)),
                        None => return Err(not_its_own()),
                    }
                }
                _ => return Err(not_its_own()),
            };
            Ok(RunOutput {
                result_inline,
                result_ttl_seconds: Some(deps.result_ttl.of(result_retention).as_secs()),
                summary: result.summary().cloned(),
                // A job whose stage ran distributed leaves its manifest and each shard's last
                // checkpoint too: tidied by prefix (one listing, for those jobs only).
                leftovers: (ctx.stage_end().shards.is_none() || deps.fan_out.is_none())
                    .then(|| ctx.leftovers()),
                ended_at_stage: Some(ctx.stage_end()),
                ..output(Next::Done, result_key, ctx.stage)
            })
        }
        Err(StageError::Cancelled) => {
            let next = finish_cancellation(deps, job_id, lease, Some(job)).await?;
            Ok(output(next, None, ctx.stage))
        }
        Err(err) => Err(err),
    }
}

/// A kind finished with a result this attempt's host did not make.
fn not_its_own() -> StageError {
    StageError::Fatal(Failure::new(PublicMessage::fixed(
        "the job kind finished with a result that is not its own",
    )))
}

/// Where a distributed stage's run leaves it.
enum Fanned {
    /// The stage's outcome (merged), or its failure.
    Outcome(Result<StageOutcome, StageError>),
    /// The manifest the `FanOut` map is to run.
    Map(String),
}

/// Runs the current stage, which fans out, with its shards in their own invocations
/// ([`crate::fan_out`]): the stage's outcome once every shard is done and merged; or the
/// manifest the `FanOut` map is to run — unless this call follows that map (`came_back`) and
/// shards are still unfinished, which fails the attempt retryably (the next attempt runs only
/// those again).
async fn distributed(
    deps: &Deps,
    kind: &dyn longhaul_worker::DynKind,
    ctx: &mut Ctx<'_>,
    job: &JobRecord,
    lease: &Lease,
    came_back: bool,
) -> Result<Fanned, StageError> {
    let mut host = MapHost {
        deps,
        job,
        stage: ctx.stage,
        stage_index: ctx.stage_index,
        attempt: lease.attempt,
        counts: None,
    };
    let ran = kind.run_distributed(ctx, &job.params, &mut host).await;
    // How the shards stand by their records: exact, whatever the map's writes said.
    if let Some(counts) = host.counts {
        if let (0, Ok(Distributed::Running(shards))) = (counts.attempts, &ran) {
            // None of this job's own ever ran (a retry of another job's fanned-out stage):
            // they all run, and count, from the start.
            ctx.restart_stage_count(shards.items);
        }
        ctx.record_shards(counts).await?;
    }
    Ok(match ran {
        Ok(Distributed::Merged(outcome) | Distributed::Plain(outcome)) => {
            Fanned::Outcome(Ok(outcome))
        }
        Ok(Distributed::Running(shards)) if came_back => {
            let done = host.counts.map_or(0, |c| c.succeeded);
            Fanned::Outcome(Err(StageError::retryable(
                PublicMessage::domain(format!(
                    "{} of the {} shards of stage `{}` did not finish",
                    (shards.shards as u64).saturating_sub(done),
                    shards.shards,
                    ctx.stage
                )),
                "the map ended with shards unfinished",
            )))
        }
        Ok(Distributed::Running(shards)) => {
            // Handed to the map again (a new execution, a new attempt, a resume): the
            // record gets this run's stage clock, which the shards' timeout checks count
            // from, and the exact counts.
            if host.counts.is_some() {
                ctx.write_now(shards.items).await?;
            }
            Fanned::Map(shards.manifest)
        }
        Err(err) => Fanned::Outcome(Err(StageError::from(err))),
    })
}

/// The job's kind and what the engine needs of it. A job's kind was checked at submit: one
/// this worker does not know (switched off in the code since) or params it no longer accepts
/// cannot be helped by retrying. The policy stored on the job at submit rules it (a record
/// from before policies were stored: the kind's current one).
pub(crate) fn kind_run<'d>(
    deps: &'d Deps,
    job: &JobRecord,
) -> Result<(&'d dyn longhaul_worker::DynKind, KindRun), StageError> {
    let kind = deps.registry.get(&job.job_type).ok_or_else(|| {
        StageError::Fatal(Failure::new(PublicMessage::domain(format!(
            "job type {:?} is not known to this worker",
            job.job_type.chars().take(64).collect::<String>()
        ))))
    })?;
    let inputs = kind
        .check(&job.params)
        .map_err(|e| StageError::Fatal(Failure::new(PublicMessage::domain(e))))?;
    let kind_policy = kind.policy();
    let (cadence, stage_timeout) = match &job.policy {
        Some(stored) => (
            Cadence {
                items: stored.checkpoint.items,
                interval: Duration::from_secs(stored.checkpoint.interval_seconds),
            },
            stored.stage_timeout(),
        ),
        None => (kind_policy.checkpoint, kind_policy.stage_timeout),
    };
    Ok((kind, KindRun { inputs, cadence, weights: kind.stage_weights(), stage_timeout }))
}

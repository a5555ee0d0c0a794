//! Progress arithmetic: the percentage a running job reports and its ETA; and what a job's
//! clients are shown of its progress ([`ProgressView`]), ended once the job succeeded.
//!
//! Clients render bars from these numbers, so they must never go backwards: a retried
//! attempt, a stage boundary or a resumed checkpoint may report the same progress again but
//! never less. The stage engine keeps the floor (the last percentage it wrote, or the one the
//! previous attempt left in the progress record) and passes it in.

use crate::JobStatus;

/// Where a job is: stage `stage_index` (1-based) of `stages_total`, `done` of `total` items
/// in that stage (`None`: the stage cannot count its items).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Position {
    /// 1-based index of the current stage.
    pub stage_index: u32,
    /// Stages in the job (at least 1).
    pub stages_total: u32,
    /// Items done in the current stage.
    pub done: u64,
    /// Items in the current stage, when known.
    pub total: Option<u64>,
}

/// The job's overall percentage at `position`, to one decimal, rounded down (so 100 % means
/// done), and never below `floor`.
pub fn overall_pct(position: Position, floor: f64) -> f64 {
    let stages = u128::from(position.stages_total.max(1));
    let stage = u128::from(position.stage_index.clamp(1, position.stages_total.max(1)));
    // The current stage's fraction as `done / total`, kept as integers so the rounding is
    // exact: `(x * 10.0).floor()` in floating point reported 29 of 100 items as 28.9 %.
    let (done, total) = match position.total {
        Some(0) => (1, 1),
        Some(total) => (u128::from(position.done.min(total)), u128::from(total)),
        None => (0, 1),
    };
    // Tenths of a percent, rounded down: 1000 · (stage − 1 + done / total) / stages. At most
    // 1000 · 2³² · 2⁶⁴, so no overflow.
    let tenths = 1000 * ((stage - 1) * total + done) / (stages * total);
    (tenths as f64 / 10.0).max(floor).min(100.0)
}

/// The job's overall percentage at `position` when its stages weigh `weights` (one positive
/// weight per stage; anything else: every stage weighs the same, [`overall_pct`]), to one
/// decimal, rounded down, never below `floor`.
pub fn weighted_pct(position: Position, weights: &[u32], floor: f64) -> f64 {
    let stages = position.stages_total.max(1) as usize;
    if weights.len() != stages || weights.contains(&0) {
        return overall_pct(position, floor);
    }
    let stage = position.stage_index.clamp(1, stages as u32) as usize;
    let (done, total) = match position.total {
        Some(0) => (1, 1),
        Some(total) => (u128::from(position.done.min(total)), u128::from(total)),
        None => (0, 1),
    };
    let before: u128 = weights[..stage - 1].iter().map(|&w| u128::from(w)).sum();
    let all: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    let current = u128::from(weights[stage - 1]);
    // Tenths of a percent, rounded down, in integers (as `overall_pct`).
    let tenths = 1000 * (before * total + current * done) / (all * total);
    (tenths as f64 / 10.0).max(floor).min(100.0)
}

/// Seconds left at the throughput observed since `origin_pct` was reported `elapsed_seconds`
/// ago; none before 10 % (too early to say) or without measurable progress.
pub fn eta_seconds(pct: f64, origin_pct: f64, elapsed_seconds: f64) -> Option<u64> {
    (pct >= 10.0 && pct > origin_pct && elapsed_seconds > 0.0)
        .then(|| ((100.0 - pct) / ((pct - origin_pct) / elapsed_seconds)).ceil() as u64)
}

/// How far back the ETA's throughput looks (seconds): long enough to smooth the spacing of
/// progress writes, short enough that a job whose pace changed (a slow first stage, a
/// throttled dependency) is estimated at its pace now, not its average since the start.
pub const ETA_WINDOW_SECONDS: f64 = 60.0;

/// The recent throughput of one worker: its progress samples of about the last
/// [`ETA_WINDOW_SECONDS`], from which the ETA is computed ([`ThroughputWindow::observe`]).
#[derive(Debug, Clone)]
pub struct ThroughputWindow {
    span: f64,
    /// `(seconds, pct)`, oldest first; the first is the newest sample at least `span` old
    /// (once there is one), so the window covers the whole span.
    samples: std::collections::VecDeque<(f64, f64)>,
}

impl ThroughputWindow {
    /// A window of `span_seconds`.
    pub fn new(span_seconds: f64) -> Self {
        ThroughputWindow { span: span_seconds, samples: std::collections::VecDeque::new() }
    }

    /// Records `pct` at `t` (seconds on a monotonic clock) and answers the ETA at the
    /// throughput over the window ([`eta_seconds`]: none before 10 %).
    pub fn observe(&mut self, t: f64, pct: f64) -> Option<u64> {
        self.samples.push_back((t, pct));
        while self.samples.len() > 2 && self.samples[1].0 <= t - self.span {
            self.samples.pop_front();
        }
        let (t0, p0) = self.samples[0];
        eta_seconds(pct, p0, t - t0)
    }
}

/// How the shards of a job's fanned-out stage stand (its latest such stage's: a job shows
/// them while in that stage and after it). `attempts` counts every shard run started, so
/// `attempts − total` is about how many were retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ShardCounts {
    /// Shards the stage split into.
    pub total: u64,
    /// Shards not started yet (or, once the job failed or was cancelled, stopped before
    /// they were done).
    pub pending: u64,
    /// Shards started and not done.
    pub running: u64,
    /// Shards done.
    pub succeeded: u64,
    /// Shards that failed (the job fails with them).
    pub failed: u64,
    /// Shard runs started: each shard's first and every retry.
    pub attempts: u64,
}

impl ShardCounts {
    /// The counts once the job succeeded: every shard done, none pending or running.
    pub fn ended(self) -> Self {
        ShardCounts { pending: 0, running: 0, succeeded: self.total, failed: 0, ..self }
    }
}

/// A job's progress as its clients are shown it — `GET /jobs/{id}`'s `progress` and the live
/// stream's `progress` events alike, so the two cannot tell different stories. Unknown values
/// are `None` (`null`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ProgressView {
    /// 0 ..= 100.
    pub pct: f64,
    /// The current stage's name.
    pub stage: Option<String>,
    /// 1-based index of the current stage.
    pub stage_index: Option<u32>,
    /// How many stages the job has.
    pub stages_total: Option<u32>,
    /// Items done in the current stage.
    pub items_done: Option<u64>,
    /// Items in the current stage, when known.
    pub items_total: Option<u64>,
    /// Estimated seconds to completion.
    pub eta: Option<u64>,
    /// The shards of the job's fanned-out stage, once it has one (`None`: it has none).
    pub shards: Option<ShardCounts>,
}

/// Where a succeeded job's last stage ended, recorded with its success (the job record's
/// `ended_at_stage`): a job that ends within a progress interval of its last write (a short job
/// makes none at all) still shows its stages and its count, since the success costs a write
/// anyway and a progress write just for the end would be one more.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StageEnd {
    /// The last stage's name.
    pub stage: String,
    /// Its 1-based index.
    pub stage_index: u32,
    /// Stages in the job.
    pub stages_total: u32,
    /// Items in the last stage, when the stage counted them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items_total: Option<u64>,
    /// The shards of the job's last fanned-out stage, if it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<ShardCounts>,
}

/// The numbers of a job's last progress write, as the stage engine recorded them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Recorded<'a> {
    /// The percentage written.
    pub pct: f64,
    /// The stage's name (empty: none yet).
    pub stage: &'a str,
    /// 1-based index of the stage (0: none yet).
    pub stage_index: u32,
    /// Stages in the job (0: unknown).
    pub stages_total: u32,
    /// Items of the stage done when it was written.
    pub items_done: u64,
    /// Items in the stage, when the stage could count them.
    pub items_total: Option<u64>,
    /// The ETA written with it.
    pub eta_seconds: Option<u64>,
    /// The shards written with it (the job's latest fanned-out stage's).
    pub shards: Option<ShardCounts>,
}

impl ProgressView {
    /// A job with no progress record (no stage has claimed it): nothing known, nothing done.
    pub fn unknown() -> Self {
        ProgressView {
            pct: 0.0,
            stage: None,
            stage_index: None,
            stages_total: None,
            items_done: None,
            items_total: None,
            eta: None,
            shards: None,
        }
    }

    /// The last progress write, as written.
    pub fn recorded(recorded: Recorded<'_>) -> Self {
        ProgressView {
            pct: recorded.pct,
            stage: (!recorded.stage.is_empty()).then(|| recorded.stage.to_owned()),
            stage_index: (recorded.stage_index > 0).then_some(recorded.stage_index),
            stages_total: (recorded.stages_total > 0).then_some(recorded.stages_total),
            items_done: Some(recorded.items_done),
            items_total: recorded.items_total,
            eta: recorded.eta_seconds,
            shards: recorded.shards,
        }
    }

    /// What a job in `status` shows of `self`, its last progress write (or
    /// [`ProgressView::unknown`]): a live job, that write; a job that succeeded (and one whose
    /// result has since expired), [`ProgressView::ended`]; a job that failed or was cancelled,
    /// that write without an ETA (it will not complete; nor will a compensating one, which is
    /// ending so). `end`: where a succeeded job's last
    /// stage ended, if its success recorded it ([`ProgressView::ended_at`]).
    pub fn for_status(self, status: JobStatus, end: Option<&StageEnd>) -> Self {
        match status {
            JobStatus::Succeeded | JobStatus::Expired => self.ended_at(end),
            status if status.is_terminal() || status == JobStatus::Compensating => {
                // Its shards stopped: those not done are no longer running.
                let shards = self.shards.map(|s| ShardCounts {
                    pending: s.pending + s.running,
                    running: 0,
                    ..s
                });
                ProgressView { eta: None, shards, ..self }
            }
            _ => self,
        }
    }

    /// A succeeded job's progress: 100 % with nothing left, its last stage's items all done.
    ///
    /// Progress is written at most once per progress interval, so the last write may predate
    /// the end of the last stage's items (or be the stage's first, with no count at all, for a
    /// stage shorter than one interval). The job's success says the stage did all its items:
    /// `items_done` is `items_total` when the stage counted them; when it never said how many
    /// there were, both are unknown rather than a count from before the end.
    pub fn ended(self) -> Self {
        ProgressView {
            pct: 100.0,
            items_done: self.items_total,
            eta: Some(0),
            shards: self.shards.map(ShardCounts::ended),
            ..self
        }
    }

    /// What a succeeded job shows, its last stage's end recorded with its success (`end`)
    /// taking precedence over its last progress write, which may predate it.
    pub fn ended_at(self, end: Option<&StageEnd>) -> Self {
        match end {
            Some(end) => ProgressView {
                stage: Some(end.stage.clone()),
                stage_index: Some(end.stage_index),
                stages_total: Some(end.stages_total),
                items_total: end.items_total,
                shards: end.shards.or(self.shards),
                ..self
            }
            .ended(),
            None => self.ended(),
        }
    }

    /// Whether this is already what [`ProgressView::ended`] shows (a live stream that sent it
    /// need not send the end again).
    pub fn is_ended(&self) -> bool {
        *self == self.clone().ended()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::sample::Index;

    fn position(stage_index: u32, stages_total: u32, done: u64, total: Option<u64>) -> Position {
        Position { stage_index, stages_total, done, total }
    }

    /// The arithmetic alone: no floor to lift it.
    fn raw(p: Position) -> f64 {
        overall_pct(p, 0.0)
    }

    /// Where `p` truly is, as an exact percentage `numerator / denominator`: every stage weighs
    /// the same, a stage is `done / total` of the way through (complete when it has no items,
    /// not started while it cannot count them), and items past the total count as the total.
    fn exact_pct(p: Position) -> (u128, u128) {
        let stages = u128::from(p.stages_total);
        let stage = u128::from(p.stage_index);
        let (done, total) = match p.total {
            Some(0) => (1, 1),
            Some(total) => (u128::from(p.done.min(total)), u128::from(total)),
            None => (0, 1),
        };
        (100 * ((stage - 1) * total + done), stages * total)
    }

    /// Why `raw(p)` is not the exact percentage to one decimal, rounded down, if it is not.
    fn not_rounded_down(p: Position) -> Option<String> {
        let pct = raw(p);
        let tenths = (pct * 10.0).round();
        let (numerator, denominator) = exact_pct(p);
        let exact = numerator as f64 / denominator as f64;
        let tenths_u = tenths as u128;
        // tenths / 10 ≤ numerator / denominator < (tenths + 1) / 10, cross-multiplied.
        let one_decimal = pct == tenths / 10.0;
        let rounded_down = tenths_u * denominator <= 10 * numerator
            && 10 * numerator < (tenths_u + 1) * denominator;
        (!(one_decimal && rounded_down)).then(|| format!("{p:?} reports {pct}, exactly {exact}"))
    }

    #[test]
    fn weighted_examples() {
        let at =
            |stage_index, done| Position { stage_index, stages_total: 3, done, total: Some(10) };
        assert_eq!(weighted_pct(at(1, 10), &[8, 1, 1], 0.0), 80.0);
        assert_eq!(weighted_pct(at(2, 5), &[8, 1, 1], 0.0), 85.0);
        assert_eq!(weighted_pct(at(3, 10), &[8, 1, 1], 0.0), 100.0);
        // Weights that do not fit the stages: every stage the same.
        assert_eq!(weighted_pct(at(1, 10), &[8, 1], 0.0), overall_pct(at(1, 10), 0.0));
    }

    #[test]
    fn examples() {
        assert_eq!(overall_pct(position(1, 3, 0, Some(10)), 0.0), 0.0);
        assert_eq!(overall_pct(position(2, 3, 5, Some(10)), 0.0), 50.0);
        assert_eq!(overall_pct(position(3, 3, 10, Some(10)), 0.0), 100.0);
        assert_eq!(overall_pct(position(1, 1, 1, Some(3)), 0.0), 33.3, "rounded down");
        assert_eq!(
            overall_pct(position(1, 1, 29, Some(100)), 0.0),
            29.0,
            "not 28.9 (float rounding)"
        );
        assert_eq!(
            overall_pct(position(1, 1, 9_999, Some(10_000)), 0.0),
            99.9,
            "not done, so not 100"
        );
        assert_eq!(overall_pct(position(1, 2, 0, None), 42.0), 42.0, "the floor holds");
        assert_eq!(eta_seconds(50.0, 0.0, 10.0), Some(10));
        assert_eq!(eta_seconds(5.0, 0.0, 10.0), None, "too early");
        assert_eq!(eta_seconds(50.0, 50.0, 10.0), None, "no progress since the origin");
    }

    fn recorded(items_done: u64, items_total: Option<u64>) -> ProgressView {
        ProgressView::recorded(Recorded {
            pct: 89.4,
            stage: "scan",
            stage_index: 1,
            stages_total: 3,
            items_done,
            items_total,
            eta_seconds: Some(7),
            shards: None,
        })
    }

    /// The last write before the end (93,536,671 of 104,669,764 bytes, 89.4 %): a succeeded
    /// job shows its end, not that write.
    #[test]
    fn a_succeeded_job_shows_its_end_not_its_last_write() {
        let ended = recorded(93_536_671, Some(104_669_764)).for_status(JobStatus::Succeeded, None);
        assert_eq!(ended.pct, 100.0);
        assert_eq!((ended.items_done, ended.items_total), (Some(104_669_764), Some(104_669_764)));
        assert_eq!(ended.eta, Some(0));
        assert_eq!(
            (ended.stage.as_deref(), ended.stage_index, ended.stages_total),
            (Some("scan"), Some(1), Some(3)),
            "the stage is the one recorded"
        );
        assert!(ended.is_ended());
        // Expired: it succeeded, then its result was deleted.
        assert_eq!(
            recorded(93_536_671, Some(104_669_764)).for_status(JobStatus::Expired, None),
            ended
        );
    }

    /// A last stage shorter than one progress interval left only its first write (0 items, no
    /// total): the end says what is known — all done — and no count from before it.
    #[test]
    fn a_stage_that_never_counted_ends_with_no_count() {
        let ended = recorded(0, None).for_status(JobStatus::Succeeded, None);
        assert_eq!((ended.pct, ended.items_done, ended.items_total), (100.0, None, None));
        assert_eq!(ended.eta, Some(0));
        let never_started = ProgressView::unknown().for_status(JobStatus::Succeeded, None);
        assert_eq!((never_started.pct, never_started.items_done), (100.0, None));
        assert_eq!(never_started.stage, None);
    }

    #[test]
    fn a_success_shows_where_its_last_stage_ended_over_an_earlier_write() {
        let end = StageEnd {
            stage: "publish".into(),
            stage_index: 3,
            stages_total: 3,
            items_total: Some(7),
            shards: None,
        };
        // No progress write at all (a job shorter than one interval), or one from an earlier
        // stage: the end recorded with the success is what it shows.
        for last in [ProgressView::unknown(), recorded(2, Some(10))] {
            let shown = last.for_status(JobStatus::Succeeded, Some(&end));
            assert_eq!(shown.pct, 100.0);
            assert_eq!((shown.items_done, shown.items_total), (Some(7), Some(7)));
            assert_eq!(shown.stage.as_deref(), Some("publish"));
            assert_eq!(
                (shown.stage_index, shown.stages_total, shown.eta),
                (Some(3), Some(3), Some(0))
            );
            assert!(shown.is_ended());
        }
        // Not a live or failed job's.
        let live = recorded(2, Some(10));
        assert_eq!(live.clone().for_status(JobStatus::Running, Some(&end)), live);
    }

    /// A fanned-out stage's last write may predate its last shards: a success shows every
    /// shard done, what the success recorded taking precedence; a live or failed job shows the
    /// counts as written.
    #[test]
    fn a_success_shows_every_shard_done() {
        let mid =
            ShardCounts { total: 4, pending: 1, running: 1, succeeded: 2, failed: 0, attempts: 4 };
        let last = ProgressView { shards: Some(mid), ..recorded(5, Some(10)) };
        let done =
            ShardCounts { total: 4, pending: 0, running: 0, succeeded: 4, failed: 0, attempts: 5 };
        assert_eq!(
            last.clone().for_status(JobStatus::Succeeded, None).shards,
            Some(ShardCounts { pending: 0, running: 0, succeeded: 4, ..mid })
        );
        let end = StageEnd {
            stage: "scan".into(),
            stage_index: 1,
            stages_total: 3,
            items_total: Some(10),
            shards: Some(done),
        };
        let shown = last.clone().for_status(JobStatus::Succeeded, Some(&end));
        assert_eq!(shown.shards, Some(done));
        assert!(shown.is_ended());
        assert_eq!(last.clone().for_status(JobStatus::Running, Some(&end)).shards, Some(mid));
        let failed = ShardCounts { failed: 1, ..mid };
        let last = ProgressView { shards: Some(failed), ..recorded(5, Some(10)) };
        assert_eq!(
            last.for_status(JobStatus::Failed, None).shards,
            Some(ShardCounts { pending: 2, running: 0, ..failed }),
            "a failed job's shards that were running run no more"
        );
        assert_eq!(ProgressView::unknown().shards, None, "a job that never fanned out");
    }

    #[test]
    fn live_and_failed_jobs_show_their_last_write() {
        for status in [JobStatus::Pending, JobStatus::Queued, JobStatus::Running] {
            assert_eq!(recorded(5, Some(10)).for_status(status, None), recorded(5, Some(10)));
            assert!(!recorded(5, Some(10)).is_ended());
        }
        for status in [JobStatus::Failed, JobStatus::Cancelled] {
            let shown = recorded(5, Some(10)).for_status(status, None);
            assert_eq!(
                shown,
                ProgressView { eta: None, ..recorded(5, Some(10)) },
                "no ETA: it will not complete"
            );
        }
        let none = ProgressView::unknown();
        assert_eq!(none.for_status(JobStatus::Queued, None), ProgressView::unknown());
        let empty = ProgressView::recorded(Recorded {
            pct: 0.0,
            stage: "",
            stage_index: 0,
            stages_total: 0,
            items_done: 0,
            items_total: None,
            eta_seconds: None,
            shards: None,
        });
        assert_eq!((empty.stage, empty.stage_index, empty.stages_total), (None, None, None));
    }

    #[test]
    fn a_write_at_the_end_is_already_the_end() {
        let at_end = ProgressView { pct: 100.0, eta: Some(0), ..recorded(10, Some(10)) };
        assert!(at_end.is_ended());
        assert_eq!(at_end.clone().ended(), at_end);
        assert!(!ProgressView { eta: None, ..at_end }.is_ended(), "the end says 0 s left");
    }

    /// Every position of small jobs (up to 3 stages of up to 200 items) reports its exact
    /// percentage to one decimal, rounded down — exhaustively, because floating-point
    /// rounding errs on few positions (29 of 100 items once reported 28.9 %), which random
    /// sampling rarely hits.
    #[test]
    fn rounds_down_to_one_decimal_on_every_position_of_small_jobs() {
        for stages in 1..=3 {
            for stage in 1..=stages {
                for total in 1..=200 {
                    for done in 0..=total {
                        if let Some(error) =
                            not_rounded_down(position(stage, stages, done, Some(total)))
                        {
                            panic!("{error}");
                        }
                    }
                }
            }
        }
    }

    /// A restarted attempt goes backwards in raw arithmetic, so the floor is what keeps the bar
    /// still: attempt 1 reported 80 of 100 items of stage 2 of 3; attempt 2 resumes from a
    /// checkpoint at 50.
    #[test]
    fn a_restart_behind_the_last_report_needs_the_floor() {
        let reported = overall_pct(position(2, 3, 80, Some(100)), 0.0);
        assert_eq!(reported, 60.0);
        let checkpoint = position(2, 3, 50, Some(100));
        assert_eq!(raw(checkpoint), 50.0, "the arithmetic alone goes backwards");
        assert_eq!(overall_pct(checkpoint, reported), 60.0, "the floor holds it");
        assert_eq!(
            overall_pct(position(2, 3, 90, Some(100)), reported),
            63.3,
            "and lets go once passed"
        );
    }

    /// Items in a stage: usually counted (sometimes none at all, sometimes so many that one
    /// left is under a tenth of a percent), sometimes not countable.
    fn any_total() -> impl Strategy<Value = Option<u64>> {
        prop_oneof![
            6 => (1u64..500).prop_map(Some),
            1 => (1u64..1_000_000_000).prop_map(Some),
            1 => Just(Some(0)),
            1 => Just(None),
        ]
    }

    /// Items done in a stage of `total` items: anywhere, close to the end, or past it.
    fn any_done(total: Option<u64>) -> BoxedStrategy<u64> {
        match total {
            Some(total) => {
                prop_oneof![0..=total, total.saturating_sub(3)..=total, total..=total + 20].boxed()
            }
            None => (0u64..10_000).boxed(),
        }
    }

    fn any_position() -> impl Strategy<Value = Position> {
        (1u32..6).prop_flat_map(|stages| (1..=stages, Just(stages), any_total())).prop_flat_map(
            |(stage, stages, total)| {
                any_done(total).prop_map(move |done| position(stage, stages, done, total))
            },
        )
    }

    /// A job's shape and how it advances: per stage, its item count and the steps its items
    /// advance by (each report comes after one step).
    type Job = Vec<(Option<u64>, Vec<u64>)>;

    fn any_job() -> impl Strategy<Value = Job> {
        proptest::collection::vec((any_total(), proptest::collection::vec(0u64..200, 0..8)), 1..6)
    }

    /// The positions `job` reports, in order: each stage from 0 items, through its steps (never
    /// past its total), to its last item when it counts them; then the next stage.
    fn reports(job: &Job) -> Vec<Position> {
        let stages = job.len() as u32;
        let mut out = Vec::new();
        for (stage, (total, steps)) in (1..).zip(job) {
            let mut done = 0;
            out.push(position(stage, stages, done, *total));
            for step in steps {
                done = total.map_or(done + step, |total| (done + step).min(total));
                out.push(position(stage, stages, done, *total));
            }
            if let Some(total) = *total {
                out.push(position(stage, stages, total, Some(total)));
            }
        }
        out
    }

    proptest! {
        /// Any position reports its exact percentage to one decimal, rounded down (so it is
        /// always within 0–100 and never claims work not yet done).
        #[test]
        fn a_percentage_to_one_decimal_rounded_down(p in any_position()) {
            let pct = raw(p);
            prop_assert!((0.0..=100.0).contains(&pct), "{pct}");
            let error = not_rounded_down(p);
            prop_assert!(error.is_none(), "{}", error.unwrap_or_default());
        }

        /// 100 % means done: a job reports 100 exactly when it is in its last stage and that
        /// stage has counted all its items — never while any item is left, and always once none
        /// is.
        #[test]
        fn reports_100_exactly_when_the_last_stage_is_done(p in any_position()) {
            let done = p.stage_index == p.stages_total && p.total.is_some_and(|total| p.done >= total);
            prop_assert_eq!(raw(p) == 100.0, done, "{:?} reports {}", p, raw(p));
        }

        /// The arithmetic itself never goes backwards (no floor): as a job of a fixed shape
        /// advances through its items, then on to the next stage from 0 items, each report is at
        /// least the one before it.
        #[test]
        fn never_goes_backwards_as_the_job_advances(job in any_job()) {
            for pair in reports(&job).windows(2) {
                let (before, after) = (raw(pair[0]), raw(pair[1]));
                prop_assert!(before <= after, "{:?} reports {} but {:?} only {}", pair[0], before, pair[1], after);
            }
        }

        /// Finishing a stage reports exactly what starting the next one does (from 0 items,
        /// counted or not), so a bar neither jumps nor stalls at a stage boundary.
        #[test]
        fn stage_boundaries_are_continuous(job in any_job()) {
            let stages = job.len() as u32;
            for (stage, pair) in (1..).zip(job.windows(2)) {
                let (Some(total), next_total) = (pair[0].0, pair[1].0) else { continue };
                if next_total == Some(0) { continue; } // a stage with no items is done as it starts
                let end = raw(position(stage, stages, total, Some(total)));
                let start = raw(position(stage + 1, stages, 0, next_total));
                prop_assert_eq!(end, start, "stage {}/{} ends at {} but the next starts at {}", stage, stages, end, start);
            }
        }

        /// The floor lifts a lower percentage to it and leaves a higher one alone.
        #[test]
        fn the_floor_lifts_only_lower_values(p in any_position(), floor in 0.0f64..=100.0) {
            let pct = overall_pct(p, floor);
            prop_assert_eq!(pct, raw(p).max(floor));
        }

        /// A retried attempt resumes its stage from a checkpoint at or behind what the previous
        /// attempt last reported, with that report as its floor (as the engine does). Its
        /// reports never fall below the previous attempt's, yet follow the arithmetic again
        /// once the work passes it. And the floor is load-bearing: whenever the resumed
        /// attempt redoes a tenth of a percent of the job or more, the arithmetic alone reports
        /// less than the previous attempt did.
        #[test]
        fn a_restart_from_an_earlier_checkpoint_never_reports_less(
            job in any_job(),
            cut in any::<Index>(),
            back in any::<Index>(),
        ) {
            let positions = reports(&job);
            // Attempt 1 reports up to `positions[cut]`, each report the floor of the next.
            let reached = positions[cut.index(positions.len())];
            let attempt_1 = positions.iter().take_while(|p| **p != reached).chain([&reached]);
            let last_report = attempt_1.fold(0.0, |floor, p| overall_pct(*p, floor));
            // Attempt 2 resumes the same stage from a checkpoint at or before the items reached.
            let checkpoint = Position { done: back.index(reached.done as usize + 1) as u64, ..reached };
            let rest = positions.iter().filter(|p| (p.stage_index, p.done) >= (checkpoint.stage_index, checkpoint.done));
            let mut floor = last_report;
            for p in [&checkpoint].into_iter().chain(rest) {
                let pct = overall_pct(*p, floor);
                prop_assert!(pct >= last_report, "{:?} reports {} after {}", p, pct, last_report);
                prop_assert_eq!(pct, raw(*p).max(last_report), "{:?} held at {} instead of following the arithmetic", p, pct);
                floor = pct;
            }
            let ((reached_n, reached_d), (checkpoint_n, checkpoint_d)) = (exact_pct(reached), exact_pct(checkpoint));
            // reached − checkpoint ≥ 0.1 (percent), cross-multiplied.
            if 10 * (reached_n * checkpoint_d) >= 10 * (checkpoint_n * reached_d) + reached_d * checkpoint_d {
                prop_assert!(raw(checkpoint) < last_report, "redoing work from {:?} did not go backwards", checkpoint);
            }
        }

        /// No ETA before 10 % (too early to say) or without measurable progress (no progress
        /// since the origin, or no time elapsed); an ETA otherwise.
        #[test]
        fn eta_only_from_10_percent_with_measured_progress(
            pct in prop_oneof![0.0f64..=100.0, 0.0f64..=20.0, Just(10.0), Just(100.0)],
            // How far the origin is behind `pct`: ahead of it, level with it, or behind it.
            behind in prop_oneof![1 => -100.0f64..0.0, 1 => Just(0.0), 3 => 0.0f64..=100.0],
            elapsed in prop_oneof![1 => Just(0.0), 1 => -100.0f64..0.0, 3 => 0.0f64..1e5],
        ) {
            let origin = (pct - behind).clamp(0.0, 100.0);
            let measurable = pct >= 10.0 && pct > origin && elapsed > 0.0;
            prop_assert_eq!(eta_seconds(pct, origin, elapsed).is_some(), measurable);
        }

        /// The ETA is the whole seconds, rounded up, that the rest of the job takes at the
        /// throughput observed since the origin: by then it is done, a second earlier it is not.
        #[test]
        fn eta_is_the_time_to_finish_at_the_observed_rate(
            pct in 10.0f64..=100.0,
            behind in 0.01f64..=100.0,
            elapsed in 0.001f64..1e5,
        ) {
            let origin = (pct - behind).max(0.0);
            let rate = (pct - origin) / elapsed;
            let Some(eta) = eta_seconds(pct, origin, elapsed) else { return Err(TestCaseError::fail("no ETA")) };
            let by_then = pct + rate * eta as f64;
            prop_assert!(by_then >= 100.0 - 1e-6, "{} % after {} s at {} %/s", by_then, eta, rate);
            prop_assert!(eta == 0 || pct + rate * ((eta - 1) as f64) < 100.0 + 1e-6, "{} s is more than needed", eta);
        }

        /// Equal weights are the unweighted percentage; any weights give 100 % exactly at the
        /// end, never go backwards as the job advances, and meet at stage boundaries.
        #[test]
        fn weighted_progress_is_monotonic_and_ends_at_100(
            weights in proptest::collection::vec(1u32..1_000, 1..6),
            steps in proptest::collection::vec((0u64..50, 1u64..50), 1..6),
        ) {
            let n = weights.len() as u32;
            let equal = vec![7u32; weights.len()];
            let mut last = 0.0;
            for stage in 1..=n {
                let (done, total) = steps[(stage as usize - 1) % steps.len()];
                let total = total.max(done);
                for d in [0, done / 2, done, total] {
                    let p = Position { stage_index: stage, stages_total: n, done: d, total: Some(total) };
                    let pct = weighted_pct(p, &weights, 0.0);
                    prop_assert!(pct >= last, "{} after {}", pct, last);
                    prop_assert_eq!(weighted_pct(p, &equal, 0.0), overall_pct(p, 0.0));
                    last = pct;
                }
            }
            prop_assert_eq!(last, 100.0);
        }

        /// Whatever a succeeded job's last write was, it shows 100 %, no time left, and a
        /// count that is its stage's total (or no count when the stage never said its total),
        /// never a count short of it.
        #[test]
        fn a_succeeded_job_always_shows_a_full_count(
            pct in 0.0f64..=100.0,
            done in 0u64..1_000_000,
            total in proptest::option::of(0u64..1_000_000),
            eta in proptest::option::of(0u64..100_000),
            expired in any::<bool>(),
        ) {
            let last = ProgressView::recorded(Recorded {
                pct, stage: "s", stage_index: 2, stages_total: 2,
                items_done: done, items_total: total, eta_seconds: eta, shards: None,
            });
            let status = if expired { JobStatus::Expired } else { JobStatus::Succeeded };
            let shown = last.for_status(status, None);
            prop_assert_eq!(shown.pct, 100.0);
            prop_assert_eq!(shown.eta, Some(0));
            prop_assert_eq!(shown.items_done, shown.items_total);
            prop_assert_eq!(shown.items_total, total);
            prop_assert!(shown.is_ended());
        }

        /// After the pace changes, once the window has passed, the ETA is the new pace's: a job
        /// that ran fast, then slowed down, is not promised its old speed.
        #[test]
        fn the_window_follows_a_change_of_pace(
            fast in 0.05f64..1.0,
            slow in 0.001f64..0.05,
            switch_at in 20.0f64..50.0,
            after in 61.0f64..300.0,
        ) {
            let mut window = ThroughputWindow::new(ETA_WINDOW_SECONDS);
            let mut t = 0.0;
            let mut pct = 0.0;
            while pct < switch_at {
                t += 1.0;
                pct += fast;
                window.observe(t, pct);
            }
            let mut eta = None;
            let end = t + after;
            while t < end && pct + slow < 100.0 {
                t += 1.0;
                pct += slow;
                eta = window.observe(t, pct);
            }
            prop_assume!(t >= end);
            let expected = ((100.0 - pct) / slow).ceil();
            let eta = eta.expect("an ETA past 10 %") as f64;
            prop_assert!((eta - expected).abs() <= expected * 0.02 + 1.0, "{} s, at the new pace {} s", eta, expected);
        }

        /// At a steady throughput the ETA counts down with the clock: `dt` seconds later it is
        /// `dt` seconds less (within the rounding to whole seconds).
        #[test]
        fn eta_counts_down_at_a_steady_rate(
            origin in 0.0f64..50.0,
            rate in 0.001f64..0.04,
            t1 in 1.0f64..600.0,
            dt in 0.0f64..600.0,
        ) {
            let at = |t: f64| origin + rate * t;
            prop_assume!(at(t1) >= 10.0);
            let first = eta_seconds(at(t1), origin, t1).expect("an ETA from 10 %");
            let later = eta_seconds(at(t1 + dt), origin, t1 + dt).expect("an ETA from 10 %");
            let off = (later as f64 - (first as f64 - dt)).abs();
            prop_assert!(off <= 1.0 + 1e-6, "{} s, then {} s {} s later", first, later, dt);
        }
    }
}

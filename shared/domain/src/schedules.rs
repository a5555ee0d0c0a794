//! Recurring schedules: a job spec submitted once per tick of an expression, as its owner.
//!
//! The vocabulary the API, the store and the firing share: a schedule's identity, its state,
//! and what one firing came to. When a tick fires is the expression's business
//! (its expression); what a firing may do (overlap, catch-up) is decided here, so the
//! firing function and its tests read one rule.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{JobId, Timestamp};

/// A schedule's identity: a UUIDv7 in its canonical hyphenated text, as a [`JobId`] is; only
/// a canonical id parses, so one schedule has one URL.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct ScheduleId(String);

impl ScheduleId {
    /// A fresh, time-ordered id.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        ScheduleId(uuid::Uuid::now_v7().as_hyphenated().to_string())
    }

    /// The canonical text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

text_newtype!(ScheduleId);

impl FromStr for ScheduleId {
    type Err = InvalidScheduleId;
    /// Accepts only the canonical hyphenated form.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let id = uuid::Uuid::try_parse(s).map_err(|_| InvalidScheduleId)?;
        if id.as_hyphenated().to_string() != s {
            return Err(InvalidScheduleId);
        }
        Ok(ScheduleId(s.to_owned()))
    }
}

/// A string that is not a schedule id.
#[derive(Debug, thiserror::Error)]
#[error("not a schedule id")]
pub struct InvalidScheduleId;

/// Whether a schedule fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleState {
    /// Its ticks fire.
    Enabled,
    /// Nothing fires until it is resumed (`POST /schedules/{id}/trigger` still does).
    Paused,
}

/// What one firing of a schedule came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FireOutcome {
    /// A job was submitted for the tick (or an earlier firing of the same tick had).
    Submitted,
    /// No job for the tick, by the schedule's own rules: the previous job still runs
    /// (`overlap`), the tick was held for later (`buffer_one`), or it was delivered too late.
    Skipped,
    /// The submission was refused (a limit, params the kind no longer accepts, a disabled
    /// kind): the reason says which.
    Refused,
}

/// The last firing, as a schedule's view shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastFire {
    /// The tick's time (the firing's scheduled time, not when it ran).
    pub scheduled_at: Timestamp,
    /// The job submitted for it, if one was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<JobId>,
    /// What it came to.
    pub outcome: FireOutcome,
    /// Why, for a skipped or refused tick.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// How a tick's job relates to the schedule's previous job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// A tick while the previous job is live is skipped (and recorded as such).
    #[default]
    Skip,
    /// One tick while the previous job is live is held and submitted when that job ends;
    /// further ones are skipped.
    BufferOne,
    /// Every tick submits, whatever runs.
    Allow,
}

impl Overlap {
    /// The name the API and the store use.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::BufferOne => "buffer_one",
            Overlap::Allow => "allow",
        }
    }
}

/// What a firing does with its tick, given the schedule's overlap and whether the schedule's
/// previous job is still live (not ended) and a tick is already held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TickDecision {
    /// Submit a job for the tick.
    Submit,
    /// Hold the tick until the live job ends (`buffer_one`).
    Hold,
    /// Skip the tick.
    Skip,
}

/// The overlap rule: what a tick does while the previous job is `live`, with `held` a tick
/// already held.
pub fn decide(overlap: Overlap, live: bool, held: bool) -> TickDecision {
    match (overlap, live) {
        (Overlap::Allow, _) | (_, false) => TickDecision::Submit,
        (Overlap::Skip, true) => TickDecision::Skip,
        (Overlap::BufferOne, true) if held => TickDecision::Skip,
        (Overlap::BufferOne, true) => TickDecision::Hold,
    }
}

/// How every tick's idempotency key starts; reserved: a client's `Idempotency-Key` may not
/// (it could otherwise take a tick's key before the tick fires).
pub const TICK_KEY_PREFIX: &str = "schedule:";

/// The idempotency key of a tick's job: one per (schedule, scheduled time), so a retried or
/// duplicated firing of the tick finds the job the first made. Within the API's key limit
/// (visible ASCII, ≤ 255).
pub fn tick_idempotency_key(schedule_id: &ScheduleId, scheduled_at: Timestamp) -> String {
    format!("{TICK_KEY_PREFIX}{schedule_id}:{scheduled_at}")
}

/// How late a tick's firing may arrive and still submit: a firing delivered later than this
/// after its scheduled time (a delivery retried for long, a firer that was down) is recorded
/// as skipped instead, so a recovering deployment runs at most one catch-up per schedule —
/// the latest tick — instead of a burst of stale ones.
pub const CATCH_UP_SECONDS: i64 = 3_600;

/// Whether a firing of the tick at `scheduled_at` that runs at `now` came too late to submit
/// ([`CATCH_UP_SECONDS`]).
pub fn too_late(scheduled_at: Timestamp, now: Timestamp) -> bool {
    (now.as_datetime() - scheduled_at.as_datetime()).num_seconds() > CATCH_UP_SECONDS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_canonical_id_parses() {
        let id = ScheduleId::new();
        assert_eq!(id.as_str().parse::<ScheduleId>().unwrap(), id);
        for wrong in ["", "x", &id.as_str().to_uppercase(), &id.as_str().replace('-', "")] {
            assert!(wrong.parse::<ScheduleId>().is_err(), "{wrong:?}");
        }
        let read: Result<ScheduleId, _> = serde_json::from_value("nope".into());
        assert!(read.is_err());
    }

    #[test]
    fn overlap_decides_each_tick() {
        use TickDecision::*;
        for overlap in [Overlap::Skip, Overlap::BufferOne, Overlap::Allow] {
            assert_eq!(decide(overlap, false, false), Submit, "{overlap:?}, nothing live");
        }
        assert_eq!(decide(Overlap::Skip, true, false), Skip);
        assert_eq!(decide(Overlap::BufferOne, true, false), Hold);
        assert_eq!(decide(Overlap::BufferOne, true, true), Skip);
        assert_eq!(decide(Overlap::Allow, true, true), Submit);
    }

    #[test]
    fn names_read_back() {
        for overlap in [Overlap::Skip, Overlap::BufferOne, Overlap::Allow] {
            assert_eq!(serde_json::to_value(overlap).unwrap(), overlap.as_str());
        }
        assert!(serde_json::from_value::<Overlap>("sometimes".into()).is_err());
        assert_eq!(serde_json::to_value(FireOutcome::Refused).unwrap(), "refused");
        assert_eq!(serde_json::to_value(ScheduleState::Paused).unwrap(), "paused");
    }

    #[test]
    fn a_ticks_key_is_stable_per_tick_and_fits_the_api() {
        let id = ScheduleId::new();
        let at: Timestamp = "2026-11-26T02:00:00.000Z".parse().unwrap();
        let later: Timestamp = "2026-11-26T02:01:00.000Z".parse().unwrap();
        assert_eq!(tick_idempotency_key(&id, at), tick_idempotency_key(&id, at));
        assert_ne!(tick_idempotency_key(&id, at), tick_idempotency_key(&id, later));
        assert_ne!(tick_idempotency_key(&id, at), tick_idempotency_key(&ScheduleId::new(), at));
        let key = tick_idempotency_key(&id, at);
        assert!(key.len() <= 255 && key.bytes().all(|b| b.is_ascii_graphic()), "{key}");
    }

    #[test]
    fn a_firing_more_than_the_catch_up_window_late_does_not_submit() {
        let at: Timestamp = "2026-11-26T02:00:00.000Z".parse().unwrap();
        let on_time: Timestamp = "2026-11-26T02:00:05.000Z".parse().unwrap();
        let edge: Timestamp = "2026-11-26T03:00:00.000Z".parse().unwrap();
        let late: Timestamp = "2026-11-26T03:00:01.000Z".parse().unwrap();
        assert!(!too_late(at, on_time));
        assert!(!too_late(at, edge));
        assert!(too_late(at, late));
    }
}

//! Progress arithmetic: the percentage a running job reports and its ETA.
//!
//! Clients render bars from these numbers, so they must never go backwards: a retried
//! attempt, a stage boundary or a resumed checkpoint may report the same progress again but
//! never less. The stage engine keeps the floor (the last percentage it wrote, or the one the
//! previous attempt left in the progress record) and passes it in.

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
    let stages = position.stages_total.max(1) as f64;
    let stage = position.stage_index.clamp(1, position.stages_total.max(1)) as f64;
    let fraction = match position.total {
        Some(0) => 1.0,
        Some(total) => (position.done as f64 / total as f64).min(1.0),
        None => 0.0,
    };
    let overall = (stage - 1.0 + fraction) / stages * 100.0;
    ((overall * 10.0).floor() / 10.0).max(floor).min(100.0)
}

/// Seconds left at the throughput observed since `origin_pct` was reported `elapsed_seconds`
/// ago; none before 10 % (too early to say) or without measurable progress.
pub fn eta_seconds(pct: f64, origin_pct: f64, elapsed_seconds: f64) -> Option<u64> {
    (pct >= 10.0 && pct > origin_pct && elapsed_seconds > 0.0)
        .then(|| ((100.0 - pct) / ((pct - origin_pct) / elapsed_seconds)).ceil() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn position(stage_index: u32, stages_total: u32, done: u64, total: Option<u64>) -> Position {
        Position { stage_index, stages_total, done, total }
    }

    #[test]
    fn examples() {
        assert_eq!(overall_pct(position(1, 3, 0, Some(10)), 0.0), 0.0);
        assert_eq!(overall_pct(position(2, 3, 5, Some(10)), 0.0), 50.0);
        assert_eq!(overall_pct(position(3, 3, 10, Some(10)), 0.0), 100.0);
        assert_eq!(overall_pct(position(1, 1, 1, Some(3)), 0.0), 33.3, "rounded down");
        assert_eq!(overall_pct(position(1, 2, 0, None), 42.0), 42.0, "the floor holds");
        assert_eq!(eta_seconds(50.0, 0.0, 10.0), Some(10));
        assert_eq!(eta_seconds(5.0, 0.0, 10.0), None, "too early");
        assert_eq!(eta_seconds(50.0, 50.0, 10.0), None, "no progress since the origin");
    }

    fn any_position() -> impl Strategy<Value = Position> {
        (1u32..6, 0u64..10_000, proptest::option::of(0u64..10_000)).prop_flat_map(|(stages, done, total)| {
            (1..=stages).prop_map(move |stage| position(stage, stages, done, total))
        })
    }

    proptest! {
        /// Always a percentage, never below the floor.
        #[test]
        fn within_bounds_and_above_the_floor(p in any_position(), floor in 0.0f64..=100.0) {
            let pct = overall_pct(p, floor);
            prop_assert!((0.0..=100.0).contains(&pct));
            prop_assert!(pct >= floor);
        }

        /// Any sequence of reports a job can make — items advancing within a stage, stages
        /// advancing, each report starting from the last one's value as its floor (as the
        /// engine does across writes, invocations and attempts) — never goes backwards.
        #[test]
        fn never_goes_backwards(
            stages in 1u32..6,
            steps in proptest::collection::vec((any::<bool>(), 0u64..50, proptest::option::of(1u64..200)), 1..60),
        ) {
            let (mut stage, mut done, mut last) = (1u32, 0u64, 0.0f64);
            for (advance_stage, more, total) in steps {
                if advance_stage && stage < stages {
                    stage += 1;
                    done = 0;
                } else {
                    done += more;
                }
                let pct = overall_pct(position(stage, stages, done, total), last);
                prop_assert!(pct >= last, "{pct} < {last} at stage {stage}/{stages}, {done}/{total:?}");
                last = pct;
            }
        }

        /// Finishing a stage never reports more than starting the next one.
        #[test]
        fn stage_boundaries_are_continuous(stages in 2u32..6, total in 1u64..1000) {
            for stage in 1..stages {
                let end = overall_pct(position(stage, stages, total, Some(total)), 0.0);
                let next = overall_pct(position(stage + 1, stages, 0, Some(total)), 0.0);
                prop_assert!(end <= next + 0.1, "{end} > {next}");
            }
        }

        /// The ETA is finite and shrinks as the same throughput carries the job further.
        #[test]
        fn eta_shrinks_with_progress(origin in 0.0f64..50.0, rate in 0.001f64..0.04, t1 in 1.0f64..600.0, dt in 0.0f64..600.0) {
            let at = |t: f64| origin + rate * t;
            prop_assume!(at(t1 + dt) < 100.0);
            if let (Some(first), Some(later)) = (eta_seconds(at(t1), origin, t1), eta_seconds(at(t1 + dt), origin, t1 + dt)) {
                prop_assert!(later <= first + 1, "{later} > {first}");
            }
        }
    }
}

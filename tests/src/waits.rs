//! Waits for what the stack's own settings make due: a deadline derived from them.

use super::*;

/// A wait for something the stack's own settings make due (a heartbeat timeout, a keepalive, a
/// retry schedule), or for something that watches no job: it gives up once `limit` has passed,
/// a limit the test derives from those settings with a wide margin, so that only what never
/// happens fails it, however slow the machine. (A wait on a job that works watches its
/// movement instead: [`Api::wait_for`], [`Api::wait_terminal`], [`Faults::wait_paused`].)
pub struct Deadline {
    what: String,
    limit: Duration,
    since: tokio::time::Instant,
}

impl Deadline {
    /// A wait for `what`, from now, for at most `limit`.
    pub fn new(what: impl Into<String>, limit: Duration) -> Self {
        Deadline { what: what.into(), limit, since: tokio::time::Instant::now() }
    }

    /// Whether the wait is over (the limit has passed).
    pub fn passed(&self) -> bool {
        self.since.elapsed() >= self.limit
    }

    /// Between two looks: panics, naming what was awaited and what the last look `saw`, once
    /// the limit has passed; sleeps `every` otherwise.
    pub async fn tick(&self, every: Duration, saw: impl std::fmt::Display) {
        assert!(
            !self.passed(),
            "waited {:?} for {}, in vain; last seen: {saw}",
            self.limit,
            self.what
        );
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_deadline_lets_a_wait_go_on_until_its_limit() {
        let deadline = Deadline::new("nothing", Duration::from_secs(60));
        deadline.tick(Duration::ZERO, "a first look").await;
        assert!(!deadline.passed());
    }

    #[tokio::test]
    #[should_panic(expected = "waited 0ns for the impossible, in vain; last seen: a look")]
    async fn a_deadline_fails_the_wait_once_its_limit_has_passed() {
        let deadline = Deadline::new("the impossible", Duration::ZERO);
        assert!(deadline.passed());
        deadline.tick(Duration::ZERO, "a look").await;
    }
}

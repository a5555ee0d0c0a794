//! Job kinds for tests: small kinds a test binary registers into its stack's functions beside
//! the shipped ones (see [`crate::harness_with_registry`]).

use std::marker::PhantomData;
use std::time::Duration;

use longhaul_worker::{JobKind, KindError, Policy, StageContext, StageOutcome};
use serde::Deserialize;

/// The name of a test kind (the `"type"` clients submit), as a type: a kind's name is a
/// constant of its type.
pub trait KindName: Send + Sync + 'static {
    /// See [`JobKind::NAME`].
    const NAME: &'static str;
}

/// A kind of one stage, `work`, that works `millis` (its params), counts its one item done and
/// writes `done.txt`: a job that holds its slot for as long as the test says. Built from
/// [`Sleeper::new`]: it accepts up to a minute's work, with the default policy, unless told
/// otherwise.
pub struct Sleeper<N> {
    longest: Duration,
    policy: Policy,
    name: PhantomData<fn() -> N>,
}

/// The params of a [`Sleeper`].
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SleeperParams {
    /// How long the stage works, in milliseconds.
    pub millis: u64,
    /// Only makes one request differ from the next (identical submissions with derived
    /// idempotency keys would be one job).
    #[serde(default)]
    pub n: u64,
}

impl<N: KindName> Sleeper<N> {
    /// A sleeper named `N::NAME`.
    pub fn new() -> Self {
        Sleeper { longest: Duration::from_secs(60), policy: Policy::default(), name: PhantomData }
    }

    /// Accepts jobs that work up to `longest` (submissions asking more are 422).
    pub fn longest(mut self, longest: Duration) -> Self {
        self.longest = longest;
        self
    }

    /// At most `limit` of its jobs run at once, whoever submits them (one kind pool).
    pub fn concurrency_limit(mut self, limit: u32) -> Self {
        self.policy.concurrency_limit = Some(limit);
        self
    }

    /// Its jobs' attempts.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.policy.max_attempts = attempts;
        self
    }
}

impl<N: KindName> Default for Sleeper<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<N: KindName> JobKind for Sleeper<N> {
    const NAME: &'static str = N::NAME;
    type Params = SleeperParams;

    fn stages(&self) -> &'static [&'static str] {
        &["work"]
    }

    fn validate(&self, params: &SleeperParams) -> Result<(), String> {
        let most = self.longest.as_millis();
        if u128::from(params.millis) > most {
            Err(format!("millis is at most {most}"))
        } else {
            Ok(())
        }
    }

    fn policy(&self) -> Policy {
        self.policy.clone()
    }

    async fn run_stage(
        &self,
        ctx: &mut dyn StageContext,
        params: &SleeperParams,
    ) -> Result<StageOutcome, KindError> {
        ctx.pause(Duration::from_millis(params.millis), 0, Some(1)).await?;
        ctx.progress(1, Some(1)).await?;
        let result = ctx.write_result("done.txt", "text/plain", b"done".to_vec()).await?;
        Ok(StageOutcome::Finished(result))
    }
}

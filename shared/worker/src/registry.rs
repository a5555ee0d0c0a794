//! The registry: the kinds a deployment runs, by name, type-erased.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::context::{StageContext, StageOutcome};
use crate::fan_out::{Shard, ShardOrder, ShardOutcome, ShardOutput};
use crate::message::{KindError, PublicMessage};
use crate::policy::Policy;

/// A kind of job: its name, ordered stages, typed params, the uploads it reads, its policy and
/// its stages' code. See the crate documentation for an example.
pub trait JobKind: Send + Sync + 'static {
    /// The name clients use in `"type"` (lowercase, `snake_case`).
    const NAME: &'static str;

    /// The job's parameters, as the client sends them (`"params"`). Prefer
    /// `#[serde(deny_unknown_fields)]`: a misspelt option should be an error, not ignored.
    type Params: DeserializeOwned + schemars::JsonSchema + Send + Sync;

    /// The stages, in order (at least one).
    fn stages(&self) -> &'static [&'static str];

    /// How much of the job each stage is, for the progress bar: one positive weight per
    /// stage, in order (e.g. `&[1, 8, 1]` when the middle stage is most of the work). Empty
    /// (the default): every stage weighs the same.
    fn stage_weights(&self) -> &'static [u32] {
        &[]
    }

    /// Checks what serde cannot express (ranges, combinations); the message goes to the
    /// client as is.
    fn validate(&self, _params: &Self::Params) -> Result<(), String> {
        Ok(())
    }

    /// The uploads the job reads. The framework refuses a job naming another owner's upload,
    /// and lets the stages read only these.
    fn inputs(&self, _params: &Self::Params) -> Vec<String> {
        Vec::new()
    }

    /// How the framework runs the kind's jobs.
    fn policy(&self) -> Policy {
        Policy::default()
    }

    /// Runs the stage `ctx.stage()` until it is done, the deadline nears (checkpoint and
    /// return [`StageOutcome::Paused`]), or it fails.
    fn run_stage<'a>(
        &'a self,
        ctx: &'a mut dyn StageContext,
        params: &'a Self::Params,
    ) -> impl Future<Output = Result<StageOutcome, KindError>> + Send + 'a;

    /// Whether `stage` fans out for `params` (default: no stage does): the stage then splits
    /// its work into shards ([`JobKind::split`]), runs each on its own
    /// ([`JobKind::run_shard`]: its own checkpoint and progress, in an order the framework
    /// picks) and merges their outputs ([`JobKind::merge`]) instead of running as one worker
    /// ([`JobKind::run_stage`]). Asked on every invocation of the stage: answer from `params`
    /// alone.
    fn fans_out(&self, _stage: &str, _params: &Self::Params) -> bool {
        false
    }

    /// The shards a stage that fans out splits into: each a small descriptor of its part of
    /// the work (see [`Shard`]), 1 to [`crate::MAX_SHARDS`] of them. Asked once, when the
    /// stage starts (again only if the stage is restarted before its first checkpoint), so it
    /// may read the previous stage's output ([`StageContext::carried_raw`]) and the inputs'
    /// sizes; put what the shards need in their descriptors. `vec![Shard::whole()]` runs the
    /// stage plain instead ([`Shard::whole`]: an input too small to be worth fanning out).
    fn split<'a>(
        &'a self,
        _ctx: &'a mut dyn StageContext,
        _params: &'a Self::Params,
    ) -> impl Future<Output = Result<Vec<Shard>, KindError>> + Send + 'a {
        async { Err(KindError::fatal(PublicMessage::fixed(NO_FAN_OUT))) }
    }

    /// Runs one shard of a stage that fans out ([`JobKind::split`]), until it is done (its output, for
    /// the merge), the deadline nears (checkpoint and return [`ShardOutcome::Paused`]), or it
    /// fails. `ctx` is the shard's own: its checkpoint is the shard's, and the progress it
    /// reports counts to [`Shard::items`]. A shard cannot write the job's result, wait for a
    /// signal or read the previous stage's output (`split` does, into the descriptors); a
    /// file it stages is named `shard<index>-<name>`. Shards run in any order; one must not
    /// depend on another.
    fn run_shard<'a>(
        &'a self,
        _ctx: &'a mut dyn StageContext,
        _params: &'a Self::Params,
        _shard: &'a Shard,
    ) -> impl Future<Output = Result<ShardOutcome, KindError>> + Send + 'a {
        async { Err(KindError::fatal(PublicMessage::fixed(NO_FAN_OUT))) }
    }

    /// Merges the outputs of every shard of a stage that fans out, in shard order, into the
    /// stage's outcome: [`StageOutcome::Finished`] with the job's result, or
    /// [`StageOutcome::StageDone`] with the next stage's input saved as the stage's checkpoint.
    /// Every output is kept before it runs: a merge that fails retryably, returns
    /// [`StageOutcome::Paused`] or dies is run again from the same outputs, resuming from the
    /// checkpoint it saved, if any (kept apart from the shards'). It cannot read the previous
    /// stage's output.
    fn merge<'a>(
        &'a self,
        _ctx: &'a mut dyn StageContext,
        _params: &'a Self::Params,
        _outputs: &'a [ShardOutput],
    ) -> impl Future<Output = Result<StageOutcome, KindError>> + Send + 'a {
        async { Err(KindError::fatal(PublicMessage::fixed(NO_FAN_OUT))) }
    }

    /// The stages that have an undo ([`JobKind::undo`]) for `params` (none, the default).
    /// Asked once, at submit, and stored on the job: a job that ends `failed` or `cancelled`
    /// after one of them started runs their undos, latest stage first, before it ends.
    fn undo_stages(&self, _params: &Self::Params) -> Vec<&'static str> {
        Vec::new()
    }

    /// Undoes what stage `undo.stage` did (reserved stock, a charge): run once the job ends
    /// `failed` or `cancelled`, for each stage in [`JobKind::undo_stages`] that started,
    /// whether it finished or not. Must be idempotent: it is retried with backoff on a
    /// retryable error (within the job's attempts) and may run again after a crash — pass
    /// `undo.key` as the idempotency key of whatever it calls. A fatal error, or retries
    /// spent, gives the undo up: the job's compensation ends `failed` (the other undos still
    /// run).
    fn undo<'a>(
        &'a self,
        _undo: &'a Undo,
        _params: &'a Self::Params,
    ) -> impl Future<Output = Result<(), KindError>> + Send + 'a {
        async { Ok(()) }
    }
}

/// What a kind that splits a stage without running its shards fails with.
const NO_FAN_OUT: &str = "the job kind fans a stage out but cannot split, run or merge it";

/// One undo to run ([`JobKind::undo`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undo {
    /// The stage to undo.
    pub stage: String,
    /// A key stable across the undo's attempts and unique to this job and stage: the
    /// idempotency key for whatever the undo calls.
    pub key: String,
    /// Which attempt this is (1, 2, …).
    pub attempt: u32,
}

/// Why submitted params were refused (the message goes to the client).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid params: {0}")]
pub struct ParamsError(pub String);

/// A kind with its params as JSON: what the registry holds.
pub trait DynKind: Send + Sync {
    /// See [`JobKind::NAME`].
    fn name(&self) -> &'static str;
    /// See [`JobKind::stages`].
    fn stages(&self) -> &'static [&'static str];
    /// See [`JobKind::policy`].
    fn policy(&self) -> Policy;
    /// See [`JobKind::stage_weights`].
    fn stage_weights(&self) -> &'static [u32];
    /// The params' JSON Schema.
    fn params_schema(&self) -> Value;
    /// Parses and validates `params`; answers the uploads they name.
    fn check(&self, params: &Value) -> Result<Vec<String>, ParamsError>;
    /// Runs the current stage with `params` (parsed again: a job's params were checked at
    /// submit, so a failure here is fatal); a stage that fans out runs its shards in index
    /// order ([`crate::fan_out::run_stage`]).
    fn run_stage<'a>(
        &'a self,
        ctx: &'a mut dyn StageContext,
        params: &'a Value,
    ) -> BoxFuture<'a, Result<StageOutcome, KindError>> {
        self.run_stage_in(ctx, params, ShardOrder::Index)
    }
    /// [`DynKind::run_stage`], running a fanned-out stage's shards in `order`.
    fn run_stage_in<'a>(
        &'a self,
        ctx: &'a mut dyn StageContext,
        params: &'a Value,
        order: ShardOrder,
    ) -> BoxFuture<'a, Result<StageOutcome, KindError>>;
    /// See [`JobKind::fans_out`] (params that do not parse: no).
    fn fans_out(&self, stage: &str, params: &Value) -> bool;
    /// Runs the current stage, which fans out, with its shards run by `host`
    /// ([`crate::fan_out::run_distributed`]).
    fn run_distributed<'a>(
        &'a self,
        ctx: &'a mut dyn StageContext,
        params: &'a Value,
        host: &'a mut dyn crate::fan_out::ShardHost,
    ) -> BoxFuture<'a, Result<crate::fan_out::Distributed, KindError>>;
    /// Runs one shard of the current stage in its own invocation
    /// ([`JobKind::run_shard`], `ctx` the shard's own context).
    fn run_shard<'a>(
        &'a self,
        ctx: &'a mut dyn StageContext,
        params: &'a Value,
        shard: &'a Shard,
    ) -> BoxFuture<'a, Result<ShardOutcome, KindError>>;
    /// See [`JobKind::undo_stages`] (params that do not parse: none).
    fn undo_stages(&self, params: &Value) -> Vec<&'static str>;
    /// See [`JobKind::undo`] (params that do not parse: a fatal error).
    fn undo<'a>(
        &'a self,
        undo: &'a Undo,
        params: &'a Value,
    ) -> BoxFuture<'a, Result<(), KindError>>;
}

struct Erased<K>(K);

impl<K: JobKind> Erased<K> {
    fn parse(&self, params: &Value) -> Result<K::Params, ParamsError> {
        let parsed: K::Params =
            serde_json::from_value(params.clone()).map_err(|e| ParamsError(e.to_string()))?;
        self.0.validate(&parsed).map_err(ParamsError)?;
        Ok(parsed)
    }
}

impl<K: JobKind> DynKind for Erased<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn stages(&self) -> &'static [&'static str] {
        self.0.stages()
    }

    fn policy(&self) -> Policy {
        self.0.policy()
    }

    fn stage_weights(&self) -> &'static [u32] {
        self.0.stage_weights()
    }

    fn params_schema(&self) -> Value {
        serde_json::to_value(schemars::schema_for!(K::Params)).unwrap_or_else(|_| json!({}))
    }

    fn check(&self, params: &Value) -> Result<Vec<String>, ParamsError> {
        let parsed = self.parse(params)?;
        Ok(self.0.inputs(&parsed))
    }

    fn run_stage_in<'a>(
        &'a self,
        ctx: &'a mut dyn StageContext,
        params: &'a Value,
        order: ShardOrder,
    ) -> BoxFuture<'a, Result<StageOutcome, KindError>> {
        async move {
            let params =
                self.parse(params).map_err(|e| KindError::fatal(PublicMessage::domain(e)))?;
            crate::fan_out::run_stage(&self.0, ctx, &params, order).await
        }
        .boxed()
    }

    fn fans_out(&self, stage: &str, params: &Value) -> bool {
        self.parse(params).is_ok_and(|parsed| self.0.fans_out(stage, &parsed))
    }

    fn run_distributed<'a>(
        &'a self,
        ctx: &'a mut dyn StageContext,
        params: &'a Value,
        host: &'a mut dyn crate::fan_out::ShardHost,
    ) -> BoxFuture<'a, Result<crate::fan_out::Distributed, KindError>> {
        async move {
            let params =
                self.parse(params).map_err(|e| KindError::fatal(PublicMessage::domain(e)))?;
            crate::fan_out::run_distributed(&self.0, ctx, &params, host).await
        }
        .boxed()
    }

    fn run_shard<'a>(
        &'a self,
        ctx: &'a mut dyn StageContext,
        params: &'a Value,
        shard: &'a Shard,
    ) -> BoxFuture<'a, Result<ShardOutcome, KindError>> {
        async move {
            let params =
                self.parse(params).map_err(|e| KindError::fatal(PublicMessage::domain(e)))?;
            self.0.run_shard(ctx, &params, shard).await
        }
        .boxed()
    }

    fn undo_stages(&self, params: &Value) -> Vec<&'static str> {
        self.parse(params).map(|parsed| self.0.undo_stages(&parsed)).unwrap_or_default()
    }

    fn undo<'a>(
        &'a self,
        undo: &'a Undo,
        params: &'a Value,
    ) -> BoxFuture<'a, Result<(), KindError>> {
        async move {
            let params =
                self.parse(params).map_err(|e| KindError::fatal(PublicMessage::domain(e)))?;
            self.0.undo(undo, &params).await
        }
        .boxed()
    }
}

/// Why a registry could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// Two kinds share a name.
    #[error("two job kinds are named {0:?}")]
    Duplicate(&'static str),
    /// A kind declares no stages, or a stage twice.
    #[error("job kind {0:?} must declare at least one stage, each once")]
    BadStages(&'static str),
    /// A kind's stage weights are not one positive weight per stage.
    #[error("job kind {0:?} must give one positive weight per stage, or none")]
    BadWeights(&'static str),
    /// A name to enable is not registered.
    #[error("no job kind is named {0:?} (known: {1})")]
    Unknown(String, String),
}

/// In a deployment's `ENABLED_JOB_TYPES`, every kind but the opt-in ones
/// ([`RegistryBuilder::opt_in_kind`]): what the template enables by default, so that a kind
/// added to the catalog is enabled without a template change.
pub const EVERY_KIND: &str = "*";

/// The kinds a deployment runs. Built once at start-up; cheap to clone.
#[derive(Clone, Default)]
pub struct Registry {
    kinds: Vec<Arc<dyn DynKind>>,
    /// The names of the kinds [`EVERY_KIND`] leaves out.
    opt_in: BTreeSet<&'static str>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

/// Collects kinds for a [`Registry`].
#[derive(Default)]
pub struct RegistryBuilder {
    kinds: Vec<Arc<dyn DynKind>>,
    opt_in: BTreeSet<&'static str>,
}

impl RegistryBuilder {
    /// Registers `kind`.
    pub fn kind<K: JobKind>(mut self, kind: K) -> Self {
        self.kinds.push(Arc::new(Erased(kind)));
        self
    }

    /// Registers `kind` as opt-in: a deployment runs it only when its `ENABLED_JOB_TYPES`
    /// names it, [`EVERY_KIND`] leaves it out (e.g. a diagnostic kind anyone could hold
    /// workers with).
    pub fn opt_in_kind<K: JobKind>(mut self, kind: K) -> Self {
        self.opt_in.insert(K::NAME);
        self.kind(kind)
    }

    /// Registers every kind of `registry` (e.g. the shipped catalog, to add kinds of one's
    /// own beside it), opt-in ones as opt-in; a name both hold fails at
    /// [`RegistryBuilder::build`].
    pub fn kinds_of(mut self, registry: &Registry) -> Self {
        self.kinds.extend(registry.kinds.iter().cloned());
        self.opt_in.extend(&registry.opt_in);
        self
    }

    /// The registry, or why it is invalid (duplicate names, no stages).
    pub fn build(self) -> Result<Registry, RegistryError> {
        let mut names = BTreeSet::new();
        for kind in &self.kinds {
            if !names.insert(kind.name()) {
                return Err(RegistryError::Duplicate(kind.name()));
            }
            let stages: BTreeSet<_> = kind.stages().iter().collect();
            if stages.is_empty() || stages.len() != kind.stages().len() {
                return Err(RegistryError::BadStages(kind.name()));
            }
            let weights = kind.stage_weights();
            if !weights.is_empty() && (weights.len() != kind.stages().len() || weights.contains(&0))
            {
                return Err(RegistryError::BadWeights(kind.name()));
            }
        }
        Ok(Registry { kinds: self.kinds, opt_in: self.opt_in })
    }
}

impl Registry {
    /// Starts a registry.
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder::default()
    }

    /// The kind named `name`.
    pub fn get(&self, name: &str) -> Option<&dyn DynKind> {
        self.kinds.iter().find(|k| k.name() == name).map(|k| k.as_ref())
    }

    /// The kinds' names, in registration order.
    pub fn names(&self) -> Vec<&'static str> {
        self.kinds.iter().map(|k| k.name()).collect()
    }

    /// The kinds, in registration order.
    pub fn kinds(&self) -> impl Iterator<Item = &dyn DynKind> {
        self.kinds.iter().map(|k| k.as_ref())
    }

    /// Only the kinds named in `enabled` (a deployment's `ENABLED_JOB_TYPES`); a name that is
    /// not registered is an error.
    pub fn only<S: AsRef<str>>(&self, enabled: &[S]) -> Result<Registry, RegistryError> {
        for name in enabled {
            if self.get(name.as_ref()).is_none() {
                return Err(RegistryError::Unknown(
                    name.as_ref().chars().take(64).collect(),
                    self.names().join(", "),
                ));
            }
        }
        let kinds = self
            .kinds
            .iter()
            .filter(|k| enabled.iter().any(|n| n.as_ref() == k.name()))
            .cloned()
            .collect();
        Ok(Registry { kinds, opt_in: self.opt_in.clone() })
    }

    /// The kinds [`EVERY_KIND`] enables: all but the opt-in ones, in registration order.
    pub fn default_names(&self) -> Vec<&'static str> {
        self.names().into_iter().filter(|n| !self.opt_in.contains(n)).collect()
    }

    /// The names in a deployment's `ENABLED_JOB_TYPES`, each a registered kind's, once:
    /// comma-separated kind names and [`EVERY_KIND`] (`*`, the kinds of
    /// [`Registry::default_names`]), e.g. `*`, `demo,*` or `csv_report`. Unset: every kind,
    /// opt-in ones too.
    pub fn enabled_names(&self, list: Option<&str>) -> Result<Vec<String>, RegistryError> {
        let Some(list) = list else {
            return Ok(self.names().into_iter().map(str::to_owned).collect());
        };
        let mut names: Vec<String> = Vec::new();
        for item in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let expanded = if item == EVERY_KIND { self.default_names() } else { vec![item] };
            for name in expanded {
                if !names.iter().any(|n| n == name) {
                    names.push(name.to_owned());
                }
            }
        }
        self.only(&names)?;
        Ok(names)
    }

    /// The kinds named in `enabled`, ignoring names it does not register (a list checked by
    /// [`Registry::enabled_names`] has none).
    pub fn enabled(&self, enabled: &[String]) -> Registry {
        let kinds =
            self.kinds.iter().filter(|k| enabled.iter().any(|n| n == k.name())).cloned().collect();
        Registry { kinds, opt_in: self.opt_in.clone() }
    }

    /// The kinds as `GET /job-types` lists them.
    pub fn describe(&self) -> Value {
        let kinds: Vec<Value> = self
            .kinds()
            .map(|k| {
                json!({
                    "type": k.name(),
                    "stages": k.stages(),
                    "params_schema": k.params_schema(),
                    "policy": k.policy(),
                })
            })
            .collect();
        json!({ "job_types": kinds })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct P {
        n: u32,
    }

    struct A;
    impl JobKind for A {
        const NAME: &'static str = "a";
        type Params = P;
        fn stages(&self) -> &'static [&'static str] {
            &["one"]
        }
        fn validate(&self, p: &P) -> Result<(), String> {
            if p.n == 0 { Err("n must be positive".into()) } else { Ok(()) }
        }
        async fn run_stage(
            &self,
            _ctx: &mut dyn StageContext,
            _params: &P,
        ) -> Result<StageOutcome, KindError> {
            Ok(StageOutcome::StageDone)
        }
    }

    struct AlsoA;
    impl JobKind for AlsoA {
        const NAME: &'static str = "a";
        type Params = P;
        fn stages(&self) -> &'static [&'static str] {
            &["x", "x"]
        }
        async fn run_stage(
            &self,
            _ctx: &mut dyn StageContext,
            _params: &P,
        ) -> Result<StageOutcome, KindError> {
            Ok(StageOutcome::StageDone)
        }
    }

    #[test]
    fn duplicate_names_fail_at_build() {
        let err = Registry::builder().kind(A).kind(AlsoA).build().unwrap_err();
        assert_eq!(err, RegistryError::Duplicate("a"));
    }

    #[test]
    fn lookup_check_filter_and_describe() {
        let registry = Registry::builder().kind(A).build().unwrap();
        let a = registry.get("a").unwrap();
        assert!(registry.get("b").is_none());
        assert_eq!(a.check(&json!({"n": 1})), Ok(vec![]));
        assert_eq!(
            a.check(&json!({"n": 0})).unwrap_err().to_string(),
            "invalid params: n must be positive"
        );
        assert!(a.check(&json!({"n": 1, "extra": 1})).is_err());
        assert!(registry.only(&["nope"]).is_err());
        assert_eq!(registry.enabled_names(None).unwrap(), ["a"]);
        assert_eq!(registry.enabled_names(Some(" a ,")).unwrap(), ["a"]);
        assert!(registry.enabled_names(Some("a,b")).is_err());
        assert!(registry.enabled(&["b".to_owned()]).get("a").is_none());
        assert!(registry.only::<&str>(&[]).unwrap().get("a").is_none());
        let described = registry.describe();
        let entry = &described["job_types"][0];
        assert_eq!(entry["type"], "a");
        assert_eq!(entry["stages"], json!(["one"]));
        assert_eq!(entry["params_schema"]["properties"]["n"]["type"], "integer");
        assert_eq!(entry["policy"]["max_runtime_seconds"], 86_400);
        assert_eq!(entry["policy"]["worker"], "StageFunction");
    }

    #[test]
    fn every_kind_enables_all_but_the_opt_in_ones() {
        let registry = Registry::builder().opt_in_kind(Weighed(&[])).kind(A).build().unwrap();
        assert_eq!(registry.names(), ["weighed", "a"]);
        assert_eq!(registry.default_names(), ["a"]);
        assert_eq!(registry.enabled_names(Some("*")).unwrap(), ["a"]);
        assert_eq!(registry.enabled_names(Some(" * ")).unwrap(), ["a"]);
        // An opt-in kind is enabled by naming it; each name once.
        assert_eq!(registry.enabled_names(Some("weighed,*")).unwrap(), ["weighed", "a"]);
        assert_eq!(registry.enabled_names(Some("*,a,weighed,weighed")).unwrap(), ["a", "weighed"]);
        // A list still restricts; unset still means every kind.
        assert_eq!(registry.enabled_names(Some("weighed")).unwrap(), ["weighed"]);
        assert_eq!(registry.enabled_names(None).unwrap(), ["weighed", "a"]);
        assert!(registry.enabled_names(Some("*,c")).is_err());
        assert!(registry.enabled_names(Some("a*")).is_err());
        // Opt-in stays opt-in in a registry built from another, and once filtered.
        assert_eq!(Registry::builder().kinds_of(&registry).build().unwrap().default_names(), ["a"]);
        assert_eq!(registry.only(&["a", "weighed"]).unwrap().default_names(), ["a"]);
        // A kind added later is in `*` with no change to the list.
        let base = Registry::builder().kind(A).build().unwrap();
        let extended = Registry::builder().kinds_of(&base).kind(Weighed(&[])).build().unwrap();
        assert_eq!(base.enabled_names(Some("*")).unwrap(), ["a"]);
        assert_eq!(extended.enabled_names(Some("*")).unwrap(), ["a", "weighed"]);
    }

    #[test]
    fn a_registry_extends_another() {
        let base = Registry::builder().kind(A).build().unwrap();
        assert_eq!(
            Registry::builder().kinds_of(&base).kind(AlsoA).build().unwrap_err(),
            RegistryError::Duplicate("a")
        );
        assert_eq!(Registry::builder().kinds_of(&base).build().unwrap().names(), ["a"]);
    }

    /// Two stages weighed with one weight (and a zero): refused at build.
    struct Weighed(&'static [u32]);
    impl JobKind for Weighed {
        const NAME: &'static str = "weighed";
        type Params = P;
        fn stages(&self) -> &'static [&'static str] {
            &["x", "y"]
        }
        fn stage_weights(&self) -> &'static [u32] {
            self.0
        }
        async fn run_stage(
            &self,
            _ctx: &mut dyn StageContext,
            _params: &P,
        ) -> Result<StageOutcome, KindError> {
            Ok(StageOutcome::StageDone)
        }
    }

    #[test]
    fn stage_weights_are_one_positive_weight_per_stage_or_none() {
        for bad in [&[1][..], &[1, 0], &[1, 2, 3]] {
            let err = Registry::builder().kind(Weighed(bad)).build().unwrap_err();
            assert_eq!(err, RegistryError::BadWeights("weighed"), "{bad:?}");
        }
        for good in [&[][..], &[1, 9]] {
            assert!(Registry::builder().kind(Weighed(good)).build().is_ok(), "{good:?}");
        }
    }

    #[test]
    fn bad_stage_lists_fail_at_build() {
        assert_eq!(
            Registry::builder().kind(AlsoA).build().unwrap_err(),
            RegistryError::BadStages("a")
        );
    }
}

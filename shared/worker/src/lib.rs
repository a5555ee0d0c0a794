//! The public worker API of longhaul: what a job kind is written against.
//!
//! A job kind is a type implementing [`JobKind`]: its name, its ordered stages, its typed
//! params (serde, with a JSON Schema derived by `schemars`, validated by the kind), the
//! uploads it reads (owner-checked by the framework, never by the kind), its [`Policy`] and
//! the code of its stages. A stage gets a [`StageContext`] the framework controls: report
//! progress, save and load a typed [`Checkpoint`], carry a stage's output to the next, stream
//! an input, write the result (keyed by attempt by construction), see the deadline and
//! cancellation. A kind never sees table keys, leases, the bucket layout or the state
//! machine; nothing here names AWS or Lambda.
//!
//! A stage may fan out ([`JobKind::fans_out`]): it splits into [`Shard`]s, each run on its own
//! with its own checkpoint and progress, whose outputs a merge turns into the stage's outcome
//! (see [`fan_out`]).
//!
//! Kinds are collected in a [`Registry`] (`Registry::builder().kind(A).kind(B).build()`),
//! which refuses duplicate names at start-up; the functions look kinds up by name.
//!
//! # Example
//!
//! A one-stage kind that counts to `n`, checkpointing where it is:
//!
//! ```
//! use longhaul_worker::{Checkpoint, JobKind, KindError, StageContext, StageOutcome};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Deserialize, schemars::JsonSchema)]
//! #[serde(deny_unknown_fields)]
//! pub struct CountParams {
//!     /// How far to count.
//!     pub n: u64,
//! }
//!
//! #[derive(Default, Serialize, Deserialize)]
//! struct Counted {
//!     next: u64,
//! }
//!
//! impl Checkpoint for Counted {
//!     const VERSION: u32 = 1;
//! }
//!
//! pub struct Count;
//!
//! impl JobKind for Count {
//!     const NAME: &'static str = "count";
//!     type Params = CountParams;
//!
//!     fn stages(&self) -> &'static [&'static str] {
//!         &["count"]
//!     }
//!
//!     fn validate(&self, params: &CountParams) -> Result<(), String> {
//!         if params.n == 0 { Err("n must be at least 1".into()) } else { Ok(()) }
//!     }
//!
//!     async fn run_stage(
//!         &self,
//!         ctx: &mut dyn StageContext,
//!         params: &CountParams,
//!     ) -> Result<StageOutcome, KindError> {
//!         let mut state: Counted = ctx.resume().await?.unwrap_or_default();
//!         while state.next < params.n {
//!             if ctx.deadline_near() {
//!                 ctx.checkpoint(&state, state.next, Some(params.n)).await?;
//!                 return Ok(StageOutcome::Paused);
//!             }
//!             state.next += 1;
//!             ctx.progress(state.next, Some(params.n)).await?;
//!         }
//!         let body = format!("{{\"counted\":{}}}", state.next).into_bytes();
//!         let result = ctx.write_result("result.json", "application/json", body).await?;
//!         Ok(StageOutcome::Finished(result))
//!     }
//! }
//!
//! let registry = longhaul_worker::Registry::builder().kind(Count).build().unwrap();
//! assert_eq!(registry.get("count").unwrap().stages(), ["count"]);
//! assert!(registry.get("count").unwrap().check(&serde_json::json!({"n": 0})).is_err());
//! ```

pub mod context;
pub mod fan_out;
pub mod message;
pub mod policy;
pub mod registry;
#[cfg(feature = "testing")]
pub mod testing;

pub use context::{
    ByteStream, Checkpoint, MAX_PARTS, MAX_RESULT_NAME_BYTES, MAX_SUMMARY_BYTES, MAX_WAIT,
    MIN_PART_SIZE, ResultRef, ResultUpload, StageContext, StageOutcome, StagedFile, UploadedPart,
    Waited, is_result_name, is_signal_name,
};
pub use fan_out::{
    MAX_SHARD_BYTES, MAX_SHARDS, Shard, ShardCounts, ShardOrder, ShardOutcome, ShardOutput,
};
pub use message::{ErrorClass, KindError, PublicMessage};
pub use policy::{Cadence, Policy, SHARED_WORKER};
pub use registry::{
    DynKind, EVERY_KIND, JobKind, ParamsError, Registry, RegistryBuilder, RegistryError, Undo,
};

/// Re-exported so kinds derive `JsonSchema` against the same version as the registry.
pub use schemars;

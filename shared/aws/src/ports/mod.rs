//! The ports: what the functions' logic needs from the outside world, as small traits.
//!
//! Each AWS adapter of this crate implements the ports of its service ([`JobStore`] the job
//! table's, [`Executions`] the state machine's, …); `longhaul-memory` implements the same ports
//! in memory, keeping the contracts the logic relies on (a conditional write refuses and says
//! why, pages end, a missing item is absent). A function's `Deps` holds its ports as trait
//! objects, so its handler runs unchanged over either: the AWS adapters in Lambda and against
//! the local stack, the in-memory ones in unit tests. One contract test
//! (`longhaul_memory::contract`) runs against both, so they cannot drift.
//!
//! The traits are cut by concern rather than by service, so a function names only what it
//! uses (the cancel function reads jobs and cancels them; it cannot list or claim them); each
//! file holds one concern's ports with the AWS adapter's implementation of them, which
//! delegates to the adapter's inherent methods.

use std::fmt::Debug;

use async_trait::async_trait;

mod attempts;
mod clock;
mod endpoints;
mod executions;
mod invocations;
mod jobs;
mod limits;
mod links;
mod objects;
mod queues;
mod reaping;
mod retention;
mod schedules;
mod secrets;
mod shards;
mod slots;
mod streams;
mod sweeps;
mod uploads;
mod webhooks;

pub use attempts::*;
pub use clock::*;
pub use endpoints::*;
pub use executions::*;
pub use invocations::*;
pub use jobs::*;
pub use limits::*;
pub use links::*;
pub use objects::*;
pub use queues::*;
pub use reaping::*;
pub use retention::*;
pub use schedules::*;
pub use secrets::*;
pub use shards::*;
pub use slots::*;
pub use streams::*;
pub use sweeps::*;
pub use uploads::*;
pub use webhooks::*;

/// Every port can open its connection ahead of the first request (see
/// [`crate::sdk::warm_up`]); in-memory adapters have nothing to open.
#[async_trait]
pub trait Warm: Send + Sync + Debug {
    /// Opens (and pools) the adapter's connection, if it has one. Never fails: a failed
    /// warm-up is logged and the first request connects instead.
    async fn warm(&self) {}
}

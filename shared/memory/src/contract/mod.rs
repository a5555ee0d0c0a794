//! The ports' contracts, each a test that runs against any adapter of its port: this crate's
//! unit tests run them on the in-memory adapters, `tests/tests/contracts.rs` on the AWS
//! adapters against the local stack. What the handlers rely on is written here once, so the
//! two kinds of adapter cannot drift.
//!
//! Every contract works on ids and owners of its own (fresh ones), so it runs beside other
//! tests on a shared table, queue or bucket.

mod attempts;
mod clock;
mod endpoints;
mod jobs;
mod links;
mod objects;
mod outside;
mod pausing;
mod queues;
mod reaping;
mod schedules;
mod secrets;
mod shards;
mod slots;
mod streams;
mod sweeps;

pub use attempts::*;
pub use clock::*;
pub use endpoints::*;
pub use jobs::*;
pub use links::*;
pub use objects::*;
pub use outside::*;
pub use pausing::*;
pub use queues::*;
pub use reaping::*;
pub use schedules::*;
pub use secrets::*;
pub use shards::*;
pub use slots::*;
pub use streams::*;
pub use sweeps::*;

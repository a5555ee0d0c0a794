//! What invokes the functions besides the API: SQS queue pollers, DynamoDB stream mappings
//! (with their event filters), the template's schedules, and EventBridge Scheduler's firing
//! of the schedules the functions create.

pub mod event_sources;
pub mod filter;
pub mod scheduler;
pub mod schedules;
pub mod streams;

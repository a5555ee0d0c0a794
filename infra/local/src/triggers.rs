//! What invokes the functions besides the API: SQS queue pollers, DynamoDB stream mappings
//! (with their event filters) and schedules.

pub mod event_sources;
pub mod filter;
pub mod schedules;
pub mod streams;

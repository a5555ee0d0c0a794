//! Where the functions run: hosted in-process, behind the edge (the AWS endpoint they call,
//! and Lambda's Invoke API) and the HTTP API (with its JWT authorizer).

pub mod edge;
pub mod hosted;
pub mod http_api;
pub mod jwt;
pub mod operations;

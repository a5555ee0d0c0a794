//! What the stack checks and injects around the functions' AWS calls: IAM, as the deployed
//! stack enforces it, and the faults tests ask for.

pub mod faults;
pub mod iam;

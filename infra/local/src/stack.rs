//! The stack itself: the emulator process (moto), the template and the model of the
//! functions read from it, and the resources provisioned in the emulator.

pub mod emulator;
pub mod model;
pub mod provision;
pub mod template;

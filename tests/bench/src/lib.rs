//! Shared bits of the benchmark binaries: where a section of BENCHMARKS.md is written.
//!
//! Each binary in `src/bin/` measures one thing and writes one Markdown section to
//! `target/bench/<name>.md`; `tests/bench/assemble` joins the sections into BENCHMARKS.md.
//! The writer lives in `longhaul_tests::sections`, shared with the end-to-end tests that
//! double as benchmarks at full size.

pub use longhaul_tests::sections::{out_dir, workspace_root, write_section};

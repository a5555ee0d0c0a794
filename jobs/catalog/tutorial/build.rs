//! Writes the Rust blocks of docs/job-types.md, in order, to `$OUT_DIR/word_count.rs`: the
//! tutorial's crate as a reader who copies them gets it. Blocks fenced ```` ```rust ```` are
//! taken; any other fence (```` ```rust,ignore ````, `toml`, `sh`, `json`…) is left out.

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let doc = manifest.join("../../../docs/job-types.md");
    println!("cargo::rerun-if-changed={}", doc.display());
    let text =
        std::fs::read_to_string(&doc).unwrap_or_else(|e| panic!("reading {}: {e}", doc.display()));
    let code = rust_blocks(&text);
    assert!(!code.is_empty(), "{} has no ```rust block", doc.display());
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"));
    std::fs::write(out.join("word_count.rs"), code).expect("writing to OUT_DIR");
}

/// The content of every block fenced ```` ```rust ````, each headed by the doc line it starts
/// at (so that a compiler error can be found in the doc).
fn rust_blocks(text: &str) -> String {
    let mut code = String::new();
    let mut inside: Option<bool> = None; // in a fence; whether it is taken
    for (number, line) in text.lines().enumerate() {
        let fence = line.trim_start();
        match inside {
            None if fence.starts_with("```") => {
                let taken = fence.trim_start_matches('`').trim() == "rust";
                if taken {
                    let _ = writeln!(code, "// docs/job-types.md, line {}", number + 2);
                }
                inside = Some(taken);
            }
            None => {}
            Some(_) if fence.trim_end() == "```" => {
                inside = None;
                code.push('\n');
            }
            Some(true) => {
                code.push_str(line);
                code.push('\n');
            }
            Some(false) => {}
        }
    }
    code
}

//! Where a section of BENCHMARKS.md is written: by the benchmark binaries in `tests/bench`
//! and by the end-to-end tests that double as benchmarks when run at full size (faults.rs).
//! `tests/bench/assemble` joins the sections into BENCHMARKS.md.

use std::path::PathBuf;

/// The directory the sections are written to (`$LONGHAUL_BENCH_OUT`, else `target/bench`).
pub fn out_dir() -> PathBuf {
    std::env::var_os("LONGHAUL_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/bench"))
}

/// The workspace root (the directory above this crate).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("workspace root exists")
}

/// Writes section `name` (Markdown, starting with a `## ` heading) for BENCHMARKS.md, and
/// beside it `<name>.stamp`: the commit (`-dirty` if the tree had uncommitted changes) and
/// date it was measured on (sections can be re-run one at a time, so each says when it was
/// measured, and on what).
pub fn write_section(name: &str, markdown: &str) -> anyhow::Result<PathBuf> {
    let dir = out_dir();
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{name}.md"));
    std::fs::write(&path, markdown)?;
    let commit = std::process::Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=7"])
        .current_dir(workspace_root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    let date = chrono::Utc::now().format("%Y-%m-%d");
    std::fs::write(dir.join(format!("{name}.stamp")), format!("{commit} {date}\n"))?;
    eprintln!("wrote {}", path.display());
    Ok(path)
}

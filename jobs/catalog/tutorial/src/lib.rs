//! The example kind of `docs/job-types.md` ("Adding a job type"), `word_count`, built from the
//! doc itself: `build.rs` writes the doc's ```` ```rust ```` blocks, in order, as this crate's
//! code — what a reader who copies them into `jobs/word_count/src/lib.rs` has — so the tutorial
//! compiles as written and its tests (step 8) run. Blocks fenced ```` ```rust,ignore ```` are
//! excerpts of other files (the catalog's registration, a larger kind's stage) and left out.
//!
//! Not a shipped kind: nothing depends on this crate, and the catalog does not register it.

include!(concat!(env!("OUT_DIR"), "/word_count.rs"));

/// What the tutorial says about the steps outside the crate.
#[cfg(test)]
mod outside_the_crate {
    use std::path::Path;

    use longhaul_worker::{EVERY_KIND, Registry};

    use super::WordCount;

    fn read(relative: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Step 9's one `.kind(…)` line: beside the shipped kinds, and enabled by the template's
    /// default (`*`) with no other change.
    #[test]
    fn one_kind_line_registers_it_and_the_default_enables_it() {
        let registry = Registry::builder()
            .kinds_of(&longhaul_jobs::registry())
            .kind(WordCount)
            .build()
            .expect("word_count registers beside the shipped kinds");
        let enabled = registry.enabled_names(Some(EVERY_KIND)).unwrap();
        assert!(enabled.iter().any(|n| n == "word_count"), "{enabled:?}");
        assert_eq!(registry.get("word_count").unwrap().stages(), ["count", "write"]);
    }

    /// Step 1's `jobs/word_count/Cargo.toml` lists what this crate needed to build the code.
    #[test]
    fn the_docs_manifest_has_this_crates_dependencies() {
        let doc = read("../../../docs/job-types.md");
        let start = doc.find("name = \"longhaul-job-word-count\"").expect("step 1's Cargo.toml");
        let manifest = &doc[start..doc[start..].find("```").map_or(doc.len(), |end| start + end)];
        let own = read("Cargo.toml");
        for section in ["[dependencies]", "[dev-dependencies]"] {
            let documented = dependencies(manifest, section);
            let needed: Vec<&str> = dependencies(&own, section)
                .into_iter()
                .filter(|line| !line.starts_with("longhaul-jobs "))
                .collect();
            assert!(!needed.is_empty(), "{section}");
            assert_eq!(documented, needed, "{section} of step 1's Cargo.toml");
        }
    }

    /// The dependency lines of `section` in a manifest, comments and blank lines left out.
    fn dependencies<'a>(manifest: &'a str, section: &str) -> Vec<&'a str> {
        manifest
            .lines()
            .skip_while(|line| line.trim() != section)
            .skip(1)
            .map(str::trim)
            .take_while(|line| !line.starts_with('['))
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .collect()
    }
}

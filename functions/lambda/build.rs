//! Links the Lambda binary position-dependent (`-no-pie`) on Linux.
//!
//! A position-independent executable is relocated by the dynamic loader at every start: for
//! this binary, some 63,000 relocations over about 2 MB of `.data.rel.ro` and `.got`, each of
//! whose pages is then copied on first write — about 490 of a cold start's 910 page faults,
//! and 1.4 ms of its 4.8 ms (measured side by side; docs/architecture.md, "Cold start").
//! Linked at a fixed address, the binary needs none of that. What it gives up is the
//! randomised load address of its own code and data (shared libraries, heap and stacks stay
//! randomised), a mitigation against memory-corruption exploits in a process that is safe
//! Rust outside its dependencies.
//!
//! The objects stay position-independent (the default relocation model), so this is one
//! linker argument for this binary alone: build scripts, proc macros and tests are untouched.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
    println!("cargo:rerun-if-changed=build.rs");
}

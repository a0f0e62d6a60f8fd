//! Behaviour of the engine host against real plugins: the Rust SDK echo plugin (built by
//! `cargo build`, found beside this test binary) and the C template (compiled here with `cc`).

mod loading;
mod registry;
mod schema;
mod support;
mod validation;

//! Engine worker processes: crash isolation for plugins (spec 000, issue 16).
//!
//! A plugin is native code: a segfault, an abort or the kernel's OOM killer in it would end the
//! process that loaded it. The node therefore runs each loaded model's plugin instance in a
//! worker process of its own and talks to it over a socket pair (`protocol`). A worker that
//! ends fails only the calls it was running; one whose engine stops making progress is ended by
//! the watchdog, its calls failing with TIMEOUT. The node reloads the model in a new worker.
//!
//! - [`WorkerEngine`] (`client.rs`): the node's side, one per loaded model.
//! - [`serve_stdin`] (`worker.rs`): the process's side; `llmr engine-worker` and the
//!   `llmr-engine-worker` binary (tests, benchmarks) both run it.

#![forbid(unsafe_code)]

mod client;
pub mod protocol;
mod worker;

pub use client::{probe, WorkerCommand, WorkerEngine};
pub use worker::{serve, serve_stdin};

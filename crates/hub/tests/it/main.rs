//! The hub client against servers on loopback: the hub mirror (`llmr-hub-mirror`), small axum
//! servers playing a hub that redirects to a CDN, and `llmr pull` against a hand-written hub.

mod client;
mod pull;
mod support;

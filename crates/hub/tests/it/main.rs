//! The hub client against servers on loopback: the hub mirror (`llmr-hub-mirror`) and small
//! axum servers playing a hub that redirects to a CDN.

mod client;
mod support;

//! The Anthropic Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) for llmr, and
//! only that: requests validated into the same domain [`llmr_openai::ChatRequest`] the chat
//! completions endpoint produces (so the node renders, constrains and parses tool calls in one
//! place), the message and stream-event shapes, and Anthropic's error body.
//!
//! Errors are built as [`llmr_openai::ApiError`] like everywhere else; [`error::anthropic_errors`]
//! rewrites them into Anthropic's shape on these routes, in router and node alike.
#![forbid(unsafe_code)]

pub mod error;
mod message;
mod request;

pub use message::*;
pub use request::*;

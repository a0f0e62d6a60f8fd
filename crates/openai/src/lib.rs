//! The OpenAI wire protocol for llmr, and only that: request bodies parsed with located errors,
//! validated into domain requests before any engine work (spec 003 Part 4), and the response,
//! stream-chunk and error shapes, checked against OpenAI's OpenAPI document by the tests.
//!
//! No other crate knows OpenAI JSON (DESIGN.md).
#![forbid(unsafe_code)]

pub mod audio;
mod chat;
mod common;
mod completions;
mod embeddings;
mod error;
mod json;
mod models;
mod response_format;
mod responses;
mod sampling;
pub mod sse;

pub use chat::*;
pub use common::*;
pub use completions::*;
pub use embeddings::*;
pub use error::{error_message, ApiError};
pub use json::parse_body;
pub use models::*;
pub use response_format::{checked_schema, output_constraint, OutputFields};
pub use responses::*;
pub use sampling::*;

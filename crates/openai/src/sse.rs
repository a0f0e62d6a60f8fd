//! Server-sent events as OpenAI streams them: `data: {json}\n\n` per chunk, then `data: [DONE]`.

use crate::ApiError;
use serde::Serialize;

pub const DONE: &str = "data: [DONE]\n\n";

pub fn event<T: Serialize>(chunk: &T) -> String {
    let mut s = String::from("data: ");
    s.push_str(&serde_json::to_string(chunk).expect("chunks serialize"));
    s.push_str("\n\n");
    s
}

/// An error after the stream has started: the status line is already sent, so it travels as an
/// event (the OpenAI SDKs raise it as an `APIError`).
pub fn error_event(err: &ApiError) -> String {
    format!("data: {}\n\n", err.to_json())
}

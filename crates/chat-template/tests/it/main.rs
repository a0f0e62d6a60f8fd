//! Behaviour tests of llmr-chat-template: one binary, one module per concern.

mod conformance;
mod render;

//! `llmr serve` and `llmr node` in process, over the echo plugin and HTTP on loopback.

mod serve;
mod support;

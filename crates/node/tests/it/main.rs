//! The node's behaviour through its public API, with real plugins and HTTP on loopback.

mod agent;
mod benchmark;
mod devices;
mod http;
mod isolation;
mod support;

//! `/v1/responses`, OpenAI's Responses API: the request (items, tools, `text.format`) validated
//! into a domain chat request, and the response object with its typed stream events.
//!
//! Storage (`store`, `previous_response_id`, `GET`/`DELETE /v1/responses/{id}`) is the router's:
//! a node is stateless and answers one request with all of its input.

mod object;
mod request;

pub use object::*;
pub use request::*;

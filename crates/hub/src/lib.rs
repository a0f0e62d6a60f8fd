//! llmr's one client of Hugging Face compatible hubs (huggingface.co, a mirror, `HF_ENDPOINT`),
//! used by the router's registrations, the node's file sync and `llmr pull`. Async (reqwest with
//! rustls); the one blocking caller, the `llmr pull` command, runs it on a runtime of its own.
//!
//! - [`Hub`]: the endpoint and token. The token is never `Debug`-printed and is sent only to
//!   the hub's own origin, never to a server it redirects to (a CDN). Redirects are followed by
//!   hand so that `X-Linked-Size`/`X-Linked-Etag` are read on the hub's own answers; a plain
//!   sha256 `ETag` is trusted only from the hub's origin.
//! - [`Hub::list`]: a repository's files at a revision, with sizes and LFS sha256, pinned to the
//!   commit the hub reports, every path checked to stay inside the repository.
//! - [`Hub::file`]: `{endpoint}/{repo}/resolve/{rev}/{path}`, each segment encoded;
//!   [`Remote::url`] for any other URL.
//! - Reads: [`Hub::head`] (announced size and sha256), [`Hub::read`] (a small file whole),
//!   [`Hub::read_range`], [`Hub::hash`] (size and sha256 of a body, nothing kept).
//! - [`Hub::download`]: the checked, resumable download: a `.partial` file resumed with
//!   `Range`, checked for size and sha256, deleted when proven wrong, renamed into place only
//!   when right.
//! - [`HubError`]: every failure, with the messages callers show (or map, the router into its
//!   HTTP statuses).
//! - [`choose_gguf`] and [`gguf_models`]: which GGUF file of a listing is the model, the rules
//!   `llmr pull` and the router's registrations share.
//! - [`pull`]: `llmr pull`'s logic, where hub and store meet: choose the file, download it,
//!   import it into the [`ModelStore`](llmr_model_store::ModelStore) with its `config.json`.
#![forbid(unsafe_code)]

mod choice;
mod client;
mod download;
mod error;
mod hash;
mod listing;
pub mod pull;

pub use choice::{base_name, choose_gguf, gguf_models, is_gguf_model, GgufChoiceError, PREFERRED_QUANTIZATIONS};

pub use client::{endpoint_from_env, token_from_env, Hub, Known, Remote, DEFAULT_ENDPOINT};
pub use download::{partial_path_for, staging_dir, STAGING_DIR};
pub use error::HubError;
pub use hash::{is_sha256, sha256_file, sha256_hex};
pub use listing::{ListedFile, Listing};
pub use reqwest::Url;

//! What a router is started with.

use crate::cors::CorsOrigins;
use crate::keys::Scope;
use std::path::PathBuf;
use std::time::Duration;

/// OpenAI's retention of stored responses.
pub const DEFAULT_RESPONSES_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

#[derive(Clone, Debug)]
pub struct RouterConfig {
    /// SQLite file (default `~/.llmr/router.db`).
    pub db_path: PathBuf,
    /// `false` only for a loopback-only router (`llmr serve` without a key, tests).
    pub require_auth: bool,
    /// The specs make GPUs a requirement for nodes; CPU nodes are an explicit fallback.
    pub allow_cpu_nodes: bool,
    pub heartbeat_interval: Duration,
    /// Silent this long: unhealthy (no traffic) until the next heartbeat.
    pub heartbeat_timeout: Duration,
    pub body_limit: usize,
    /// Audio uploads (`/v1/audio/transcriptions`, `translations`) may be this large.
    pub audio_body_limit: usize,
    /// Hugging Face compatible hub for registrations (`HF_ENDPOINT`).
    pub hub_endpoint: String,
    pub hf_token: Option<String>,
    /// Process-only keys (secret, name, scopes), e.g. `llmr serve --api-key` and the embedded
    /// node's token.
    pub fixed_keys: Vec<(String, String, Vec<Scope>)>,
    /// Web pages allowed to call the API from a browser.
    pub cors: CorsOrigins,
    /// How long a stored response of `/v1/responses` is kept (OpenAI keeps them 30 days).
    pub responses_retention: Duration,
}

impl RouterConfig {
    pub fn new(db_path: PathBuf) -> Self {
        RouterConfig {
            db_path,
            require_auth: true,
            allow_cpu_nodes: false,
            heartbeat_interval: Duration::from_secs(2),
            heartbeat_timeout: Duration::from_secs(6),
            body_limit: 16 << 20,
            audio_body_limit: llmr_openai::audio::DEFAULT_MAX_AUDIO_BYTES,
            hub_endpoint: llmr_hub::endpoint_from_env(),
            hf_token: llmr_hub::token_from_env(),
            fixed_keys: Vec::new(),
            cors: CorsOrigins::Loopback,
            responses_retention: DEFAULT_RESPONSES_RETENTION,
        }
    }

    pub fn default_db_path() -> Option<PathBuf> {
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".llmr").join("router.db"))
    }
}

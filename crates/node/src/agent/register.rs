//! The router's control-plane client (`/v0`), and registration with retries.
//!
//! Answers are sorted into three kinds: fatal (401/403: the token is wrong; other 4xx: the
//! router refuses what the node sends), "the router forgot this node" (404 on a heartbeat), and
//! transient (no connection, timeouts, 5xx, an unreadable answer), which are retried.

use super::{AgentError, Backoff};
use llmr_cluster::{Heartbeat, HeartbeatAck, ModelManifest, NodeRegistered, NodeRegistration};
use llmr_telemetry::error_chain;
use reqwest::{StatusCode, Url};
use serde::de::DeserializeOwned;
use std::time::Duration;

/// A control-plane call that did not succeed.
#[derive(Debug)]
pub(super) enum CallError {
    Fatal(AgentError),
    /// 404: on a heartbeat, the router does not know this node (it restarted).
    NotFound,
    /// Worth retrying: the message says what happened.
    Transient(String),
}

pub(super) struct RouterClient {
    base: Url,
    token: String,
    http: reqwest::Client,
}

#[derive(serde::Deserialize)]
struct ModelList {
    data: Vec<ModelManifest>,
}

impl RouterClient {
    pub fn new(router: &str, token: &str) -> Result<Self, AgentError> {
        let invalid = |reason: String| AgentError::InvalidRouter { url: router.to_string(), reason };
        let base = Url::parse(router).map_err(|e| invalid(e.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(invalid("not an http(s) URL".into()));
        }
        let http = reqwest::Client::builder()
            .user_agent(concat!("llmr-node/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| invalid(e.to_string()))?;
        Ok(RouterClient { base, token: token.to_string(), http })
    }

    /// The router's URL, as shown in messages.
    pub fn router(&self) -> &str {
        self.base.as_str().trim_end_matches('/')
    }

    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        url.path_segments_mut().expect("checked in new: a base URL").pop_if_empty().extend(segments);
        url
    }

    pub async fn register(&self, registration: &NodeRegistration) -> Result<NodeRegistered, CallError> {
        let request = self.http.post(self.url(&["v0", "nodes"])).json(registration);
        self.call(request, "the node's registration").await
    }

    pub async fn heartbeat(&self, node_id: &str, heartbeat: &Heartbeat) -> Result<HeartbeatAck, CallError> {
        let request = self.http.post(self.url(&["v0", "nodes", node_id, "heartbeat"])).json(heartbeat);
        self.call(request, "a heartbeat").await
    }

    pub async fn models(&self) -> Result<Vec<ModelManifest>, CallError> {
        let list: ModelList = self.call(self.http.get(self.url(&["v0", "models"])), "the model list request").await?;
        Ok(list.data)
    }

    async fn call<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        what: &'static str,
    ) -> Result<T, CallError> {
        let response = request
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| CallError::Transient(format!("{}: {}", self.router(), error_chain(&e.without_url()))))?;
        let status = response.status();
        if status.is_success() {
            return response.json::<T>().await.map_err(|e| {
                CallError::Transient(format!("{}: unreadable answer to {what}: {}", self.router(), error_chain(&e)))
            });
        }
        let message = error_message(&response.text().await.unwrap_or_default());
        let router = self.router().to_string();
        Err(match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                CallError::Fatal(AgentError::Refused { router, status: status.as_u16(), message })
            }
            StatusCode::NOT_FOUND => CallError::NotFound,
            StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS => {
                CallError::Transient(format!("{router}: HTTP {}: {message}", status.as_u16()))
            }
            s if s.is_client_error() => {
                CallError::Fatal(AgentError::Rejected { router, what, status: s.as_u16(), message })
            }
            s => CallError::Transient(format!("{router}: HTTP {}: {message}", s.as_u16())),
        })
    }

    /// Registers, retrying transient failures with exponential backoff until the router
    /// answers (it may start after the node). 401/403 and other refusals end it.
    pub async fn register_until_done(
        &self,
        registration: &NodeRegistration,
        backoff: &Backoff,
    ) -> Result<NodeRegistered, AgentError> {
        let mut delay = backoff.initial;
        loop {
            let problem = match self.register(registration).await {
                Ok(registered) => return Ok(registered),
                Err(CallError::Fatal(e)) => return Err(e),
                Err(CallError::NotFound) => {
                    format!("{}: no /v0/nodes (HTTP 404); is this an llmr router?", self.router())
                }
                Err(CallError::Transient(problem)) => problem,
            };
            tracing::warn!("cannot register with the router ({problem}); retrying in {} ms", delay.as_millis());
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(backoff.max);
        }
    }
}

/// The `message` of an error body (`{"error": {"message": ...}}` or `{"error": "..."}`), else
/// the body itself, shortened.
fn error_message(body: &str) -> String {
    let text = llmr_openai::error_message(body.as_bytes()).unwrap_or_else(|| body.trim().to_string());
    match text.char_indices().nth(300) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None if text.is_empty() => "(no message)".into(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_give_their_message() {
        assert_eq!(error_message(r#"{"error":{"message":"bad token","type":"x"}}"#), "bad token");
        assert_eq!(error_message(r#"{"error":"no scope"}"#), "no scope");
        assert_eq!(error_message("  plain text\n"), "plain text");
        assert_eq!(error_message(""), "(no message)");
        assert_eq!(error_message(&"x".repeat(400)).len(), 303);
    }

    #[test]
    fn urls_keep_the_router_path_and_encode_ids() {
        let c = RouterClient::new("http://r.example:8080/base/", "t").unwrap();
        assert_eq!(
            c.url(&["v0", "nodes", "a/b", "heartbeat"]).as_str(),
            "http://r.example:8080/base/v0/nodes/a%2Fb/heartbeat"
        );
        assert!(matches!(RouterClient::new("ftp://x", "t"), Err(AgentError::InvalidRouter { .. })));
    }
}

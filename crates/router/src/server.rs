//! The router as a value: opened from its configuration, its route table, serving, and the
//! handlers of the routes that are neither `/v1` nor `/v0` (`/health`, `/metrics`, fallbacks).

use crate::config::RouterConfig;
use crate::state::{EmbeddedNode, RouterState};
use crate::{admin, auth, gateway, metrics as m, responses};
use anyhow::Result;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Json;
use llmr_openai::ApiError;
use llmr_telemetry::request_id;
use std::future::Future;
use std::sync::Arc;

pub struct Router {
    state: Arc<RouterState>,
}

impl Router {
    /// Opens (creating and migrating) the database and loads keys and registered models.
    pub fn open(config: RouterConfig) -> Result<Router> {
        m::install();
        Ok(Router { state: Arc::new(RouterState::open(config)?) })
    }

    pub fn state(&self) -> &Arc<RouterState> {
        &self.state
    }

    /// Makes `/health` and `/metrics` cover the node running in this process (once).
    pub fn embed_node(&self, node: EmbeddedNode) {
        self.state.embed(node);
    }

    pub fn app(&self) -> axum::Router {
        let s = self.state.clone();
        let v1 = axum::Router::new()
            .route("/chat/completions", post(gateway::chat))
            .route("/completions", post(gateway::completions))
            .route("/embeddings", post(gateway::embeddings))
            .route("/responses", post(responses::create))
            .route("/responses/{id}", get(responses::retrieve).delete(responses::delete))
            .route("/responses/{id}/input_items", get(responses::input_items_list))
            .route("/models", get(gateway::list_models))
            .route("/models/{*id}", get(gateway::get_model))
            .route_layer(middleware::from_fn_with_state(s.clone(), auth::api));
        // Anthropic's Messages API: its errors (authentication's and the gateway's too) in
        // Anthropic's shape.
        let anthropic = axum::Router::new()
            .route("/messages", post(gateway::messages))
            .route("/messages/count_tokens", post(gateway::count_tokens))
            .route_layer(middleware::from_fn_with_state(s.clone(), auth::api))
            .route_layer(middleware::from_fn(llmr_anthropic::error::anthropic_errors));
        // Audio uploads have a limit of their own (OpenAI's 25 MiB by default).
        let audio = axum::Router::new()
            .route("/audio/transcriptions", post(gateway::transcriptions))
            .route("/audio/translations", post(gateway::translations))
            .route("/audio/speech", post(gateway::speech))
            .route_layer(middleware::from_fn_with_state(s.clone(), auth::api))
            .layer(DefaultBodyLimit::max(s.config.audio_body_limit));
        let node_calls = axum::Router::new()
            .route("/nodes", post(admin::register_node))
            .route("/nodes/{id}/heartbeat", post(admin::heartbeat))
            .route("/models", get(admin::list_manifests))
            .route("/models/registry/{*path}", get(admin::manifest))
            .route_layer(middleware::from_fn_with_state(s.clone(), auth::node));
        let admin_calls = axum::Router::new()
            .route("/models", post(admin::register_model))
            .route("/models/{*name}", delete(admin::delete_model))
            .route("/nodes", get(admin::list_nodes))
            .route("/engines", get(admin::list_engines))
            .route("/nodes/{id}", delete(admin::delete_node))
            .route("/keys", get(admin::list_keys).post(admin::create_key))
            .route("/keys/{id}", delete(admin::revoke_key))
            .route_layer(middleware::from_fn_with_state(s.clone(), auth::admin));
        axum::Router::new()
            .nest("/v1", v1.merge(anthropic).merge(audio))
            .nest("/v0", node_calls.merge(admin_calls))
            .route("/health", get(health))
            .route("/metrics", get(metrics))
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .layer(DefaultBodyLimit::max(s.config.body_limit))
            // Outside authentication: a browser's preflight carries no key.
            .layer(s.config.cors.layer())
            // Outermost, so every answer (fallbacks and auth refusals too) carries `x-request-id`.
            .layer(request_id::RequestIdLayer)
            .with_state(s)
    }

    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        axum::serve(listener, self.app()).with_graceful_shutdown(shutdown).await?;
        Ok(())
    }
}

async fn health(State(s): State<Arc<RouterState>>) -> Response {
    let nodes = s.nodes.all();
    let healthy = nodes.iter().filter(|n| n.is_healthy(s.nodes.heartbeat_timeout)).count();
    let mut body = serde_json::json!({
        "status": "ok",
        "nodes": nodes.len(),
        "nodes_healthy": healthy,
        "models_registered": s.registered().len(),
    });
    if let (Some(node), Some(fields)) = (s.embedded(), body.as_object_mut()) {
        if let serde_json::Value::Object(extra) = (node.health)() {
            fields.extend(extra.into_iter().filter(|(k, _)| k != "status"));
        }
    }
    Json(body).into_response()
}

async fn metrics(State(s): State<Arc<RouterState>>) -> Response {
    if let Some(node) = s.embedded() {
        (node.refresh_metrics)();
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], m::render(&s.nodes)).into_response()
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(format!("no route for {} {}", req.method(), req.uri().path()))
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::with_status(405, format!("{} is not allowed on {}", req.method(), req.uri().path()))
}

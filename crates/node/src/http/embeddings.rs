//! `POST /v1/embeddings`.

use super::pipeline::{self, record_model};
use super::{parse_json, SharedState};
use crate::error::NodeError;
use crate::metrics as m;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use llmr_engine_host::Capability;
use llmr_openai::{ApiError, EmbeddingList, EmbeddingObject, EmbeddingRequest, EmbeddingUsage, EmbeddingValue};
use llmr_telemetry::RequestId;
use std::sync::atomic::{AtomicU64, Ordering};

const ENDPOINT: &str = "embeddings";

/// Embedding request ids live in their own range so they never collide with generations'.
static NEXT_ID: AtomicU64 = AtomicU64::new(1 << 62);

pub async fn handle(State(state): State<SharedState>, id: RequestId, body: Result<Bytes, BytesRejection>) -> Response {
    pipeline::respond(ENDPOINT, &id, async {
        let req = parse_json::<EmbeddingRequest>(body, state.body_limit)?.validate()?;
        let model = state.models.get(&req.model).await?;
        record_model(&model);
        // Counted once the model is known: request JSON must not create metric series.
        metrics::counter!(m::REQUESTS, "endpoint" => ENDPOINT, "model" => model.name.clone()).increment(1);
        model.require(Capability::Embedding)?;
        let permit = model.admission.admit().await?;
        let request_id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let inputs = req.inputs.clone();
        let engine_model = model.clone();
        let (vectors, prompt_tokens) = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
            let mut vectors: Vec<Vec<f32>> = vec![Vec::new(); refs.len()];
            let tokens = engine_model.engine.embed(request_id, &refs, true, &mut |i, v| {
                if let Some(slot) = vectors.get_mut(i) {
                    *slot = v.to_vec();
                }
                true
            })?;
            Ok::<_, NodeError>((vectors, tokens))
        })
        .await
        .map_err(|e| NodeError::Internal(format!("embedding panicked: {e}")))??;
        let mut data = Vec::with_capacity(vectors.len());
        for (i, mut v) in vectors.into_iter().enumerate() {
            if let Some(d) = req.dimensions {
                if d > v.len() {
                    return Err(ApiError::invalid(
                        "dimensions",
                        format!("{d} is more than the model's {} dimensions", v.len()),
                    ));
                }
                // Shortened embeddings are re-normalized, as OpenAI's are.
                v.truncate(d);
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                if norm > 0.0 {
                    v.iter_mut().for_each(|x| *x /= norm);
                }
            }
            data.push(EmbeddingObject {
                object: "embedding".into(),
                index: i as u32,
                embedding: EmbeddingValue::encode(v, req.format),
            });
        }
        let list = EmbeddingList {
            object: "list".into(),
            data,
            model: model.name.clone(),
            usage: EmbeddingUsage { prompt_tokens, total_tokens: prompt_tokens },
        };
        Ok(Json(list).into_response())
    })
    .await
}

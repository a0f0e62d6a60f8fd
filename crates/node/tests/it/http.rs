//! The node's HTTP behaviour in process: requests go through `Node::router()` with
//! `tower::ServiceExt::oneshot` (no listener), over the real echo plugin (which echoes the
//! prompt word by word, so answers are known exactly).

use crate::support::{echo_engines, gguf, wait_until};
use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::response::Response;
use futures_util::StreamExt;
use llmr_model_store::ModelDescriptor;
use llmr_node::{Node, NodeConfig};
use llmr_openai::{
    ChatCompletion, ChatCompletionChunk, ChunkChoice, EmbeddingList, EmbeddingValue, FinishReason, Role, TextCompletion,
};
use serde_json::{json, Value};
use tower::ServiceExt;

struct TestNode {
    node: Node,
    _dir: tempfile::TempDir,
}

/// A node serving one echo model named `name`; `delay_ms` between generated tokens.
fn node_with(name: &str, delay_ms: u64, config: impl FnOnce(&mut NodeConfig)) -> TestNode {
    let dir = tempfile::tempdir().unwrap();
    let engines = echo_engines(&dir.path().join("engines"), delay_ms);
    let model = dir.path().join(format!("{name}.gguf"));
    std::fs::write(&model, gguf("echo", 64)).unwrap();
    let mut desc = ModelDescriptor::from_gguf_file(&model).unwrap();
    desc.name = name.to_owned();
    let mut c = NodeConfig { engines_dir: engines, models: vec![desc], cache_bytes: Some(0), ..NodeConfig::default() };
    config(&mut c);
    TestNode { node: Node::new(c).unwrap(), _dir: dir }
}

fn node(name: &str) -> TestNode {
    node_with(name, 0, |_| {})
}

fn post(path: &str, body: Value) -> Request<Body> {
    Request::post(path).header(header::CONTENT_TYPE, "application/json").body(Body::from(body.to_string())).unwrap()
}

async fn call(node: &TestNode, req: Request<Body>) -> Response {
    node.node.router().oneshot(req).await.unwrap()
}

async fn body_json<T: serde::de::DeserializeOwned>(resp: Response) -> T {
    let bytes = axum::body::to_bytes(resp.into_body(), 16 << 20).await.unwrap();
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes)))
}

/// The `data:` payloads of an SSE body, in order.
async fn events(resp: Response) -> Vec<String> {
    assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream; charset=utf-8");
    let bytes = axum::body::to_bytes(resp.into_body(), 16 << 20).await.unwrap();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(text.ends_with("\n\n"), "{text:?}");
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap_or_else(|| panic!("not a data event: {e:?}")).to_owned())
        .collect()
}

async fn error_of(resp: Response) -> (StatusCode, Value) {
    let status = resp.status();
    assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
    (status, body_json::<Value>(resp).await["error"].clone())
}

fn chat(model: &str, text: &str, extra: Value) -> Value {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": text}]});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

#[tokio::test]
async fn a_chat_answer_is_the_same_streamed_or_not() {
    let n = node("echo-chat");
    let resp = call(&n, post("/v1/chat/completions", chat("echo-chat", "hi there", json!({"max_tokens": 3})))).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let whole: ChatCompletion = body_json(resp).await;
    assert_eq!((whole.object.as_str(), whole.model.as_str()), ("chat.completion", "echo-chat"));
    let choice = &whole.choices[0];
    assert_eq!((choice.message.role, choice.finish_reason), (Role::Assistant, FinishReason::Length));
    // The echo engine repeats the rendered (ChatML) prompt.
    assert_eq!(choice.message.content.as_deref(), Some("<|im_start|>user hi there<|im_end|>"));
    let usage = whole.usage.unwrap();
    assert_eq!((usage.completion_tokens, usage.total_tokens), (3, usage.prompt_tokens + 3));

    let extra = json!({"max_tokens": 3, "stream": true, "stream_options": {"include_usage": true}});
    let data = events(call(&n, post("/v1/chat/completions", chat("echo-chat", "hi there", extra))).await).await;
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<ChatCompletionChunk> =
        data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    assert_eq!(chunks[0].choices[0].delta.role, Some(Role::Assistant));
    let text: String = chunks.iter().filter_map(|c| c.choices.first()?.delta.content.clone()).collect();
    assert_eq!(Some(text.as_str()), choice.message.content.as_deref());
    let finish: Vec<FinishReason> = chunks.iter().filter_map(|c| c.choices.first()?.finish_reason).collect();
    assert_eq!(finish, [FinishReason::Length]);
    let last = chunks.last().unwrap();
    assert!(last.choices.is_empty(), "the usage chunk has no choices");
    assert_eq!(last.usage, Some(usage));
    assert!(chunks.iter().all(|c| c.id == chunks[0].id && c.object == "chat.completion.chunk"));
}

#[tokio::test]
async fn completions_echo_the_prompt_and_offset_their_logprobs() {
    let n = node("echo-text");
    let body = json!({"model": "echo-text", "prompt": "one two three", "echo": true, "logprobs": 2, "max_tokens": 5});
    let done: TextCompletion = body_json(call(&n, post("/v1/completions", body.clone())).await).await;
    let choice = &done.choices[0];
    // BOS is added to a raw prompt: 3 words + 1; all three words come back, so it stopped.
    assert_eq!((choice.text.as_str(), choice.finish_reason), ("one two threeone two three", Some(FinishReason::Stop)));
    let lp = choice.logprobs.as_ref().unwrap();
    assert_eq!(lp.tokens, ["one", " two", " three"]);
    assert_eq!(lp.text_offset, [13, 16, 20], "offsets count the echoed prompt");
    assert_eq!(lp.top_logprobs[0].len(), 2);
    assert_eq!(done.usage.unwrap().prompt_tokens, 4);

    let mut streamed = body;
    streamed["stream"] = json!(true);
    let data = events(call(&n, post("/v1/completions", streamed)).await).await;
    let chunks: Vec<TextCompletion> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let text: String = chunks.iter().map(|c| c.choices[0].text.as_str()).collect();
    assert_eq!(text, choice.text);
    let offsets: Vec<usize> =
        chunks.iter().filter_map(|c| c.choices[0].logprobs.as_ref()).flat_map(|l| l.text_offset.clone()).collect();
    assert_eq!(offsets, lp.text_offset);
}

#[tokio::test]
async fn embeddings_are_normalized_and_shortened_on_request() {
    let n = node("echo-embed");
    let body = json!({"model": "echo-embed", "input": ["a b", "c"], "dimensions": 8});
    let list: EmbeddingList = body_json(call(&n, post("/v1/embeddings", body)).await).await;
    assert_eq!(list.data.len(), 2);
    for item in &list.data {
        let EmbeddingValue::Float(v) = &item.embedding else { panic!("floats were asked for") };
        assert_eq!(v.len(), 8);
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!(norm == 0.0 || (norm - 1.0).abs() < 1e-5, "{norm}");
    }
    assert_eq!(list.usage.prompt_tokens, 3);
    let (status, e) = error_of(
        call(&n, post("/v1/embeddings", json!({"model": "echo-embed", "input": "a", "dimensions": 65}))).await,
    )
    .await;
    assert_eq!((status, e["param"].as_str()), (StatusCode::BAD_REQUEST, Some("dimensions")));
}

#[tokio::test]
async fn bad_requests_get_the_status_and_name_the_field() {
    let n = node("echo-errors");
    let long_prompt = "word ".repeat(5000);
    // (request, status, param, code)
    type Case = (Request<Body>, StatusCode, Option<&'static str>, Option<&'static str>);
    let cases: Vec<Case> = vec![
        (
            post("/v1/chat/completions", chat("nope", "hi", json!({}))),
            StatusCode::NOT_FOUND,
            Some("model"),
            Some("model_not_found"),
        ),
        (
            post("/v1/chat/completions", chat("echo-errors", "hi", json!({"temperature": 3}))),
            StatusCode::BAD_REQUEST,
            Some("temperature"),
            None,
        ),
        (
            post("/v1/chat/completions", chat("echo-errors", "hi", json!({"top_k": 40000}))),
            StatusCode::BAD_REQUEST,
            Some("top_k"),
            None,
        ),
        (
            post("/v1/completions", json!({"model": "echo-errors", "prompt": "x", "logprobs": 9})),
            StatusCode::BAD_REQUEST,
            Some("logprobs"),
            None,
        ),
        (
            Request::post("/v1/chat/completions").body(Body::from("{\"model\": \"m\",\n \"messages\": [}")).unwrap(),
            StatusCode::BAD_REQUEST,
            None,
            None,
        ),
        (
            post(
                "/v1/chat/completions",
                chat("echo-errors", "hi", json!({"response_format": {"type": "json_schema"}})),
            ),
            StatusCode::BAD_REQUEST,
            Some("response_format.json_schema"),
            None,
        ),
        // The echo engine has no constrained decoding: a 400 on the field, never free text
        // where JSON was asked for.
        (
            post(
                "/v1/chat/completions",
                chat("echo-errors", "hi", json!({"response_format": {"type": "json_object"}})),
            ),
            StatusCode::BAD_REQUEST,
            Some("response_format"),
            None,
        ),
        (
            post(
                "/v1/completions",
                json!({"model": "echo-errors", "prompt": "x", "stream": true,
                       "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {}}}}),
            ),
            StatusCode::BAD_REQUEST,
            Some("response_format.json_schema.schema"),
            None,
        ),
        // Token ids for an engine without token input: the client's to change, on the field.
        (
            post("/v1/completions", json!({"model": "echo-errors", "prompt": [1, 2]})),
            StatusCode::BAD_REQUEST,
            Some("prompt"),
            None,
        ),
        (
            post("/v1/embeddings", json!({"model": "echo-errors", "input": [[1, 2]]})),
            StatusCode::BAD_REQUEST,
            Some("input"),
            None,
        ),
        (Request::get("/v1/chat/completions").body(Body::empty()).unwrap(), StatusCode::METHOD_NOT_ALLOWED, None, None),
        (Request::get("/v2/nothing").body(Body::empty()).unwrap(), StatusCode::NOT_FOUND, None, None),
    ];
    for (req, status, param, code) in cases {
        let what = format!("{} {}", req.method(), req.uri());
        let (got, e) = error_of(call(&n, req).await).await;
        assert_eq!((got, e["param"].as_str(), e["code"].as_str()), (status, param, code), "{what}: {e}");
        assert!(!e["message"].as_str().unwrap().is_empty(), "{what}");
    }
    // Over the context (4096 tokens for the echo model): both numbers, OpenAI's code.
    let n = node("echo-context");
    let (status, e) =
        error_of(call(&n, post("/v1/completions", json!({"model": "echo-context", "prompt": long_prompt}))).await)
            .await;
    assert_eq!(
        (status, e["param"].as_str(), e["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("prompt"), Some("context_length_exceeded"))
    );
    assert!(e["message"].as_str().unwrap().contains("4096"), "{e}");
    // A body over the limit is a 413 that closes the connection (the rest is never read).
    let n = node_with("echo-limit", 0, |c| c.body_limit = 1024);
    let resp = call(&n, post("/v1/chat/completions", chat("echo-limit", &"x".repeat(2000), json!({})))).await;
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(resp.headers()[header::CONNECTION], "close");
}

#[tokio::test]
async fn an_engine_failure_before_the_first_token_is_a_plain_error_even_when_streamed() {
    let n = node("echo-panic");
    let body = chat("echo-panic", "please PANIC_IN_INFER now", json!({"stream": true}));
    let (status, e) = error_of(call(&n, post("/v1/chat/completions", body)).await).await;
    assert_eq!((status, e["type"].as_str()), (StatusCode::INTERNAL_SERVER_ERROR, Some("server_error")));
    assert!(e["message"].as_str().unwrap().contains("panicked"), "{e}");
    // The node is unharmed.
    let ok = call(&n, post("/v1/chat/completions", chat("echo-panic", "hi", json!({})))).await;
    assert_eq!(ok.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_full_queue_is_refused_and_a_client_that_leaves_frees_its_slot() {
    let n = node_with("echo-busy", 50, |c| {
        c.slots = 1;
        c.queue_limit = 0;
    });
    // A long streamed answer holds the only slot.
    let words = "w ".repeat(200);
    let resp = call(
        &n,
        post("/v1/completions", json!({"model": "echo-busy", "prompt": words, "max_tokens": 200, "stream": true})),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut stream = resp.into_body().into_data_stream();
    assert!(stream.next().await.unwrap().unwrap().starts_with(b"data: "));
    let resp = call(&n, post("/v1/completions", json!({"model": "echo-busy", "prompt": "x"}))).await;
    assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
    let (status, e) = error_of(resp).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{e}");
    assert!(e["message"].as_str().unwrap().contains("1 requests running and 0 queued"), "{e}");
    // The client goes away: the slot is freed within a decode step, and the next request runs.
    drop(stream);
    let models = n.node.models().clone();
    wait_until(60, "the slot is free", || models.loaded().iter().all(|m| m.admission.busy() == 0)).await;
    let resp = call(&n, post("/v1/completions", json!({"model": "echo-busy", "prompt": "x y", "max_tokens": 1}))).await;
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn request_ids_are_kept_or_made_and_come_back_on_errors_too() {
    let n = node("echo-ids");
    let mut req = post("/v1/chat/completions", chat("echo-ids", "hi", json!({})));
    req.headers_mut().insert("x-request-id", "client-chose-this".parse().unwrap());
    assert_eq!(call(&n, req).await.headers()["x-request-id"], "client-chose-this");
    let made = call(&n, post("/v1/chat/completions", chat("nope", "hi", json!({})))).await;
    assert_eq!(made.status(), StatusCode::NOT_FOUND);
    let id = made.headers()["x-request-id"].to_str().unwrap();
    assert!(id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
}

#[tokio::test]
async fn api_keys_guard_v1_and_nothing_else() {
    let n = node_with("echo-keys", 0, |c| c.api_keys = vec!["secret".into()]);
    let (status, e) = error_of(call(&n, Request::get("/v1/models").body(Body::empty()).unwrap()).await).await;
    assert_eq!((status, e["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("invalid_api_key")));
    let authorized =
        Request::get("/v1/models").header(header::AUTHORIZATION, "Bearer secret").body(Body::empty()).unwrap();
    let list: Value = body_json(call(&n, authorized).await).await;
    assert_eq!(list["data"][0]["id"], "echo-keys");
    // What the model serves, read from its files (a GGUF of a causal architecture: text).
    assert_eq!(list["data"][0]["capabilities"], json!(["text"]));
    let by_header = Request::get("/v1/models/echo-keys").header("x-api-key", "secret").body(Body::empty()).unwrap();
    let one = call(&n, by_header).await;
    assert_eq!(one.status(), StatusCode::OK);
    assert_eq!(body_json::<Value>(one).await["capabilities"], json!(["text"]));
    assert_eq!(call(&n, Request::get("/health").body(Body::empty()).unwrap()).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_repeated_greedy_request_is_answered_from_the_cache() {
    let n = node_with("echo-cached", 0, |c| c.cache_bytes = Some(1 << 20));
    let body = chat("echo-cached", "same question", json!({"temperature": 0, "max_tokens": 4}));
    let first: ChatCompletion = body_json(call(&n, post("/v1/chat/completions", body.clone())).await).await;
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let data = events(call(&n, post("/v1/chat/completions", streamed)).await).await;
    let text: String = data[..data.len() - 1]
        .iter()
        .filter_map(|d| serde_json::from_str::<ChatCompletionChunk>(d).unwrap().choices.first()?.delta.content.clone())
        .collect();
    assert_eq!(Some(text.as_str()), first.choices[0].message.content.as_deref());
    let metrics = call(&n, Request::get("/metrics").body(Body::empty()).unwrap()).await;
    let text = String::from_utf8(axum::body::to_bytes(metrics.into_body(), 1 << 20).await.unwrap().to_vec()).unwrap();
    assert!(text.lines().any(|l| l == "llmr_generation_cache_hits_total{model=\"echo-cached\"} 1"), "{text}");
}

/// The `event:` names and JSON payloads of an Anthropic-style SSE body.
async fn named_events(resp: Response) -> Vec<(String, Value)> {
    assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream; charset=utf-8");
    let bytes = axum::body::to_bytes(resp.into_body(), 16 << 20).await.unwrap();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (name, data) = e.split_once('\n').unwrap_or_else(|| panic!("{e:?}"));
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            (name.strip_prefix("event: ").unwrap().to_owned(), data)
        })
        .collect()
}

#[tokio::test]
async fn a_stop_sequence_that_ends_a_message_is_named_in_its_stop_reason() {
    let n = node("echo-stops");
    // The echo engine repeats the rendered prompt: `<|im_start|>system sys<|im_end|> <|im_start|>user hi`.
    let body = json!({"model": "echo-stops", "max_tokens": 20, "system": "sys", "stop_sequences": ["never", "user"],
        "messages": [{"role": "user", "content": "hi"}]});
    let whole: Value = body_json(call(&n, post("/v1/messages", body.clone())).await).await;
    assert_eq!((whole["stop_reason"].as_str(), whole["stop_sequence"].as_str()), (Some("stop_sequence"), Some("user")));
    assert_eq!(whole["content"][0]["text"], "<|im_start|>system sys<|im_end|> <|im_start|>", "cut before it");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = named_events(call(&n, post("/v1/messages", streamed)).await).await;
    let (_, delta) = &events[events.len() - 2];
    assert_eq!(delta["delta"], json!({"stop_reason": "stop_sequence", "stop_sequence": "user"}));
    // Ended by the model (here: all its words said), not by a stop: `end_turn` and no sequence.
    let mut unmatched = body.clone();
    unmatched["stop_sequences"] = json!(["never"]);
    unmatched["max_tokens"] = json!(100);
    let whole: Value = body_json(call(&n, post("/v1/messages", unmatched)).await).await;
    assert_eq!((whole["stop_reason"].as_str(), whole["stop_sequence"].as_str()), (Some("end_turn"), None));
}

#[tokio::test]
async fn anthropic_messages_stream_the_same_answer_and_fail_in_anthropics_shape() {
    let n = node_with("echo-claude", 0, |c| c.api_keys = vec!["secret".into()]);
    let keyed = |path: &str, body: Value| {
        let mut req = post(path, body);
        req.headers_mut().insert("x-api-key", "secret".parse().unwrap());
        req
    };
    let body = json!({"model": "echo-claude", "max_tokens": 3, "system": "sys",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi there"}]}]});
    let resp = call(&n, keyed("/v1/messages", body.clone())).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers().contains_key("request-id"));
    let whole: Value = body_json(resp).await;
    assert_eq!((whole["type"].as_str(), whole["stop_reason"].as_str()), (Some("message"), Some("max_tokens")));
    let text = whole["content"][0]["text"].as_str().unwrap().to_owned();
    assert_eq!(
        text, "<|im_start|>system sys<|im_end|> <|im_start|>user",
        "the echo engine repeats the rendered prompt"
    );
    let counted: Value = body_json(call(&n, keyed("/v1/messages/count_tokens", body.clone())).await).await;
    assert_eq!(counted["input_tokens"], whole["usage"]["input_tokens"]);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = named_events(call(&n, keyed("/v1/messages", streamed)).await).await;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(&names[names.len() - 3..], ["content_block_stop", "message_delta", "message_stop"]);
    assert!(events.iter().all(|(name, data)| data["type"] == name.as_str()));
    let deltas: String = events
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, text);
    assert_eq!(events[0].1["message"]["usage"]["input_tokens"], whole["usage"]["input_tokens"]);
    let (_, delta) = &events[events.len() - 2];
    assert_eq!(
        (delta["delta"]["stop_reason"].as_str(), delta["usage"]["output_tokens"].as_u64()),
        (Some("max_tokens"), Some(3))
    );

    // Errors, authentication's included, in Anthropic's shape, naming the field.
    let shape = |v: &Value| (v["type"].as_str().map(str::to_owned), v["error"]["type"].as_str().map(str::to_owned));
    let unkeyed = call(&n, post("/v1/messages", body.clone())).await;
    assert_eq!(unkeyed.status(), StatusCode::UNAUTHORIZED);
    let v: Value = body_json(unkeyed).await;
    assert_eq!(shape(&v), (Some("error".into()), Some("authentication_error".into())));
    let bad = json!({"model": "echo-claude", "max_tokens": 3,
        "messages": [{"role": "user", "content": [{"type": "hologram"}]}]});
    let resp = call(&n, keyed("/v1/messages", bad)).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let v: Value = body_json(resp).await;
    assert_eq!(shape(&v), (Some("error".into()), Some("invalid_request_error".into())));
    assert!(v["error"]["message"].as_str().unwrap().starts_with("messages[0].content[0].type"), "{v}");
    let missing = call(
        &n,
        keyed(
            "/v1/messages",
            json!({"model": "nope", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}),
        ),
    )
    .await;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    assert_eq!(shape(&body_json(missing).await), (Some("error".into()), Some("not_found_error".into())));
}

#[tokio::test]
async fn a_node_keeps_no_responses_and_says_so() {
    let n = node("echo-resp");
    let body = json!({"model": "echo-resp", "input": "hi there", "max_output_tokens": 2});
    let r: Value = body_json(call(&n, post("/v1/responses", body.clone())).await).await;
    assert_eq!((r["object"].as_str(), r["status"].as_str()), (Some("response"), Some("incomplete")));
    assert_eq!(r["store"], false, "straight to a node, nothing is stored");
    assert_eq!(r["output"][0]["content"][0]["text"], "<|im_start|>user hi");
    let mut chained = body.clone();
    chained["previous_response_id"] = json!("resp_1");
    let (status, e) = error_of(call(&n, post("/v1/responses", chained.clone())).await).await;
    assert_eq!((status, e["param"].as_str()), (StatusCode::BAD_REQUEST, Some("previous_response_id")));
    // The router resolves `previous_response_id` and stores: it says so with its header.
    let mut req = post("/v1/responses", chained);
    req.headers_mut().insert("x-llmr-response-store", "1".parse().unwrap());
    let r: Value = body_json(call(&n, req).await).await;
    assert_eq!((r["store"].as_bool(), r["previous_response_id"].as_str()), (Some(true), Some("resp_1")));
}

#[tokio::test]
async fn a_final_assistant_message_is_continued_when_asked() {
    let n = node("echo-prefill");
    let messages = json!([{"role": "user", "content": "pick"}, {"role": "assistant", "content": "I pick"}]);
    let answer = |extra: Value| {
        let mut body = json!({"model": "echo-prefill", "messages": messages, "max_tokens": 50});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let n = &n;
        async move {
            let whole: ChatCompletion = body_json(call(n, post("/v1/chat/completions", body)).await).await;
            whole.choices[0].message.content.clone().unwrap()
        }
    };
    // The echo engine repeats the prompt: its end shows how the conversation was rendered.
    let continued = answer(json!({"continue_final_message": true, "add_generation_prompt": false})).await;
    assert!(continued.ends_with("<|im_start|>assistant I pick"), "{continued}");
    let answered = answer(json!({})).await;
    assert!(answered.ends_with("I pick<|im_end|> <|im_start|>assistant"), "{answered}");
    let raw = answer(json!({"add_generation_prompt": false})).await;
    assert!(raw.ends_with("I pick<|im_end|>"), "{raw}");
}

/// A template that writes `</think>` (so its model reasons) and opens the thinking in its
/// generation prompt, as DeepSeek-R1's do.
const THINKING_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }} {% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think> {% endif %}{{ m.content }}<|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant <think>{% endif %}";

/// A node serving `echo-think`: the echo engine with [`THINKING_TEMPLATE`] as its template.
fn thinking_node() -> TestNode {
    node_with("echo-think", 0, |c| {
        let manifest = c.engines_dir.join("echo/cpu/manifest.json");
        let mut m: Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
        m["parameters"]["chat_template"] = json!(THINKING_TEMPLATE);
        std::fs::write(&manifest, serde_json::to_vec(&m).unwrap()).unwrap();
    })
}

#[tokio::test]
async fn a_reasoning_models_thinking_is_split_from_its_answer_on_every_api() {
    let n = thinking_node();
    // The echo engine repeats the prompt, which leaves it inside `<think>`: its first words are
    // thinking until the user's own `</think>`, the rest is the answer.
    let user = "plan</think>answer";
    let thinking = "<|im_start|>user plan";
    let whole: Value =
        body_json(call(&n, post("/v1/chat/completions", chat("echo-think", user, json!({"max_tokens": 3})))).await)
            .await;
    let message = &whole["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], thinking);
    assert_eq!(message["content"], "answer<|im_end|> <|im_start|>assistant");

    let data = events(
        call(&n, post("/v1/chat/completions", chat("echo-think", user, json!({"max_tokens": 3, "stream": true}))))
            .await,
    )
    .await;
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let joined = |field: &str| -> String {
        chunks.iter().filter_map(|c| c["choices"].get(0)?["delta"][field].as_str().map(str::to_owned)).collect()
    };
    assert_eq!(joined("reasoning_content"), thinking);
    assert_eq!(joined("content"), "answer<|im_end|> <|im_start|>assistant");

    // Anthropic: a thinking block, then the text.
    let body = json!({"model": "echo-think", "max_tokens": 3, "messages": [{"role": "user", "content": user}]});
    let m: Value = body_json(call(&n, post("/v1/messages", body.clone())).await).await;
    assert_eq!(m["content"][0], json!({"type": "thinking", "thinking": thinking, "signature": ""}));
    assert_eq!(m["content"][1]["text"], "answer<|im_end|> <|im_start|>assistant");
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let events = named_events(call(&n, post("/v1/messages", streamed)).await).await;
    let thinking_deltas: String =
        events.iter().filter_map(|(_, d)| d["delta"]["thinking"].as_str().map(str::to_owned)).collect();
    assert_eq!(thinking_deltas, thinking);
    assert_eq!(events[1].1["content_block"]["type"], "thinking");

    // Responses: a reasoning item, then the message.
    let r: Value = body_json(
        call(&n, post("/v1/responses", json!({"model": "echo-think", "input": user, "max_output_tokens": 3}))).await,
    )
    .await;
    assert_eq!(r["output"][0]["type"], "reasoning");
    assert_eq!(r["output"][0]["content"][0], json!({"type": "reasoning_text", "text": thinking}));
    assert_eq!(r["output"][1]["content"][0]["text"], "answer<|im_end|> <|im_start|>assistant");
}

/// A thinking budget: after that many tokens of thinking, the node closes the thinking and the
/// answer is generated from there (a second engine call continuing the same prompt, which the
/// echo engine shows by repeating it from its start).
#[tokio::test]
async fn a_thinking_budget_closes_the_thinking_and_the_answer_follows() {
    let n = thinking_node();
    let user = "w1 w2 w3 w4 w5 w6 w7 w8";
    // Without a budget, six tokens of thinking and no answer.
    let whole: Value =
        body_json(call(&n, post("/v1/chat/completions", chat("echo-think", user, json!({"max_tokens": 6})))).await)
            .await;
    assert_eq!(whole["choices"][0]["message"]["reasoning_content"], "<|im_start|>user w1 w2 w3 w4 w5");
    assert!(whole["choices"][0]["message"]["content"].as_str().unwrap_or_default().is_empty(), "{whole}");

    // Three tokens of thinking, then the answer, within the same six tokens.
    let budget = json!({"max_tokens": 6, "thinking_budget": 3});
    let whole: Value =
        body_json(call(&n, post("/v1/chat/completions", chat("echo-think", user, budget.clone()))).await).await;
    let choice = &whole["choices"][0];
    assert_eq!(choice["message"]["reasoning_content"], "<|im_start|>user w1 w2");
    assert_eq!(choice["message"]["content"], "<|im_start|>user w1 w2");
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(whole["usage"]["completion_tokens"], 6);

    let mut streamed = budget;
    streamed["stream"] = json!(true);
    let data = events(call(&n, post("/v1/chat/completions", chat("echo-think", user, streamed))).await).await;
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let joined = |field: &str| -> String {
        chunks.iter().filter_map(|c| c["choices"].get(0)?["delta"][field].as_str().map(str::to_owned)).collect()
    };
    assert_eq!(joined("reasoning_content"), "<|im_start|>user w1 w2");
    assert_eq!(joined("content"), "<|im_start|>user w1 w2");

    // The budget and `max_tokens` spent together: cut by length, nothing after the thinking.
    let whole: Value = body_json(
        call(
            &n,
            post("/v1/chat/completions", chat("echo-think", user, json!({"max_tokens": 3, "thinking_budget": 3}))),
        )
        .await,
    )
    .await;
    assert_eq!(whole["choices"][0]["message"]["reasoning_content"], "<|im_start|>user w1 w2");
    assert_eq!(whole["choices"][0]["finish_reason"], "length");

    // Anthropic's `thinking.budget_tokens`.
    let body = json!({"model": "echo-think", "max_tokens": 6, "messages": [{"role": "user", "content": user}],
        "thinking": {"type": "enabled", "budget_tokens": 3}});
    let m: Value = body_json(call(&n, post("/v1/messages", body)).await).await;
    assert_eq!(m["content"][0]["thinking"], "<|im_start|>user w1 w2");
    assert_eq!(m["content"][1]["text"], "<|im_start|>user w1 w2");
    assert_eq!(m["usage"]["output_tokens"], 6);
}

/// A template that writes harmony's markers (so its answers are read as harmony, gpt-oss's
/// format) and renders only the messages' text, so the echo engine repeats the user's words.
const HARMONY_TEMPLATE: &str = "{# <|channel|> <|message|> #}{% for m in messages %}{{ m.content }} {% endfor %}";

fn harmony_node() -> TestNode {
    node_with("echo-oss", 0, |c| {
        let manifest = c.engines_dir.join("echo/cpu/manifest.json");
        let mut m: Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
        m["parameters"]["chat_template"] = json!(HARMONY_TEMPLATE);
        std::fs::write(&manifest, serde_json::to_vec(&m).unwrap()).unwrap();
    })
}

#[tokio::test]
async fn a_harmony_answer_is_read_as_thinking_answer_and_calls_on_every_api() {
    let n = harmony_node();
    // Echoed word by word, markers split across pieces as the engine's tokens would be.
    let answer = "<|channel|>analysis<|message|>The user wants Paris.<|end|><|start|>assistant<|channel|>final<|message|>It is Paris.";
    let whole: Value =
        body_json(call(&n, post("/v1/chat/completions", chat("echo-oss", answer, json!({})))).await).await;
    let message = &whole["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "The user wants Paris.");
    assert_eq!(message["content"], "It is Paris.", "no marker reaches the content: {whole}");
    let data =
        events(call(&n, post("/v1/chat/completions", chat("echo-oss", answer, json!({"stream": true})))).await).await;
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let joined = |field: &str| -> String {
        chunks.iter().filter_map(|c| c["choices"].get(0)?["delta"][field].as_str().map(str::to_owned)).collect()
    };
    assert_eq!(
        (joined("reasoning_content"), joined("content")),
        ("The user wants Paris.".into(), "It is Paris.".into())
    );

    // A commentary message to a function is a call, on chat and on Anthropic's Messages.
    let calling = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}";
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let whole: Value =
        body_json(call(&n, post("/v1/chat/completions", chat("echo-oss", calling, json!({"tools": tools})))).await)
            .await;
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{whole}");
    assert_eq!(choice["message"]["reasoning_content"], "Need the weather.");
    assert_eq!(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(choice["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Paris\"}");
    assert!(choice["message"]["content"].as_str().unwrap_or_default().is_empty(), "{whole}");
    let body = json!({"model": "echo-oss", "max_tokens": 100, "messages": [{"role": "user", "content": calling}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]});
    let m: Value = body_json(call(&n, post("/v1/messages", body)).await).await;
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    assert_eq!(m["content"][0], json!({"type": "thinking", "thinking": "Need the weather.", "signature": ""}));
    assert_eq!(
        (m["content"][1]["name"].as_str(), &m["content"][1]["input"]),
        (Some("get_weather"), &json!({"city": "Paris"}))
    );

    let r: Value = body_json(
        call(
            &n,
            post(
                "/v1/responses",
                json!({"model": "echo-oss", "input": calling,
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]}),
            ),
        )
        .await,
    )
    .await;
    assert_eq!(r["output"][0]["content"][0], json!({"type": "reasoning_text", "text": "Need the weather."}), "{r}");
    assert_eq!(
        (r["output"][1]["type"].as_str(), r["output"][1]["name"].as_str()),
        (Some("function_call"), Some("get_weather"))
    );

    // Without tools offered, a call is not one: its text is the answer.
    let whole: Value =
        body_json(call(&n, post("/v1/chat/completions", chat("echo-oss", calling, json!({})))).await).await;
    assert_eq!(whole["choices"][0]["message"]["content"], "{\"city\": \"Paris\"}", "{whole}");
    assert_eq!(whole["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn n_choices_and_several_prompts_are_each_a_generation() {
    let n = node("echo-many");
    // Chat, n = 3: three choices of the same prompt, its tokens counted once.
    let whole: ChatCompletion = body_json(
        call(&n, post("/v1/chat/completions", chat("echo-many", "hi there", json!({"n": 3, "max_tokens": 2})))).await,
    )
    .await;
    assert_eq!(whole.choices.iter().map(|c| c.index).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(whole.choices.iter().all(|c| c.message.content.as_deref() == Some("<|im_start|>user hi")));
    let one: ChatCompletion = body_json(
        call(&n, post("/v1/chat/completions", chat("echo-many", "hi there", json!({"max_tokens": 2})))).await,
    )
    .await;
    let (u, u1) = (whole.usage.unwrap(), one.usage.unwrap());
    assert_eq!((u.prompt_tokens, u.completion_tokens), (u1.prompt_tokens, 3 * u1.completion_tokens));

    let extra = json!({"n": 2, "max_tokens": 2, "stream": true, "stream_options": {"include_usage": true}});
    let data = events(call(&n, post("/v1/chat/completions", chat("echo-many", "hi there", extra))).await).await;
    assert_eq!(data.iter().filter(|d| *d == "[DONE]").count(), 1);
    let chunks: Vec<ChatCompletionChunk> =
        data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    for index in 0..2 {
        let mine: Vec<&ChunkChoice> = chunks.iter().flat_map(|c| &c.choices).filter(|c| c.index == index).collect();
        let text: String = mine.iter().filter_map(|c| c.delta.content.clone()).collect();
        assert_eq!(text, "<|im_start|>user hi", "choice {index}");
        assert_eq!(mine.iter().filter(|c| c.finish_reason.is_some()).count(), 1, "choice {index}");
    }
    let usage = chunks.last().unwrap().usage.unwrap();
    assert_eq!(usage.completion_tokens, 4);

    // Completions: two prompts, two choices each, echoed prompt by prompt.
    let body =
        json!({"model": "echo-many", "prompt": ["one two", "three four five"], "n": 2, "max_tokens": 1, "echo": true});
    let whole: TextCompletion = body_json(call(&n, post("/v1/completions", body.clone())).await).await;
    let texts: Vec<(u32, &str)> = whole.choices.iter().map(|c| (c.index, c.text.as_str())).collect();
    assert_eq!(texts, [(0, "one twoone"), (1, "one twoone"), (2, "three four fivethree"), (3, "three four fivethree")]);
    let usage = whole.usage.unwrap();
    // BOS + two words, BOS + three words: each prompt counted once.
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (3 + 4, 4));
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let data = events(call(&n, post("/v1/completions", streamed)).await).await;
    let chunks: Vec<TextCompletion> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    for index in 0..4u32 {
        let text: String =
            chunks.iter().flat_map(|c| &c.choices).filter(|c| c.index == index).map(|c| c.text.as_str()).collect();
        assert_eq!(text, texts[index as usize].1);
    }
}

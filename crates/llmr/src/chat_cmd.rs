//! `llmr chat`: a terminal chat with a model on a running server (llmr's node or any
//! OpenAI-compatible one). Reads one message per line from stdin (a terminal or a pipe), sends
//! the whole conversation to `/v1/chat/completions` with `stream: true` and prints the answer as
//! it arrives. `/reset` forgets the conversation, `/exit` or end of input ends the session; a
//! failed turn prints `error: ...` and is left out of the conversation.

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use reqwest::blocking::{Client, RequestBuilder, Response};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use serde_json::{json, Value};
use std::io::{self, BufRead, BufReader, IsTerminal, Write};
use std::time::Duration;

#[derive(Args)]
pub struct ChatArgs {
    /// The server's base URL.
    #[arg(long, env = "LLMR_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// The model to chat with [default: the first one the server lists].
    #[arg(long)]
    model: Option<String>,
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long, env = "LLMR_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// A system message that starts every conversation.
    #[arg(long)]
    system: Option<String>,
    /// Sampling temperature (0 = greedy) [default: the server's].
    #[arg(long)]
    temperature: Option<f32>,
    /// Most tokens per answer [default: until the model stops or the context is full].
    #[arg(long)]
    max_tokens: Option<u32>,
}

pub fn run(args: ChatArgs) -> Result<()> {
    let server = Server::new(&args.url, args.api_key.clone())?;
    let model = match args.model {
        Some(model) => model,
        None => server.first_model()?,
    };
    let interactive = io::stdin().is_terminal();
    if interactive {
        eprintln!("chatting with {model} at {}; /reset clears the conversation, /exit or Ctrl-D ends", server.base);
    }
    let mut options = serde_json::Map::new();
    if let Some(t) = args.temperature {
        options.insert("temperature".into(), json!(t));
    }
    if let Some(m) = args.max_tokens {
        options.insert("max_tokens".into(), json!(m));
    }
    let start: Vec<Value> = args.system.iter().map(|s| json!({ "role": "system", "content": s })).collect();
    let mut history = start.clone();
    let mut stdout = io::stdout();
    let mut lines = io::stdin().lock().lines();
    loop {
        if interactive {
            print!("> ");
            stdout.flush()?;
        }
        let Some(line) = lines.next() else { break };
        let line = line.context("reading stdin")?;
        let line = line.trim_end_matches('\r');
        match line.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                history.clone_from(&start);
                if interactive {
                    eprintln!("(conversation cleared)");
                }
                continue;
            }
            _ => {}
        }
        history.push(json!({ "role": "user", "content": line }));
        let mut printed = false;
        let reply = server.complete(&model, &history, &options, &mut |text| {
            printed = true;
            stdout.write_all(text.as_bytes())?;
            stdout.flush()
        });
        if printed {
            writeln!(stdout)?;
        }
        match reply {
            Ok(reply) => history.push(json!({ "role": "assistant", "content": reply })),
            Err(error) => {
                history.pop();
                eprintln!("error: {error:#}");
            }
        }
    }
    if interactive {
        println!();
    }
    Ok(())
}

struct Server {
    /// Without a trailing `/` or `/v1`.
    base: String,
    api_key: Option<String>,
    http: Client,
}

impl Server {
    fn new(url: &str, api_key: Option<String>) -> Result<Self> {
        let trimmed = url.trim_end_matches('/');
        let base = trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_string();
        let http = Client::builder()
            .connect_timeout(Duration::from_secs(10))
            // Per read: a model may take a while to load or to produce the next token.
            .timeout(Duration::from_secs(600))
            .build()?;
        Ok(Self { base, api_key: api_key.filter(|k| !k.is_empty()), http })
    }

    fn send(&self, request: RequestBuilder) -> Result<Response> {
        let request = match &self.api_key {
            Some(key) => request.header(AUTHORIZATION, format!("Bearer {key}")),
            None => request,
        };
        let response = request.send().with_context(|| format!("cannot reach the server at {}", self.base))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response.text().unwrap_or_default();
        let message = serde_json::from_str(&body).ok().and_then(|v| error_message(&v));
        Err(anyhow!(message.unwrap_or_else(|| format!("HTTP {status}: {}", body.trim()))))
    }

    fn first_model(&self) -> Result<String> {
        let response = self.send(self.http.get(format!("{}/v1/models", self.base)))?;
        let list: Value = serde_json::from_reader(response).context("reading /v1/models")?;
        match list["data"][0]["id"].as_str() {
            Some(id) => Ok(id.to_string()),
            None => bail!("the server at {} lists no models; pass --model", self.base),
        }
    }

    /// One turn: streams the answer's text into `on_text` and returns it whole.
    fn complete(
        &self,
        model: &str,
        messages: &[Value],
        options: &serde_json::Map<String, Value>,
        on_text: &mut dyn FnMut(&str) -> io::Result<()>,
    ) -> Result<String> {
        let mut body = json!({ "model": model, "messages": messages, "stream": true });
        body.as_object_mut().expect("an object").extend(options.clone());
        let request = self
            .http
            .post(format!("{}/v1/chat/completions", self.base))
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_string());
        let response = self.send(request)?;
        let streamed = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let mut reply = String::new();
        if !streamed {
            // A server that does not stream answers with one completion.
            let answer: Value = serde_json::from_reader(response).context("reading the completion")?;
            let text = answer["choices"][0]["message"]["content"].as_str().unwrap_or_default();
            on_text(text)?;
            reply.push_str(text);
            return Ok(reply);
        }
        let mut data = String::new();
        for line in BufReader::new(response).lines() {
            let line = line.context("reading the stream")?;
            if line.is_empty() {
                if event(&data, &mut reply, on_text)? {
                    return Ok(reply);
                }
                data.clear();
            } else if let Some(value) = line.strip_prefix("data:") {
                // An event's data lines are joined with newlines (SSE); other fields are ignored.
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(value.strip_prefix(' ').unwrap_or(value));
            }
        }
        event(&data, &mut reply, on_text)?;
        Ok(reply)
    }
}

/// Handles one SSE event's data; true at `[DONE]`.
fn event(data: &str, reply: &mut String, on_text: &mut dyn FnMut(&str) -> io::Result<()>) -> Result<bool> {
    match data {
        "" => return Ok(false),
        "[DONE]" => return Ok(true),
        _ => {}
    }
    let chunk: Value =
        serde_json::from_str(data).with_context(|| format!("unreadable event from the server: {data}"))?;
    if let Some(message) = error_message(&chunk) {
        bail!(message);
    }
    if let Some(text) = chunk["choices"][0]["delta"]["content"].as_str() {
        on_text(text)?;
        reply.push_str(text);
    }
    Ok(false)
}

/// The message of an OpenAI-shaped error, `{"error": {"message": ...}}` (or `{"error": "..."}`).
fn error_message(value: &Value) -> Option<String> {
    let error = value.get("error")?;
    match (error["message"].as_str(), error.as_str()) {
        (Some(message), _) | (None, Some(message)) => Some(message.to_string()),
        (None, None) => Some(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_give_their_message() {
        let message = |body: &str| error_message(&serde_json::from_str(body).unwrap());
        assert_eq!(message(r#"{"error":{"message":"no such model","type":"x"}}"#).unwrap(), "no such model");
        assert_eq!(message(r#"{"error":"overloaded"}"#).unwrap(), "overloaded");
        assert_eq!(message(r#"{"choices":[]}"#), None);
    }

    #[test]
    fn events_append_deltas_until_done() {
        let mut reply = String::new();
        let mut seen = Vec::new();
        let mut on_text = |t: &str| {
            seen.push(t.to_string());
            Ok(())
        };
        let role = r#"{"choices":[{"delta":{"role":"assistant"}}]}"#;
        assert!(!event(role, &mut reply, &mut on_text).unwrap());
        assert!(!event(r#"{"choices":[{"delta":{"content":"Hé"}}]}"#, &mut reply, &mut on_text).unwrap());
        assert!(event("[DONE]", &mut reply, &mut on_text).unwrap());
        assert_eq!(reply, "Hé");
        let err = event(r#"{"error":{"message":"boom"}}"#, &mut reply, &mut on_text).unwrap_err();
        assert_eq!(err.to_string(), "boom");
        assert_eq!(seen, ["Hé"]);
    }
}

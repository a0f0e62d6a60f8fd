//! `llmr chat`: a terminal chat with a model on a running server (llmr's node or any
//! OpenAI-compatible one). Reads one message per line from stdin (a terminal or a pipe), sends
//! the whole conversation to `/v1/chat/completions` with `stream: true` and prints the answer as
//! it arrives. `/reset` forgets the conversation, `/exit` or end of input ends the session; a
//! failed turn prints `error: ...` and is left out of the conversation.

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use llmr_openai::{error_message, ChatCompletion, ChatCompletionChunk, ModelList, Role};
use reqwest::blocking::{Client, RequestBuilder, Response};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use serde::Serialize;
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
    let options = Options { temperature: args.temperature, max_tokens: args.max_tokens };
    let start: Vec<Message> = args.system.iter().map(|s| Message::new(Role::System, s)).collect();
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
        history.push(Message::new(Role::User, line));
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
            Ok(reply) => history.push(Message::new(Role::Assistant, &reply)),
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

/// One message of the conversation, as sent.
#[derive(Clone, Serialize)]
struct Message {
    role: Role,
    content: String,
}

impl Message {
    fn new(role: Role, content: &str) -> Self {
        Message { role, content: content.to_owned() }
    }
}

/// The sampling flags; a flag not given is left to the server.
#[derive(Serialize)]
struct Options {
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
}

/// The body of `POST /v1/chat/completions`: only what `llmr chat` sets.
#[derive(Serialize)]
struct ChatBody<'a> {
    model: &'a str,
    messages: &'a [Message],
    stream: bool,
    #[serde(flatten)]
    options: &'a Options,
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
        let body = response.bytes().unwrap_or_default();
        let message = error_message(&body);
        Err(anyhow!(message.unwrap_or_else(|| format!("HTTP {status}: {}", String::from_utf8_lossy(&body).trim()))))
    }

    fn first_model(&self) -> Result<String> {
        let response = self.send(self.http.get(format!("{}/v1/models", self.base)))?;
        let list: ModelList = serde_json::from_reader(response).context("reading /v1/models")?;
        match list.data.into_iter().next() {
            Some(model) => Ok(model.id),
            None => bail!("the server at {} lists no models; pass --model", self.base),
        }
    }

    /// One turn: streams the answer's text into `on_text` and returns it whole.
    fn complete(
        &self,
        model: &str,
        messages: &[Message],
        options: &Options,
        on_text: &mut dyn FnMut(&str) -> io::Result<()>,
    ) -> Result<String> {
        let body = ChatBody { model, messages, stream: true, options };
        let request = self
            .http
            .post(format!("{}/v1/chat/completions", self.base))
            .header(CONTENT_TYPE, "application/json")
            .body(serde_json::to_string(&body)?);
        let response = self.send(request)?;
        let streamed = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !streamed {
            // A server that does not stream answers with one completion.
            let answer: ChatCompletion = serde_json::from_reader(response).context("reading the completion")?;
            let text = answer.choices.into_iter().next().and_then(|c| c.message.content).unwrap_or_default();
            on_text(&text)?;
            return Ok(text);
        }
        let mut reply = String::new();
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
    // A server that fails after the stream started sends an OpenAI error as an event.
    if let Some(message) = error_message(data.as_bytes()) {
        bail!(message);
    }
    let chunk: ChatCompletionChunk =
        serde_json::from_str(data).with_context(|| format!("unreadable event from the server: {data}"))?;
    if let Some(text) = chunk.choices.into_iter().next().and_then(|c| c.delta.content) {
        on_text(&text)?;
        reply.push_str(&text);
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_carries_only_what_is_set() {
        let messages = [Message::new(Role::System, "be brief"), Message::new(Role::User, "hi")];
        let none = Options { temperature: None, max_tokens: None };
        let body =
            serde_json::to_value(ChatBody { model: "m", messages: &messages, stream: true, options: &none }).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"model": "m", "stream": true, "messages": [
                {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]})
        );
        let set = Options { temperature: Some(0.5), max_tokens: Some(7) };
        let body =
            serde_json::to_value(ChatBody { model: "m", messages: &messages, stream: true, options: &set }).unwrap();
        assert_eq!((body["temperature"].as_f64(), body["max_tokens"].as_u64()), (Some(0.5), Some(7)));
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
        let err = event(r#"{"error":"overloaded"}"#, &mut reply, &mut on_text).unwrap_err();
        assert_eq!(err.to_string(), "overloaded");
        assert_eq!(seen, ["Hé"]);
    }
}

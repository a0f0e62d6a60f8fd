//! A compiled chat template and what it renders.

use crate::env::{environment, TEMPLATE_NAME};
use crate::globals::{Raised, NOW_FORMAT, NOW_VAR};
use crate::message::{Message, Tool};
use crate::pyobjects::py_none;
use crate::source::rewrite_generation_tags;
use crate::TemplateError;
use chrono::NaiveDateTime;
use minijinja::{Environment, Value};
use std::collections::BTreeMap;

/// The special-token strings a template may print (`{{ bos_token }}`). A token that is `None` is
/// undefined in the template, as in transformers when the tokenizer has no such token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
}

/// What one render sees.
#[derive(Debug, Clone)]
pub struct RenderInput<'a> {
    pub messages: &'a [Message],
    /// `None` renders `tools` as `none`, as transformers does when no tools are given. Pass `None`
    /// rather than an empty list for a request without tools.
    pub tools: Option<&'a [Tool]>,
    /// Ends the prompt with the header of an assistant turn.
    pub add_generation_prompt: bool,
    /// Extra template variables, e.g. `enable_thinking`. They override the special tokens, but not
    /// `messages`, `tools`, `documents` or `add_generation_prompt`.
    pub kwargs: serde_json::Map<String, serde_json::Value>,
    /// The time `strftime_now` reports; local time when `None`.
    pub now: Option<NaiveDateTime>,
}

impl<'a> RenderInput<'a> {
    pub fn new(messages: &'a [Message], add_generation_prompt: bool) -> Self {
        RenderInput { messages, tools: None, add_generation_prompt, kwargs: Default::default(), now: None }
    }

    pub fn with_tools(mut self, tools: &'a [Tool]) -> Self {
        self.tools = Some(tools);
        self
    }

    pub fn with_kwarg(mut self, name: impl Into<String>, value: impl Into<serde_json::Value>) -> Self {
        self.kwargs.insert(name.into(), value.into());
        self
    }

    pub fn at(mut self, now: NaiveDateTime) -> Self {
        self.now = Some(now);
        self
    }
}

/// A chat template compiled once and rendered per request.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    tokens: SpecialTokens,
}

impl ChatTemplate {
    /// Compiles a Jinja chat template, e.g. a GGUF's `tokenizer.chat_template`.
    pub fn new(source: &str, tokens: SpecialTokens) -> Result<Self, TemplateError> {
        let mut env = environment();
        let rewritten = rewrite_generation_tags(source).into_owned();
        env.add_template_owned(TEMPLATE_NAME, rewritten)
            .map_err(|e| TemplateError::Syntax { line: e.line(), detail: describe(&e) })?;
        Ok(ChatTemplate { env, source: source.to_owned(), tokens })
    }

    /// The template source as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.tokens
    }

    pub fn render(&self, input: &RenderInput<'_>) -> Result<String, TemplateError> {
        let template = self.env.get_template(TEMPLATE_NAME).expect("added in ChatTemplate::new");
        template.render(self.context(input)).map_err(|e| render_error(&e))
    }

    fn context(&self, input: &RenderInput<'_>) -> BTreeMap<String, Value> {
        let mut ctx = BTreeMap::new();
        let tokens = [("bos_token", &self.tokens.bos_token), ("eos_token", &self.tokens.eos_token)];
        for (name, token) in tokens {
            if let Some(token) = token {
                ctx.insert(name.to_owned(), Value::from(token.as_str()));
            }
        }
        for (name, value) in &input.kwargs {
            ctx.insert(name.clone(), Value::from_serialize(value));
        }
        ctx.insert("messages".into(), Value::from_serialize(input.messages));
        ctx.insert("tools".into(), input.tools.map_or_else(py_none, Value::from_serialize));
        // transformers always passes `documents` (for RAG templates); we have none.
        ctx.insert("documents".into(), py_none());
        ctx.insert("add_generation_prompt".into(), Value::from(input.add_generation_prompt));
        if let Some(now) = input.now {
            ctx.insert(NOW_VAR.into(), Value::from(now.format(NOW_FORMAT).to_string()));
        }
        ctx
    }
}

fn render_error(err: &minijinja::Error) -> TemplateError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<Raised>() {
            return TemplateError::Raised { message: raised.0.clone() };
        }
        source = e.source();
    }
    TemplateError::Render { line: err.line(), detail: describe(err) }
}

fn describe(err: &minijinja::Error) -> String {
    match err.detail() {
        Some(detail) => format!("{}: {detail}", err.kind()),
        None => err.kind().to_string(),
    }
}

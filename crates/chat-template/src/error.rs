//! Errors of compiling and rendering templates, and of reading their configuration.

/// A chat template failed to compile or to render.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The source is not a template we can parse.
    #[error("chat template does not compile{}: {detail}", at_line(*line))]
    Syntax { line: Option<usize>, detail: String },
    /// The template called `raise_exception(message)`: it rejects this conversation on purpose
    /// (e.g. "Conversation roles must alternate user/assistant/...").
    #[error("chat template rejected the conversation: {message}")]
    Raised { message: String },
    /// Rendering failed for another reason (undefined attribute, type error, ...).
    #[error("chat template failed to render{}: {detail}", at_line(*line))]
    Render { line: Option<usize>, detail: String },
}

/// A `tokenizer_config.json` could not be turned into chat templates.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("tokenizer_config.json is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A field has a shape that Hugging Face never writes.
    #[error("tokenizer_config.json field `{field}` {reason}")]
    Field { field: &'static str, reason: String },
    /// `chat_template` is a list of named templates but none is called `default`.
    #[error("tokenizer_config.json has chat templates {names:?} but none named `default`")]
    NoDefaultTemplate { names: Vec<String> },
    #[error("chat template `{name}` from tokenizer_config.json: {source}")]
    Template {
        name: String,
        #[source]
        source: TemplateError,
    },
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(" at line {l}")).unwrap_or_default()
}

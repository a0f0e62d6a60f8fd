//! Renders Hugging Face chat templates into prompts, matching Python `transformers`
//! (`apply_chat_template`, i.e. jinja2 with transformers' settings and helpers) byte for byte.
//!
//! A [`ChatTemplate`] is compiled once from template source: a GGUF's `tokenizer.chat_template`,
//! or a `tokenizer_config.json` through [`ChatTemplates`], which also picks the `tool_use`
//! variant and falls back to ChatML when a model has no template. Each request then renders a
//! [`RenderInput`] of [`Message`]s, optional [`Tool`]s and extra variables.
//!
//! Conformance with transformers over real templates is checked by `tests/it/conformance.rs`
//! against goldens made by `tests/conformance/make_goldens.py`; `tests/conformance/DIFFERENCES.md`
//! lists what differs and why.
//!
//! Python semantics that minijinja cannot be made to follow, because they live in operators
//! rather than in filters, tests or functions we can replace:
//! - `'...'|safe + text` does not HTML-escape `text` (jinja2's `Markup` does);
//! - `'%s' % x` (printf-style `%` on strings) is an error;
//! - `~` and `str.format` print lists and dicts JSON-style (`["a"]`), not as Python (`['a']`);
//! - tuples are lists.
#![forbid(unsafe_code)]

mod config;
mod env;
mod error;
mod fallback;
mod globals;
mod message;
mod pycompat;
mod pyobjects;
mod pyrepr;
mod set;
mod source;
mod template;
mod tojson;

pub use config::{NamedTemplate, TokenizerConfig};
pub use error::{ConfigError, TemplateError};
pub use fallback::CHATML_TEMPLATE;
pub use message::{Content, ContentPart, FunctionCall, FunctionDef, ImageUrl, Message, Role, Tool, ToolCall};
pub use set::ChatTemplates;
pub use template::{ChatTemplate, RenderInput, SpecialTokens};

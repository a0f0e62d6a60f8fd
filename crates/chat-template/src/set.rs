//! A model's chat templates: the default one and, for some models, one for requests with tools.

use crate::{ChatTemplate, ConfigError, RenderInput, SpecialTokens, TemplateError, TokenizerConfig};

/// The templates of one model, choosing between them as transformers does: `tool_use` when the
/// request has tools and the model has one, `default` otherwise.
#[derive(Debug)]
pub struct ChatTemplates {
    default: ChatTemplate,
    tool_use: Option<ChatTemplate>,
}

impl ChatTemplates {
    /// From a GGUF's `tokenizer.chat_template` (and `tokenizer.chat_template.tool_use`, if any).
    /// A model without a template gets ChatML, with a warning.
    pub fn from_sources(
        default: Option<&str>,
        tool_use: Option<&str>,
        tokens: SpecialTokens,
    ) -> Result<Self, TemplateError> {
        let default = match default {
            Some(source) => ChatTemplate::new(source, tokens.clone())?,
            None => {
                tracing::warn!("model has no chat template; prompts will use the ChatML fallback");
                ChatTemplate::chatml(tokens.clone())
            }
        };
        let tool_use = tool_use.map(|source| ChatTemplate::new(source, tokens)).transpose()?;
        Ok(ChatTemplates { default, tool_use })
    }

    /// From the text of a Hugging Face `tokenizer_config.json`.
    pub fn from_tokenizer_config(json: &str) -> Result<Self, ConfigError> {
        Self::from_config(&TokenizerConfig::parse(json)?)
    }

    pub fn from_config(config: &TokenizerConfig) -> Result<Self, ConfigError> {
        let default = config.template("default");
        if default.is_none() && !config.chat_templates.is_empty() {
            let names = config.chat_templates.iter().map(|t| t.name.clone()).collect();
            return Err(ConfigError::NoDefaultTemplate { names });
        }
        let tokens = SpecialTokens { bos_token: config.bos_token.clone(), eos_token: config.eos_token.clone() };
        let compile = |name: &str, source: Option<&str>| {
            source
                .map(|s| ChatTemplate::new(s, tokens.clone()))
                .transpose()
                .map_err(|source| ConfigError::Template { name: name.to_owned(), source })
        };
        let tool_use = compile("tool_use", config.template("tool_use"))?;
        let default = match compile("default", default)? {
            Some(template) => template,
            None => {
                tracing::warn!("tokenizer_config.json has no chat_template; prompts will use the ChatML fallback");
                ChatTemplate::chatml(tokens)
            }
        };
        Ok(ChatTemplates { default, tool_use })
    }

    pub fn default_template(&self) -> &ChatTemplate {
        &self.default
    }

    pub fn tool_use_template(&self) -> Option<&ChatTemplate> {
        self.tool_use.as_ref()
    }

    /// The template for a request with (non-empty) tools or without.
    pub fn select(&self, has_tools: bool) -> &ChatTemplate {
        match &self.tool_use {
            Some(tool_use) if has_tools => tool_use,
            _ => &self.default,
        }
    }

    /// Renders with the template that [`select`](Self::select) picks for `input`.
    pub fn render(&self, input: &RenderInput<'_>) -> Result<String, TemplateError> {
        self.select(input.tools.is_some_and(|t| !t.is_empty())).render(input)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Message, Tool};

    const CONFIG: &str = r#"{
        "chat_template": [
            {"name": "default", "template": "{{ bos_token }}default"},
            {"name": "tool_use", "template": "tools:{{ tools | length }}{{ eos_token }}"}
        ],
        "bos_token": {"content": "<s>"},
        "eos_token": "</s>"
    }"#;

    #[test]
    fn tool_use_template_is_picked_only_with_tools() {
        let set = ChatTemplates::from_tokenizer_config(CONFIG).unwrap();
        let messages = [Message::user("hi")];
        let tools = [Tool::function("f", None, None)];
        assert_eq!(set.render(&RenderInput::new(&messages, true)).unwrap(), "<s>default");
        assert_eq!(set.render(&RenderInput::new(&messages, true).with_tools(&tools)).unwrap(), "tools:1</s>");
        assert_eq!(set.render(&RenderInput::new(&messages, true).with_tools(&[])).unwrap(), "<s>default");
    }

    #[test]
    fn missing_template_falls_back_to_chatml() {
        let set = ChatTemplates::from_tokenizer_config(r#"{"eos_token": "</s>"}"#).unwrap();
        assert!(set.default_template().source().contains("<|im_start|>"));
        let set = ChatTemplates::from_sources(None, None, SpecialTokens::default()).unwrap();
        let messages = [Message::user("hi")];
        assert_eq!(
            set.render(&RenderInput::new(&messages, true)).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn list_without_default_is_an_error() {
        let err = ChatTemplates::from_tokenizer_config(r#"{"chat_template": [{"name": "rag", "template": "x"}]}"#)
            .unwrap_err();
        assert!(matches!(err, ConfigError::NoDefaultTemplate { ref names } if names == &["rag"]), "{err}");
    }

    #[test]
    fn broken_template_names_itself() {
        let err = ChatTemplates::from_tokenizer_config(r#"{"chat_template": "{% if %}"}"#).unwrap_err();
        assert!(
            matches!(err, ConfigError::Template { ref name, source: TemplateError::Syntax { .. } } if name == "default")
        );
    }
}

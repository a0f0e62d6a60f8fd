//! Reading the chat templates and special tokens out of a Hugging Face `tokenizer_config.json`.

use crate::ConfigError;
use serde_json::Value;

/// A template with the name Hugging Face gives it (`default`, `tool_use`, `rag`...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedTemplate {
    pub name: String,
    pub source: String,
}

/// The parts of `tokenizer_config.json` that chat templating needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenizerConfig {
    /// Empty when the file has no `chat_template`; a lone string template is named `default`.
    pub chat_templates: Vec<NamedTemplate>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
}

impl TokenizerConfig {
    pub fn parse(json: &str) -> Result<Self, ConfigError> {
        let root: Value = serde_json::from_str(json)?;
        let Value::Object(root) = root else {
            return Err(ConfigError::Field { field: "(root)", reason: "must be a JSON object".into() });
        };
        Ok(TokenizerConfig {
            chat_templates: chat_templates(root.get("chat_template"))?,
            bos_token: token(root.get("bos_token"), "bos_token")?,
            eos_token: token(root.get("eos_token"), "eos_token")?,
        })
    }

    pub fn template(&self, name: &str) -> Option<&str> {
        self.chat_templates.iter().find(|t| t.name == name).map(|t| t.source.as_str())
    }
}

/// `chat_template` is either one template or a list of `{"name": ..., "template": ...}`.
fn chat_templates(value: Option<&Value>) -> Result<Vec<NamedTemplate>, ConfigError> {
    let field = "chat_template";
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(source)) => Ok(vec![NamedTemplate { name: "default".into(), source: source.clone() }]),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let text = |key: &str| item.get(key).and_then(Value::as_str).map(str::to_owned);
                match (text("name"), text("template")) {
                    (Some(name), Some(source)) => Ok(NamedTemplate { name, source }),
                    _ => Err(ConfigError::Field {
                        field,
                        reason: format!("entry {i} must have string `name` and `template`"),
                    }),
                }
            })
            .collect(),
        Some(_) => Err(ConfigError::Field { field, reason: "must be a string or a list of named templates".into() }),
    }
}

/// A special token is written as its text, or as a serialized `AddedToken` with a `content`.
fn token(value: Option<&Value>, field: &'static str) -> Result<Option<String>, ConfigError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(obj)) => match obj.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(ConfigError::Field { field, reason: "is an object without a string `content`".into() }),
        },
        Some(_) => Err(ConfigError::Field { field, reason: "must be a string or an object with `content`".into() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_template_and_plain_tokens() {
        let c =
            TokenizerConfig::parse(r#"{"chat_template": "{{ x }}", "bos_token": "<s>", "eos_token": "</s>"}"#).unwrap();
        assert_eq!(c.chat_templates, vec![NamedTemplate { name: "default".into(), source: "{{ x }}".into() }]);
        assert_eq!(c.bos_token.as_deref(), Some("<s>"));
        assert_eq!(c.eos_token.as_deref(), Some("</s>"));
    }

    #[test]
    fn named_templates_and_added_token_objects() {
        let c = TokenizerConfig::parse(
            r#"{
                "chat_template": [{"name": "default", "template": "d"}, {"name": "tool_use", "template": "t"}],
                "bos_token": {"__type": "AddedToken", "content": "<|begin|>", "lstrip": false},
                "eos_token": null
            }"#,
        )
        .unwrap();
        assert_eq!(c.template("default"), Some("d"));
        assert_eq!(c.template("tool_use"), Some("t"));
        assert_eq!(c.bos_token.as_deref(), Some("<|begin|>"));
        assert_eq!(c.eos_token, None);
    }

    #[test]
    fn missing_template_is_empty() {
        let c = TokenizerConfig::parse(r#"{"model_max_length": 2048}"#).unwrap();
        assert!(c.chat_templates.is_empty());
        assert_eq!(c.bos_token, None);
    }

    #[test]
    fn malformed_fields_are_named() {
        let err = TokenizerConfig::parse(r#"{"chat_template": 3}"#).unwrap_err();
        assert!(matches!(err, ConfigError::Field { field: "chat_template", .. }), "{err}");
        let err = TokenizerConfig::parse(r#"{"chat_template": [{"name": "default"}]}"#).unwrap_err();
        assert!(matches!(err, ConfigError::Field { field: "chat_template", .. }), "{err}");
        let err = TokenizerConfig::parse(r#"{"eos_token": {"id": 2}}"#).unwrap_err();
        assert!(matches!(err, ConfigError::Field { field: "eos_token", .. }), "{err}");
        assert!(matches!(TokenizerConfig::parse("[").unwrap_err(), ConfigError::Json(_)));
    }
}

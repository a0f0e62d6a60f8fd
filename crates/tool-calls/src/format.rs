//! The tool-call formats, recognised from a model's chat template.

use self::marker::{HERMES_OPEN, MISTRAL_ARGS, MISTRAL_OPEN, PYTHON_TAG};
use crate::{ParsedOutput, StreamParser};

/// How a model writes its tool calls. Every format also reads the others' shapes where they cannot be
/// mistaken for text (both Mistral forms; any bare-JSON shape after `<|python_tag|>`); the format mainly
/// decides where a call may start and what [`forced_prefix`](Self::forced_prefix) writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolCallFormat {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` blocks, after optional content
    /// (Qwen2.5 and later, Hermes 2/3, GLM 4.x, Granite 4, ...).
    Hermes,
    /// The whole answer is `{"name": ..., "parameters": {...}}` (or `"arguments"`), optionally after
    /// `<|python_tag|>`, several separated by `;` (Llama 3.1 to 3.3).
    Llama3,
    /// `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` after optional content (Mistral Nemo and
    /// other v3 tokenizers).
    Mistral,
    /// `[TOOL_CALLS]name[ARGS]{...}` (optionally `name[CALL_ID]id[ARGS]{...}`), one marker per call
    /// (Mistral Small 3.2, Ministral 3, Devstral).
    MistralArgs,
    /// gpt-oss's harmony: a message addressed `to=functions.NAME` on the `commentary` channel
    /// (read by [`HarmonyParser`](crate::HarmonyParser), with the thinking and the answer).
    Harmony,
    /// No hint from the template: the whole answer (trimmed, optionally in a ```` ```json ```` fence) is a
    /// call object, an array of them, or `{"tool_calls": [...]}`; a leading `<tool_call>` block or
    /// `<|python_tag|>` is read too.
    PlainJson,
}

/// The literal markers of the formats.
pub(crate) mod marker {
    pub(crate) const HERMES_OPEN: &str = "<tool_call>";
    pub(crate) const HERMES_CLOSE: &str = "</tool_call>";
    pub(crate) const MISTRAL_OPEN: &str = "[TOOL_CALLS]";
    pub(crate) const MISTRAL_ARGS: &str = "[ARGS]";
    pub(crate) const MISTRAL_CALL_ID: &str = "[CALL_ID]";
    pub(crate) const PYTHON_TAG: &str = "<|python_tag|>";
    pub(crate) const FENCE: &str = "```";
}

impl ToolCallFormat {
    /// The format a model uses, from its chat template source and its architecture (the GGUF
    /// `general.architecture`, e.g. `llama`, `qwen2`). Without a template there is no hint:
    /// [`PlainJson`](Self::PlainJson).
    pub fn detect(template_source: Option<&str>, architecture: &str) -> ToolCallFormat {
        let Some(template) = template_source else {
            return ToolCallFormat::PlainJson;
        };
        if crate::is_harmony(template) {
            ToolCallFormat::Harmony
        } else if template.contains(HERMES_OPEN) {
            ToolCallFormat::Hermes
        } else if template.contains(MISTRAL_OPEN) && template.contains(MISTRAL_ARGS) {
            ToolCallFormat::MistralArgs
        } else if template.contains(MISTRAL_OPEN) {
            ToolCallFormat::Mistral
        } else if template.contains(PYTHON_TAG)
            || (template.contains("\"parameters\"") && (template.contains("ipython") || architecture == "llama"))
        {
            ToolCallFormat::Llama3
        } else {
            ToolCallFormat::PlainJson
        }
    }

    /// Text to append to the rendered prompt (after the assistant turn's prefix) so that the model
    /// must call a tool: any tool (`function: None`, `tool_choice: "required"`) or the named one.
    /// Generation continues from inside the call, so the parser must be told: pass the same text to
    /// [`StreamParser::with_prefill`] or [`parse_with_prefill`](Self::parse_with_prefill).
    pub fn forced_prefix(&self, function: Option<&str>) -> String {
        // The name as a JSON string, quotes included.
        let quoted = |name: &str| serde_json::Value::from(name).to_string();
        match (self, function) {
            (ToolCallFormat::Hermes, None) => format!("{HERMES_OPEN}\n{{\"name\": \""),
            (ToolCallFormat::Hermes, Some(name)) => {
                format!("{HERMES_OPEN}\n{{\"name\": {}, \"arguments\": ", quoted(name))
            }
            // Either Mistral form may follow the bare marker.
            (ToolCallFormat::Mistral | ToolCallFormat::MistralArgs, None) => MISTRAL_OPEN.to_owned(),
            (ToolCallFormat::Mistral, Some(name)) => {
                format!("{MISTRAL_OPEN}[{{\"name\": {}, \"arguments\": ", quoted(name))
            }
            (ToolCallFormat::MistralArgs, Some(name)) => format!("{MISTRAL_OPEN}{name}{MISTRAL_ARGS}"),
            (ToolCallFormat::Llama3 | ToolCallFormat::PlainJson, None) => "{\"name\": \"".to_owned(),
            (ToolCallFormat::Llama3, Some(name)) => format!("{{\"name\": {}, \"parameters\": ", quoted(name)),
            (ToolCallFormat::PlainJson, Some(name)) => format!("{{\"name\": {}, \"arguments\": ", quoted(name)),
            (ToolCallFormat::Harmony, None) => " to=functions.".to_owned(),
            (ToolCallFormat::Harmony, Some(name)) => {
                format!(" to=functions.{name}<|channel|>commentary json<|message|>")
            }
        }
    }

    /// Splits a complete generated `text` into content and calls. `allowed` lists the tool names
    /// offered; a call to any other name is content (an empty list accepts every name). This is
    /// exactly what a [`StreamParser`] produces when given the whole text at once.
    pub fn parse(&self, text: &str, allowed: &[&str]) -> ParsedOutput {
        self.parse_with_prefill("", text, allowed)
    }

    /// [`parse`](Self::parse) for a generation that continued from `prefill` (see
    /// [`forced_prefix`](Self::forced_prefix)); `text` is what the model generated after it.
    pub fn parse_with_prefill(&self, prefill: &str, text: &str, allowed: &[&str]) -> ParsedOutput {
        let allowed: Vec<String> = allowed.iter().map(|name| (*name).to_owned()).collect();
        if *self == ToolCallFormat::Harmony {
            // The thinking is left out: a `ParsedOutput` has content and calls only.
            let mut parser = crate::HarmonyParser::new(allowed).with_prefill(prefill);
            let mut events = parser.push(text);
            events.extend(parser.finish());
            let mut output = ParsedOutput::default();
            for event in events {
                match event {
                    crate::HarmonyEvent::Content(t) => output.content.push_str(&t),
                    crate::HarmonyEvent::Call { call, .. } => output.calls.push(call),
                    crate::HarmonyEvent::Reasoning(_) => {}
                }
            }
            return output;
        }
        let mut parser = StreamParser::new(*self, allowed).with_prefill(prefill);
        let mut events = parser.push(text);
        events.extend(parser.finish());
        events.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_from_template_markers() {
        let detect = |template: &str, arch: &str| ToolCallFormat::detect(Some(template), arch);
        assert_eq!(detect("{{- '<tool_call>\\n' }}", "qwen2"), ToolCallFormat::Hermes);
        // Hermes-on-Llama models say `parameters` too; the block markers win.
        assert_eq!(detect("<tool_call> \"parameters\" ipython", "llama"), ToolCallFormat::Hermes);
        assert_eq!(detect("{{- '[TOOL_CALLS][' }}", "llama"), ToolCallFormat::Mistral);
        assert_eq!(detect("'[TOOL_CALLS]' + name + '[ARGS]'", "llama"), ToolCallFormat::MistralArgs);
        assert_eq!(detect("{{- '<|python_tag|>' }}", "llama"), ToolCallFormat::Llama3);
        assert_eq!(
            detect("ipython ... {\"name\": function name, \"parameters\": ...}", "llama"),
            ToolCallFormat::Llama3
        );
        assert_eq!(detect("{\"name\": function name, \"parameters\": ...}", "llama"), ToolCallFormat::Llama3);
        // Command-R says "parameters" but is no Llama.
        assert_eq!(detect("\"parameters\"", "command-r"), ToolCallFormat::PlainJson);
        assert_eq!(detect("<|im_start|>{{ message.content }}", "llama"), ToolCallFormat::PlainJson);
        assert_eq!(ToolCallFormat::detect(None, "qwen2"), ToolCallFormat::PlainJson);
        assert_eq!(detect("<|start|>assistant<|channel|>final<|message|>", "gpt-oss"), ToolCallFormat::Harmony);
    }

    #[test]
    fn forced_prefixes() {
        use ToolCallFormat::*;
        assert_eq!(Hermes.forced_prefix(None), "<tool_call>\n{\"name\": \"");
        assert_eq!(
            Hermes.forced_prefix(Some("get_weather")),
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
        );
        assert_eq!(Llama3.forced_prefix(Some("f")), "{\"name\": \"f\", \"parameters\": ");
        assert_eq!(Mistral.forced_prefix(None), "[TOOL_CALLS]");
        assert_eq!(Mistral.forced_prefix(Some("f")), "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": ");
        assert_eq!(MistralArgs.forced_prefix(Some("f")), "[TOOL_CALLS]f[ARGS]");
        assert_eq!(PlainJson.forced_prefix(None), "{\"name\": \"");
        // Names are JSON-escaped.
        assert_eq!(PlainJson.forced_prefix(Some("a\"b")), "{\"name\": \"a\\\"b\", \"arguments\": ");
    }
}

//! The grammar of a forced tool call (`tool_choice` `required` or a named function): the call's
//! markers in the model's own format around a JSON object whose `name` is one of the offered
//! tools and whose arguments follow that tool's parameter schema. An engine with constrained
//! decoding masks its output with it, so the call always parses and its arguments always match.
//!
//! Written in llguidance's Lark dialect, with the call object as an embedded `%json` schema.

use crate::format::marker::{HERMES_CLOSE, HERMES_OPEN};
use crate::ToolCallFormat;
use serde_json::{json, Value};

/// One offered tool: its name and the JSON Schema of its arguments (`None`: any object).
pub struct ToolSchema<'a> {
    pub name: &'a str,
    pub parameters: Option<&'a Value>,
}

impl ToolCallFormat {
    /// The grammar of a forced call to one of `tools` (only `function` when named), several in a
    /// row when `parallel` and the format has a way to write them. `None` for the formats whose
    /// markers are control tokens a grammar cannot spell as text (both Mistral forms): those keep
    /// [`forced_prefix`](Self::forced_prefix).
    pub fn forced_call_grammar(
        &self,
        tools: &[ToolSchema<'_>],
        function: Option<&str>,
        parallel: bool,
    ) -> Option<String> {
        let key = match self {
            ToolCallFormat::Hermes | ToolCallFormat::PlainJson => "arguments",
            ToolCallFormat::Llama3 => "parameters",
            ToolCallFormat::Mistral | ToolCallFormat::MistralArgs => return None,
        };
        let offered: Vec<&ToolSchema<'_>> = tools.iter().filter(|t| function.is_none_or(|f| f == t.name)).collect();
        if offered.is_empty() {
            return None;
        }
        let call = call_schema(&offered, key);
        Some(match self {
            ToolCallFormat::Hermes => {
                let block = format!(
                    "call: {} %json {call} {}",
                    lark_string(&format!("{HERMES_OPEN}\n")),
                    lark_string(&format!("\n{HERMES_CLOSE}"))
                );
                // A newline may end the answer too: one after a call is how the model goes on, and
                // it must not commit it to a second call.
                let start = if parallel { "start: call (\"\\n\" call)* \"\\n\"?" } else { "start: call \"\\n\"?" };
                format!("{start}\n{block}\n")
            }
            // Llama 3 writes several calls separated by `; `.
            ToolCallFormat::Llama3 if parallel => format!("start: call (\"; \" call)*\ncall: %json {call}\n"),
            // A bare object (an array of them reads as calls too, but one is what models write).
            _ => format!("start: %json {call}\n"),
        })
    }
}

/// The call object: `{"name": <one of the tools>, <key>: <its arguments>}`, on one line with
/// Python's separators (as the templates show calls to the model).
fn call_schema(tools: &[&ToolSchema<'_>], key: &str) -> Value {
    let one = |t: &ToolSchema<'_>| {
        let arguments = t.parameters.cloned().unwrap_or_else(|| json!({"type": "object"}));
        json!({
            "type": "object",
            "properties": {"name": {"const": t.name}, key: arguments},
            "required": ["name", key],
            "additionalProperties": false,
        })
    };
    let mut schema = match tools {
        [t] => one(t),
        many => json!({"anyOf": many.iter().map(|t| one(t)).collect::<Vec<_>>()}),
    };
    schema["x-guidance"] = json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
    schema
}

/// A Lark string literal (JSON's escaping is a subset Lark reads).
fn lark_string(s: &str) -> String {
    Value::from(s).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_format_gets_its_markers_and_only_the_named_tool() {
        let params = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
        let tools = [
            ToolSchema { name: "get_weather", parameters: Some(&params) },
            ToolSchema { name: "noop", parameters: None },
        ];
        let hermes = ToolCallFormat::Hermes.forced_call_grammar(&tools, None, true).unwrap();
        assert!(
            hermes.starts_with("start: call (\"\\n\" call)* \"\\n\"?\ncall: \"<tool_call>\\n\" %json {"),
            "{hermes}"
        );
        assert!(hermes.trim_end().ends_with("\"\\n</tool_call>\""), "{hermes}");
        assert!(hermes.contains("\"anyOf\"") && hermes.contains("\"noop\""), "{hermes}");
        let named = ToolCallFormat::Hermes.forced_call_grammar(&tools, Some("get_weather"), false).unwrap();
        assert!(
            named.starts_with("start: call \"\\n\"?\n") && !named.contains("noop") && !named.contains("anyOf"),
            "{named}"
        );
        let llama = ToolCallFormat::Llama3.forced_call_grammar(&tools, Some("noop"), false).unwrap();
        assert!(llama.contains("\"parameters\"") && llama.starts_with("start: %json"), "{llama}");
        assert!(ToolCallFormat::PlainJson.forced_call_grammar(&tools, None, true).unwrap().contains("\"arguments\""));
        assert_eq!(ToolCallFormat::Mistral.forced_call_grammar(&tools, None, true), None);
        assert_eq!(ToolCallFormat::Hermes.forced_call_grammar(&tools, Some("absent"), true), None);
    }
}

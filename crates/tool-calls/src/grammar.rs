//! The grammars of tool calls, in the model's own format, around JSON objects whose `name` is one
//! of the offered tools and whose arguments follow that tool's parameter schema. An engine with
//! constrained decoding masks its output with them, so a call always parses and its arguments
//! always match:
//! - a forced call (`tool_choice` `required` or a named function): the answer is the call;
//! - `strict` tools under `tool_choice: auto`: free text until the model opens a call (a lazy
//!   grammar, as llama.cpp's triggers are), then the call under its schema, then text again.
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
        let offered: Vec<&ToolSchema<'_>> = tools.iter().filter(|t| function.is_none_or(|f| f == t.name)).collect();
        if offered.is_empty() {
            return None;
        }
        let key = match self {
            ToolCallFormat::Hermes | ToolCallFormat::PlainJson => "arguments",
            ToolCallFormat::Llama3 => "parameters",
            ToolCallFormat::Mistral | ToolCallFormat::MistralArgs => return None,
            // One call per message; `<|call|>` ends the generation.
            ToolCallFormat::Harmony => return Some(format!("start: call\n{}", harmony_calls(&offered))),
        };
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

    /// The grammar of an answer under `tool_choice: auto` with strict tools: any text, and calls
    /// to `tools` that follow their schemas wherever the model opens one (several when `parallel`
    /// and the format has a way to write them). Until the model writes a call's opening the mask
    /// allows every token it would allow unconstrained. `None` for the Mistral forms (their markers
    /// are control tokens a grammar cannot spell as text): their calls are read, not enforced.
    pub fn auto_call_grammar(&self, tools: &[ToolSchema<'_>], parallel: bool) -> Option<String> {
        if tools.is_empty() {
            return None;
        }
        let refs: Vec<&ToolSchema<'_>> = tools.iter().collect();
        // Text that never opens a call: a call's opening always starts a call under its schema.
        // Nor does it start as a JSON object: an answer that does is a bare call.
        let text_without =
            |opening: &str| format!("/(?s:.*)/ & ~/(?s:.*){}(?s:.*)/ & ~{BARE_OPENING}", regex_escape(opening));
        Some(match self {
            ToolCallFormat::Hermes => {
                let call = call_schema(&refs, "arguments");
                // A lazy lexeme: the text before a call ends at the first `<tool_call>`. Qwen2.5
                // often writes its call as bare JSON, without the block: that is a call too.
                let calls = if parallel { "call*" } else { "call?" };
                format!(
                    "start: bare | {calls} TAIL\n\
                     bare: %json {call}\n\
                     call: head \"\\n\" %json {call} {}\n\
                     head[lazy]: TEXT {}\n\
                     TEXT: /(?s:.*)/ & ~{BARE_OPENING}\n\
                     TAIL: {}\n",
                    lark_string(&format!("\n{HERMES_CLOSE}")),
                    lark_string(HERMES_OPEN),
                    text_without(HERMES_OPEN),
                )
            }
            // The whole answer is a call or it is text, which then cannot start as a call does.
            ToolCallFormat::Llama3 | ToolCallFormat::PlainJson => {
                let key = if *self == ToolCallFormat::Llama3 { "parameters" } else { "arguments" };
                let call = call_schema(&refs, key);
                let calls = if parallel && *self == ToolCallFormat::Llama3 { "call (\"; \" call)*" } else { "call" };
                format!("start: TEXT | {calls}\ncall: %json {call}\nTEXT: /(?s:.*)/ & ~{BARE_OPENING}\n")
            }
            ToolCallFormat::Mistral | ToolCallFormat::MistralArgs => return None,
            // The answer (after any thinking, see `ReasoningFormat::then`) is a final message or
            // a call.
            ToolCallFormat::Harmony => format!(
                "start: final | call\nfinal: <|channel|> \"final\" <|message|> FINAL\nFINAL: /(?s:.*)/\n{}",
                harmony_calls(&refs)
            ),
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
    schema["x-guidance"] = layout();
    schema
}

/// Text that opens as a JSON object does (after whitespace), as a Lark regex.
const BARE_OPENING: &str = r"/[ \t\r\n]*\{(?s:.*)/";

/// Harmony's calls, one rule a tool, as gpt-oss's template shows them to the model:
/// ` to=functions.NAME<|channel|>commentary json<|message|>{...}` (its rules, `call` first).
fn harmony_calls(tools: &[&ToolSchema<'_>]) -> String {
    let mut rules = String::from("call: ");
    let names: Vec<String> = (0..tools.len()).map(|i| format!("call_{i}")).collect();
    rules.push_str(&names.join(" | "));
    rules.push('\n');
    for (name, tool) in names.iter().zip(tools) {
        let mut arguments = tool.parameters.cloned().unwrap_or_else(|| json!({"type": "object"}));
        if let Value::Object(map) = &mut arguments {
            map.entry("x-guidance").or_insert_with(layout);
        }
        rules.push_str(&format!(
            "{name}: {} <|channel|> \"commentary json\" <|message|> %json {arguments}\n",
            lark_string(&format!(" to=functions.{}", tool.name))
        ));
    }
    rules
}

/// llmr's JSON layout for calls: one line, Python's separators.
fn layout() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// `text` as a regex matching itself.
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
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

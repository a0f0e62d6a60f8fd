//! Turns the JSON a model wrote into [`ParsedCall`]s: which shapes count as a call, and how the
//! arguments are normalised.

use serde_json::{Map, Value};

use crate::ParsedCall;

/// The tool names offered with the request (`None`: any name is accepted).
#[derive(Debug, Clone)]
pub(crate) struct Allowed(Option<Vec<String>>);

impl Allowed {
    /// The names offered; an empty list accepts every name.
    pub(crate) fn new(names: Vec<String>) -> Self {
        Self((!names.is_empty()).then_some(names))
    }

    /// No name at all.
    pub(crate) fn none() -> Self {
        Self(Some(Vec::new()))
    }

    fn contains(&self, name: &str) -> bool {
        self.0.as_ref().is_none_or(|names| names.iter().any(|allowed| allowed == name))
    }
}

/// How the JSON was introduced, which decides how much it must look like a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// After an explicit call marker (`<tool_call>`, `[TOOL_CALLS]`): a missing `arguments` means `{}`.
    Marked,
    /// Bare JSON that could also be an ordinary answer: `arguments` (or `parameters`) must be present.
    Bare,
}

/// One call object: `{"name", "arguments" | "parameters"}`, or OpenAI's own
/// `{"type": "function", "function": {"name", "arguments"}}`. Other keys (such as `id`) are ignored.
pub(crate) fn call(value: &Value, framing: Framing, allowed: &Allowed) -> Option<ParsedCall> {
    let object = value.as_object()?;
    if let Some(function) = object.get("function").filter(|f| f.is_object()) {
        if object.get("type").is_none_or(|kind| kind == "function") {
            return call(function, framing, allowed);
        }
    }
    let name = object.get("name")?.as_str()?;
    if name.is_empty() || !allowed.contains(name) {
        return None;
    }
    let arguments = match object.get("arguments").or_else(|| object.get("parameters")) {
        Some(arguments) => arguments_text(arguments),
        None if framing == Framing::Marked => "{}".to_owned(),
        None => return None,
    };
    Some(ParsedCall { name: name.to_owned(), arguments })
}

/// A call whose name was written outside the JSON (Mistral's `name[ARGS]{...}`).
pub(crate) fn named_call(name: &str, arguments: &Value, allowed: &Allowed) -> Option<ParsedCall> {
    allowed.contains(name).then(|| ParsedCall { name: name.to_owned(), arguments: arguments_text(arguments) })
}

/// Every element of `values` as a call, or `None` if any is not one (or there are none): a list is
/// taken whole or not at all.
pub(crate) fn all_calls(values: &[Value], framing: Framing, allowed: &Allowed) -> Option<Vec<ParsedCall>> {
    if values.is_empty() {
        return None;
    }
    values.iter().map(|value| call(value, framing, allowed)).collect()
}

/// The calls of a bare JSON answer: one call object, an array of them, or `{"tool_calls": [...]}`.
pub(crate) fn bare_calls(value: &Value, allowed: &Allowed) -> Option<Vec<ParsedCall>> {
    match value {
        Value::Array(values) => all_calls(values, Framing::Bare, allowed),
        Value::Object(object) => match tool_calls_list(object) {
            Some(values) => all_calls(values, Framing::Marked, allowed),
            None => call(value, Framing::Bare, allowed).map(|call| vec![call]),
        },
        _ => None,
    }
}

/// The list of `{"tool_calls": [...]}` when that is the object's only key.
fn tool_calls_list(object: &Map<String, Value>) -> Option<&[Value]> {
    match (object.len(), object.get("tool_calls")) {
        (1, Some(Value::Array(values))) => Some(values),
        _ => None,
    }
}

/// The arguments as compact JSON text: an object (or any other value) re-serialised in the model's
/// key order; a string holding JSON kept as it is; any other string wrapped as a JSON string; a
/// `null` read as no arguments.
pub(crate) fn arguments_text(arguments: &Value) -> String {
    match arguments {
        Value::Null => "{}".to_owned(),
        Value::String(text) if serde_json::from_str::<Value>(text).is_ok() => text.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn any() -> Allowed {
        Allowed::new(Vec::new())
    }

    #[test]
    fn arguments_are_compact_and_keep_the_key_order() {
        let value: Value =
            serde_json::from_str(r#"{"name": "f", "arguments": { "z": 1, "a": [1, 2], "m": {"y": null, "b": "é"} }}"#)
                .unwrap();
        let call = call(&value, Framing::Bare, &any()).unwrap();
        assert_eq!(call.arguments, r#"{"z":1,"a":[1,2],"m":{"y":null,"b":"é"}}"#);
    }

    #[test]
    fn string_arguments_are_kept_when_they_are_json_and_wrapped_otherwise() {
        assert_eq!(arguments_text(&json!("{\"city\": \"Paris\"}")), "{\"city\": \"Paris\"}");
        assert_eq!(arguments_text(&json!("Paris")), "\"Paris\"");
        assert_eq!(arguments_text(&Value::Null), "{}");
        assert_eq!(arguments_text(&json!([1, 2])), "[1,2]");
    }

    #[test]
    fn shapes_that_count_as_a_call() {
        let allowed = Allowed::new(vec!["f".to_owned()]);
        let expect = Some(ParsedCall { name: "f".to_owned(), arguments: "{\"x\":1}".to_owned() });
        assert_eq!(call(&json!({"name": "f", "arguments": {"x": 1}}), Framing::Bare, &allowed), expect);
        assert_eq!(call(&json!({"name": "f", "parameters": {"x": 1}}), Framing::Bare, &allowed), expect);
        assert_eq!(
            call(
                &json!({"type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}}),
                Framing::Bare,
                &allowed
            ),
            expect
        );
        assert_eq!(call(&json!({"name": "g", "arguments": {}}), Framing::Bare, &allowed), None);
        assert_eq!(call(&json!({"name": "", "arguments": {}}), Framing::Bare, &any()), None);
        assert_eq!(call(&json!({"name": 3, "arguments": {}}), Framing::Bare, &any()), None);
        assert_eq!(call(&json!({"name": "f"}), Framing::Bare, &allowed), None);
        assert_eq!(
            call(&json!({"name": "f"}), Framing::Marked, &allowed),
            Some(ParsedCall { name: "f".to_owned(), arguments: "{}".to_owned() })
        );
    }

    #[test]
    fn lists_are_taken_whole_or_not_at_all() {
        let allowed = Allowed::new(vec!["f".to_owned()]);
        let list = json!([{"name": "f", "arguments": {}}, {"name": "f", "arguments": {"a": 1}}]);
        assert_eq!(bare_calls(&list, &allowed).map(|calls| calls.len()), Some(2));
        let wrapped = json!({"tool_calls": list});
        assert_eq!(bare_calls(&wrapped, &allowed).map(|calls| calls.len()), Some(2));
        let mixed = json!([{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]);
        assert_eq!(bare_calls(&mixed, &allowed), None);
        assert_eq!(bare_calls(&json!([]), &allowed), None);
        assert_eq!(bare_calls(&json!({"tool_calls": [], "x": 1}), &allowed), None);
    }
}

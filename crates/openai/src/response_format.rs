//! `response_format`: what the answer's text must be, as the constraint engines decode under.
//!
//! - `{"type": "text"}` (or none): free text.
//! - `{"type": "json_object"}`: one JSON object. llama-server's extension, a `schema` beside the
//!   type, is honoured as a JSON schema.
//! - `{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}`: one
//!   JSON value valid against `schema` (any JSON value when absent). The schema is enforced
//!   whether `strict` is true or not: decoding never leaves it. `name` is checked when given but
//!   not required (OpenAI requires it; llama-server and vLLM do not, and their clients omit it).
//!
//! llama-server's top-level `json_schema` parameter means the same as a `json_schema` format;
//! its `grammar` is taken when it is Lark for llguidance (`%llguidance`), refused when GBNF.
//! vLLM's `structured_outputs` (`json`, `regex`, `choice`, `grammar`) and its older `guided_*`
//! fields are a JSON schema, a regular expression, one of some literal strings, or a Lark
//! grammar.

use crate::ApiError;
use llmr_engine_types::Constraint;
use serde_json::Value;

/// OpenAI's bound on `json_schema.name`.
const MAX_NAME: usize = 64;

/// Every field of a chat or text completion request that can say what the answer must be.
#[derive(Debug, Default, Clone, Copy)]
pub struct OutputFields<'a> {
    pub response_format: Option<&'a Value>,
    /// llama-server's top-level JSON schema.
    pub json_schema: Option<&'a Value>,
    /// llama-server's grammar: GBNF, or a Lark grammar after `%llguidance`.
    pub grammar: Option<&'a Value>,
    /// vLLM's `structured_outputs`: one of `json`, `regex`, `choice`, `grammar`.
    pub structured_outputs: Option<&'a Value>,
    /// vLLM's older spellings of the same.
    pub guided_json: Option<&'a Value>,
    pub guided_regex: Option<&'a Value>,
    pub guided_choice: Option<&'a Value>,
    pub guided_grammar: Option<&'a Value>,
}

/// The constraint a request asks for (`None`: free text), and the field an engine's refusal of it
/// is blamed on. At most one of the fields may ask.
pub fn output_constraint(fields: OutputFields<'_>) -> Result<(Option<Constraint>, &'static str), ApiError> {
    let mut found: Option<(Constraint, &'static str)> = None;
    let mut take = |c: Option<(Constraint, &'static str)>| -> Result<(), ApiError> {
        match (c, &found) {
            (Some((_, param)), Some((_, first))) => Err(ApiError::invalid(
                param,
                format!("cannot be combined with `{first}`: a request asks for one output constraint"),
            )),
            (Some(c), None) => {
                found = Some(c);
                Ok(())
            }
            (None, _) => Ok(()),
        }
    };
    let format_param = response_format_param(fields.response_format);
    take(response_format_constraint(fields.response_format)?.map(|c| (c, format_param)))?;
    if let Some(schema) = fields.json_schema {
        take(Some((checked_schema(schema, "json_schema")?, "json_schema")))?;
    }
    if let Some(grammar) = fields.grammar.filter(|g| !g.is_null()) {
        take(Some((grammar_constraint(grammar, "grammar")?, "grammar")))?;
    }
    if let Some(outputs) = fields.structured_outputs.filter(|o| !o.is_null()) {
        take(Some(structured_outputs(outputs)?))?;
    }
    if let Some(schema) = fields.guided_json {
        take(Some((checked_schema(schema, "guided_json")?, "guided_json")))?;
    }
    if let Some(regex) = fields.guided_regex {
        take(Some((regex_constraint(regex, "guided_regex")?, "guided_regex")))?;
    }
    if let Some(choice) = fields.guided_choice {
        take(Some((choice_constraint(choice, "guided_choice")?, "guided_choice")))?;
    }
    if let Some(grammar) = fields.guided_grammar {
        take(Some((lark_constraint(grammar, "guided_grammar")?, "guided_grammar")))?;
    }
    Ok(match found {
        Some((c, param)) => (Some(c), param),
        None => (None, "response_format"),
    })
}

/// vLLM's `structured_outputs` object.
fn structured_outputs(v: &Value) -> Result<(Constraint, &'static str), ApiError> {
    let Some(obj) = v.as_object() else {
        return Err(ApiError::invalid("structured_outputs", "must be an object"));
    };
    let asked: Vec<&String> = obj.iter().filter(|(_, v)| !v.is_null()).map(|(k, _)| k).collect();
    let (key, value) = match asked.as_slice() {
        [one] => (one.as_str(), &obj[one.as_str()]),
        [] => {
            return Err(ApiError::invalid(
                "structured_outputs",
                "names no constraint (`json`, `regex`, `choice` or `grammar`)",
            ))
        }
        _ => return Err(ApiError::invalid("structured_outputs", "must name one constraint, not several")),
    };
    match key {
        "json" => Ok((checked_schema(value, "structured_outputs.json")?, "structured_outputs.json")),
        "regex" => Ok((regex_constraint(value, "structured_outputs.regex")?, "structured_outputs.regex")),
        "choice" => Ok((choice_constraint(value, "structured_outputs.choice")?, "structured_outputs.choice")),
        "grammar" => Ok((lark_constraint(value, "structured_outputs.grammar")?, "structured_outputs.grammar")),
        other => Err(ApiError::invalid(
            &format!("structured_outputs.{other}"),
            "is not supported; use `json`, `regex`, `choice` or `grammar`",
        )),
    }
}

fn non_empty_str<'a>(v: &'a Value, param: &str) -> Result<&'a str, ApiError> {
    match v.as_str() {
        Some(s) if !s.trim().is_empty() => Ok(s),
        Some(_) => Err(ApiError::invalid(param, "must not be empty")),
        None => Err(ApiError::invalid(param, "must be a string")),
    }
}

fn regex_constraint(v: &Value, param: &str) -> Result<Constraint, ApiError> {
    Ok(Constraint::Regex(non_empty_str(v, param)?.to_owned()))
}

fn lark_constraint(v: &Value, param: &str) -> Result<Constraint, ApiError> {
    Ok(Constraint::Lark(non_empty_str(v, param)?.to_owned()))
}

/// llama-server's `grammar`: a Lark grammar marked `%llguidance` (as llama.cpp built with
/// llguidance reads it). GBNF is refused with a 400 rather than ignored: there is no GBNF
/// compiler here.
fn grammar_constraint(v: &Value, param: &str) -> Result<Constraint, ApiError> {
    let text = non_empty_str(v, param)?;
    match text.trim_start().starts_with("%llguidance") {
        // llguidance reads the `%llguidance {options}` line itself.
        true => Ok(Constraint::Lark(text.to_owned())),
        false => Err(ApiError::invalid(
            param,
            "GBNF grammars are not supported; send a Lark grammar after a `%llguidance {}` line, or use \
             `response_format` / `json_schema`",
        )),
    }
}

/// One of a list of literal strings, as a regular expression of their alternation.
fn choice_constraint(v: &Value, param: &str) -> Result<Constraint, ApiError> {
    let Some(choices) = v.as_array().filter(|c| !c.is_empty()) else {
        return Err(ApiError::invalid(param, "must be a non-empty list of strings"));
    };
    let mut alternatives = Vec::with_capacity(choices.len());
    for (i, c) in choices.iter().enumerate() {
        match c.as_str() {
            Some(s) if !s.is_empty() => alternatives.push(regex_literal(s)),
            _ => return Err(ApiError::invalid(&format!("{param}[{i}]"), "must be a non-empty string")),
        }
    }
    Ok(Constraint::Regex(format!("({})", alternatives.join("|"))))
}

/// `s` as a regular expression matching exactly it (the `regex` crate's syntax, which
/// llguidance's regexes follow).
fn regex_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn response_format_constraint(format: Option<&Value>) -> Result<Option<Constraint>, ApiError> {
    let Some(format) = format else { return Ok(None) };
    let Some(obj) = format.as_object() else {
        return Err(ApiError::invalid("response_format", "must be an object with a `type`"));
    };
    let kind = match obj.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(_) => return Err(ApiError::invalid("response_format.type", "must be a string")),
        None => return Err(ApiError::invalid("response_format.type", "is required")),
    };
    match kind {
        "text" => Ok(None),
        "json_object" => match obj.get("schema") {
            None => Ok(Some(schema_constraint(&serde_json::json!({"type": "object"})))),
            Some(schema) => checked_schema(schema, "response_format.schema").map(Some),
        },
        "json_schema" => {
            let Some(spec) = obj.get("json_schema") else {
                return Err(ApiError::invalid(
                    "response_format.json_schema",
                    "is required when `type` is `json_schema`",
                ));
            };
            let Some(spec) = spec.as_object() else {
                return Err(ApiError::invalid("response_format.json_schema", "must be an object"));
            };
            match spec.get("name") {
                None => {}
                Some(Value::String(name))
                    if !name.is_empty()
                        && name.len() <= MAX_NAME
                        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') => {}
                Some(_) => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.name",
                        format!("must be 1 to {MAX_NAME} letters, digits, underscores or dashes"),
                    ))
                }
            }
            if spec.get("strict").is_some_and(|s| !s.is_boolean() && !s.is_null()) {
                return Err(ApiError::invalid("response_format.json_schema.strict", "must be a boolean"));
            }
            match spec.get("schema") {
                None | Some(Value::Null) => Ok(Some(schema_constraint(&serde_json::json!({})))),
                Some(schema) => checked_schema(schema, "response_format.json_schema.schema").map(Some),
            }
        }
        _ => Err(ApiError::invalid("response_format.type", "must be one of `text`, `json_object`, `json_schema`")),
    }
}

/// A JSON Schema is an object (or `true`/`false`); what it says is checked when an engine
/// compiles it, and a schema the engine cannot follow is a 400 on the same field. Every API that
/// takes a schema for the answer (Responses' `text.format`, Anthropic's `output_config.format`)
/// goes through this.
pub fn checked_schema(schema: &Value, param: &str) -> Result<Constraint, ApiError> {
    match schema {
        Value::Object(_) | Value::Bool(true) => Ok(schema_constraint(schema)),
        Value::Bool(false) => Err(ApiError::invalid(param, "`false` admits no output")),
        _ => Err(ApiError::invalid(param, "must be a JSON Schema object")),
    }
}

fn schema_constraint(schema: &Value) -> Constraint {
    Constraint::JsonSchema(schema.to_string())
}

/// The field a constraint of `format` is blamed on when an engine cannot follow it.
fn response_format_param(format: Option<&Value>) -> &'static str {
    match format.and_then(|f| f.get("type")).and_then(Value::as_str) {
        Some("json_schema") => "response_format.json_schema.schema",
        Some("json_object") if format.is_some_and(|f| f.get("schema").is_some()) => "response_format.schema",
        _ => "response_format",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param_of(v: Value) -> String {
        output_constraint(OutputFields { response_format: Some(&v), ..Default::default() }).unwrap_err().param.unwrap()
    }

    fn schema_and(
        response_format: Option<&Value>,
        json_schema: Option<&Value>,
    ) -> Result<(Option<Constraint>, &'static str), ApiError> {
        output_constraint(OutputFields { response_format, json_schema, ..Default::default() })
    }

    #[test]
    fn each_form_gives_its_constraint() {
        assert_eq!(response_format_constraint(None).unwrap(), None);
        assert_eq!(response_format_constraint(Some(&json!({"type": "text"}))).unwrap(), None);
        assert_eq!(
            response_format_constraint(Some(&json!({"type": "json_object"}))).unwrap(),
            Some(Constraint::JsonSchema(r#"{"type":"object"}"#.into()))
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let strict = json!({"type": "json_schema", "json_schema": {"name": "a_1", "strict": true, "schema": schema}});
        let Some(Constraint::JsonSchema(text)) = response_format_constraint(Some(&strict)).unwrap() else { panic!() };
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), schema);
        let llama_server = json!({"type": "json_object", "schema": {"type": "array"}});
        assert_eq!(
            response_format_constraint(Some(&llama_server)).unwrap(),
            Some(Constraint::JsonSchema(r#"{"type":"array"}"#.into()))
        );
        let no_schema = json!({"type": "json_schema", "json_schema": {"name": "any"}});
        assert_eq!(response_format_constraint(Some(&no_schema)).unwrap(), Some(Constraint::JsonSchema("{}".into())));
        // llama-server's forms: no name, and a top-level `json_schema`.
        let unnamed = json!({"type": "json_schema", "json_schema": {"schema": {"const": "x"}}});
        assert_eq!(
            schema_and(Some(&unnamed), None).unwrap(),
            (Some(Constraint::JsonSchema(r#"{"const":"x"}"#.into())), "response_format.json_schema.schema")
        );
        assert_eq!(
            schema_and(None, Some(&json!({"const": "42"}))).unwrap(),
            (Some(Constraint::JsonSchema(r#"{"const":"42"}"#.into())), "json_schema")
        );
        assert_eq!(schema_and(None, None).unwrap(), (None, "response_format"));
        let both = schema_and(Some(&json!({"type": "json_object"})), Some(&json!({})));
        assert_eq!(both.unwrap_err().param.as_deref(), Some("json_schema"));
        assert_eq!(schema_and(None, Some(&json!(7))).unwrap_err().param.as_deref(), Some("json_schema"));
    }

    #[test]
    fn vllm_and_llama_server_fields_constrain_too() {
        let choice = json!(["yes", "no (maybe)"]);
        let (c, param) =
            output_constraint(OutputFields { guided_choice: Some(&choice), ..Default::default() }).unwrap();
        assert_eq!((c, param), (Some(Constraint::Regex(r"(yes|no \(maybe\))".into())), "guided_choice"));
        let outputs = json!({"regex": "[0-9]+"});
        let (c, param) =
            output_constraint(OutputFields { structured_outputs: Some(&outputs), ..Default::default() }).unwrap();
        assert_eq!((c, param), (Some(Constraint::Regex("[0-9]+".into())), "structured_outputs.regex"));
        let lark = json!("%llguidance {}\nstart: \"a\"");
        let (c, _) = output_constraint(OutputFields { grammar: Some(&lark), ..Default::default() }).unwrap();
        assert_eq!(c, Some(Constraint::Lark(lark.as_str().unwrap().into())));
        let gbnf = json!("root ::= \"a\"");
        let e = output_constraint(OutputFields { grammar: Some(&gbnf), ..Default::default() }).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("grammar"));
        let format = json!({"type": "json_object"});
        let e = output_constraint(OutputFields {
            response_format: Some(&format),
            guided_regex: Some(&json!("a")),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("guided_regex"));
        for bad in [json!({}), json!({"regex": "a", "choice": ["b"]}), json!({"choice": []}), json!({"xml": "x"})] {
            let e =
                output_constraint(OutputFields { structured_outputs: Some(&bad), ..Default::default() }).unwrap_err();
            assert!(e.param.unwrap().starts_with("structured_outputs"), "{bad}");
        }
    }

    #[test]
    fn malformed_formats_name_their_field() {
        assert_eq!(param_of(json!("json")), "response_format");
        assert_eq!(param_of(json!({})), "response_format.type");
        assert_eq!(param_of(json!({"type": "yaml"})), "response_format.type");
        assert_eq!(param_of(json!({"type": "json_schema"})), "response_format.json_schema");
        assert_eq!(
            param_of(json!({"type": "json_schema", "json_schema": {"name": "has space", "schema": {}}})),
            "response_format.json_schema.name"
        );
        assert_eq!(
            param_of(json!({"type": "json_schema", "json_schema": {"name": "n", "strict": "yes"}})),
            "response_format.json_schema.strict"
        );
        assert_eq!(
            param_of(json!({"type": "json_schema", "json_schema": {"name": "n", "schema": [1]}})),
            "response_format.json_schema.schema"
        );
        assert_eq!(param_of(json!({"type": "json_object", "schema": false})), "response_format.schema");
    }
}

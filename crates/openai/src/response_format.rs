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
//! llama-server's top-level `json_schema` parameter means the same as a `json_schema` format.

use crate::ApiError;
use llmr_engine_types::Constraint;
use serde_json::Value;

/// OpenAI's bound on `json_schema.name`.
const MAX_NAME: usize = 64;

/// The constraint a request's `response_format` or top-level `json_schema` asks for (`None`: free
/// text), and the field an engine's refusal of it is blamed on.
pub fn output_constraint(
    response_format: Option<&Value>,
    json_schema: Option<&Value>,
) -> Result<(Option<Constraint>, &'static str), ApiError> {
    let from_format = response_format_constraint(response_format)?;
    match (json_schema, from_format) {
        (None, c) => Ok((c, response_format_param(response_format))),
        (Some(_), Some(_)) => Err(ApiError::invalid("json_schema", "cannot be combined with a JSON `response_format`")),
        (Some(schema), None) => Ok((Some(checked_schema(schema, "json_schema")?), "json_schema")),
    }
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
        output_constraint(Some(&v), None).unwrap_err().param.unwrap()
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
            output_constraint(Some(&unnamed), None).unwrap(),
            (Some(Constraint::JsonSchema(r#"{"const":"x"}"#.into())), "response_format.json_schema.schema")
        );
        assert_eq!(
            output_constraint(None, Some(&json!({"const": "42"}))).unwrap(),
            (Some(Constraint::JsonSchema(r#"{"const":"42"}"#.into())), "json_schema")
        );
        assert_eq!(output_constraint(None, None).unwrap(), (None, "response_format"));
        let both = output_constraint(Some(&json!({"type": "json_object"})), Some(&json!({})));
        assert_eq!(both.unwrap_err().param.as_deref(), Some("json_schema"));
        assert_eq!(output_constraint(None, Some(&json!(7))).unwrap_err().param.as_deref(), Some("json_schema"));
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

//! A request's constraint as llguidance's grammar, with the JSON layout llmr chooses.

use llguidance::api::TopLevelGrammar;
use llmr_engine_types::Constraint;
use serde_json::{json, Value};
use std::fmt;

/// A constraint that does not compile: the grammar engine's own message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileError(pub String);

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CompileError {}

pub(crate) fn grammar_of(constraint: &Constraint) -> Result<TopLevelGrammar, CompileError> {
    Ok(match constraint {
        Constraint::JsonSchema(text) => {
            let schema: Value =
                serde_json::from_str(text).map_err(|e| CompileError(format!("the JSON schema is not JSON: {e}")))?;
            TopLevelGrammar::from_json_schema(with_layout(schema))
        }
        Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
        Constraint::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
    })
}

/// JSON on one line, spaced as Python's `json.dumps` spaces it (what models saw most): with
/// flexible whitespace a small model at a high temperature can fill its budget with newlines
/// and never close the object. A schema that says otherwise (`x-guidance`) keeps its own.
fn with_layout(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance")
            .or_insert_with(|| json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}));
    }
    schema
}

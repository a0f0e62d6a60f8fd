//! What a generation's output must conform to: the grammar an engine masks its logits with
//! (`llmr_infer_request.constraint_kind` and `constraint` on the ABI).

/// A grammar as text, in one of the forms engines compile (through `llmr-constraint`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Constraint {
    /// A JSON Schema document; the output is one JSON value valid against it.
    JsonSchema(String),
    /// A regular expression the whole output matches.
    Regex(String),
    /// A Lark grammar in llguidance's dialect (which can embed JSON schemas with `%json`).
    Lark(String),
}

impl Constraint {
    /// The grammar's text.
    pub fn text(&self) -> &str {
        match self {
            Constraint::JsonSchema(s) | Constraint::Regex(s) | Constraint::Lark(s) => s,
        }
    }
}

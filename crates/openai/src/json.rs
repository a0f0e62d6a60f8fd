//! Request bodies parsed with the location of the first problem named in the error.

use crate::ApiError;
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// Parses a JSON request body. Malformed JSON names line and column; a wrong shape names the
/// field path (`messages[0].role`), so a 400 always says where.
pub fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("request body is empty; expected a JSON object"));
    }
    let de = &mut serde_json::Deserializer::from_slice(body);
    let result: Result<T, _> = serde_path_to_error::deserialize(de);
    match result {
        Ok(v) => Ok(v),
        Err(err) => {
            let path = err.path().to_string();
            let inner = err.into_inner();
            if inner.is_syntax() || inner.is_eof() {
                return Err(ApiError::bad_request(format!("malformed JSON in request body: {inner}")));
            }
            // serde's own message ends with " at line L column C"; the path says more.
            let msg = inner.to_string();
            let msg = msg.split(" at line ").next().unwrap_or(&msg).to_owned();
            if path == "." {
                Err(ApiError::bad_request(format!("request body: {msg}")))
            } else {
                Err(ApiError::invalid(&path, msg))
            }
        }
    }
}

/// Reads `null` as the type's default (clients send `"tool_calls": null` as often as they leave it
/// out).
pub(crate) fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ChatCompletionRequest;

    #[test]
    fn syntax_errors_name_line_and_column() {
        let e = parse_body::<ChatCompletionRequest>(b"{\"model\": \"m\",\n \"messages\": [}").unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("line 2"), "{}", e.message);
    }

    #[test]
    fn shape_errors_name_the_field_path() {
        let e = parse_body::<ChatCompletionRequest>(br#"{"model":"m","messages":[{"role":"wizard","content":"x"}]}"#)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"), "{}", e.message);
        let e = parse_body::<ChatCompletionRequest>(br#"{"model":"m","messages":[],"temperature":"hot"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = parse_body::<ChatCompletionRequest>(br#"{"messages":[]}"#).unwrap_err();
        assert!(e.message.contains("model"), "{}", e.message);
        let e = parse_body::<ChatCompletionRequest>(b"  ").unwrap_err();
        assert!(e.message.contains("empty"));
    }
}

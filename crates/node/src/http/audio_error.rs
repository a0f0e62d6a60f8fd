//! Audio input errors as API errors: what the client sent is named (`file`), and a limit passed
//! is a 413.

use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use llmr_audio::AudioError;
use llmr_openai::ApiError;

fn too_large(message: String) -> ApiError {
    let mut e = ApiError::invalid("file", message);
    e.status = 413;
    e
}

/// An upload the body limit stopped, or a body that could not be read.
pub fn upload_error(rejection: BytesRejection, limit: usize) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        too_large(format!("the upload is larger than the limit of {} MiB", limit >> 20))
    } else {
        ApiError::bad_request(format!("could not read the request body: {rejection}"))
    }
}

/// Audio that did not decode or encode, or decoded past a limit: the field at fault, the status
/// the audio crate gives (400, 413 or 500) and its code.
pub fn audio_error(e: &AudioError) -> ApiError {
    let mut api = match e.field() {
        Some(field) => ApiError::invalid(field, e),
        None => ApiError::server(e.to_string()),
    };
    api.status = e.status();
    api.with_code(e.code())
}

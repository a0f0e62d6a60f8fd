//! Why a registration was refused, and the one place it becomes an HTTP answer.

use llmr_hub::HubError;
use llmr_openai::ApiError;
use llmr_telemetry::error_chain;

#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// 400: the request, or what it points at, cannot be registered (`param` names the field).
    #[error("{param}: {message}")]
    Invalid { param: &'static str, message: String },
    /// 404: the repository, revision, file, path or URL does not exist.
    #[error("{param}: {message}")]
    NotFound { param: &'static str, message: String },
    /// 502: the hub (or the URL's server) failed or answered something unusable.
    #[error("{message}")]
    Upstream { message: String },
    /// 500: the router itself failed (a misconfigured hub endpoint, a lost task).
    #[error("{message}")]
    Internal { message: String },
}

impl RegisterError {
    pub(crate) fn invalid(param: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid { param, message: message.into() }
    }

    pub(crate) fn not_found(param: &'static str, message: impl Into<String>) -> Self {
        Self::NotFound { param, message: message.into() }
    }

    pub(crate) fn upstream(message: impl Into<String>) -> Self {
        Self::Upstream { message: message.into() }
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::Internal { message: message.into() }
    }

    /// The one mapping of the hub client's errors: what does not exist or is refused is 404 on
    /// `param` (the field naming what was read), a listing naming an escaping path is 400, a
    /// hub that fails or answers something unusable is 502.
    pub(crate) fn hub(param: &'static str, error: HubError) -> Self {
        let message = error_chain(&error);
        match error {
            HubError::RevisionNotFound { .. } => Self::not_found("revision", message),
            HubError::RepoNotFound { .. } | HubError::FileNotFound { .. } | HubError::Unauthorized { .. } => {
                Self::not_found(param, message)
            }
            HubError::Http { status: 401 | 403 | 404, .. } => Self::not_found(param, message),
            HubError::UnsafePath { .. } => Self::invalid(param, message),
            HubError::InvalidEndpoint { .. } | HubError::Io { .. } => Self::internal(message),
            HubError::Http { .. }
            | HubError::BadResponse { .. }
            | HubError::Request { .. }
            | HubError::Transfer { .. }
            | HubError::SizeMismatch { .. }
            | HubError::Sha256Mismatch { .. } => Self::upstream(message),
        }
    }

    pub fn status(&self) -> u16 {
        match self {
            Self::Invalid { .. } => 400,
            Self::NotFound { .. } => 404,
            Self::Upstream { .. } => 502,
            Self::Internal { .. } => 500,
        }
    }

    /// The request field the error is about.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            Self::Invalid { param, .. } | Self::NotFound { param, .. } => Some(param),
            Self::Upstream { .. } | Self::Internal { .. } => None,
        }
    }

    /// Stable, for the JSON body's `code` and metrics labels.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Invalid { .. } => "invalid_registration",
            Self::NotFound { .. } => "source_not_found",
            Self::Upstream { .. } => "hub_error",
            Self::Internal { .. } => "internal_error",
        }
    }

    /// The message, prefixed with the field's name when there is one (as OpenAI's errors are).
    pub fn message(&self) -> String {
        self.to_string()
    }

    /// The OpenAI-shaped error the `/v0/models` handler answers with.
    pub fn into_api_error(self) -> ApiError {
        let mut error = ApiError::with_status(self.status(), self.message()).with_code(self.code());
        error.param = self.param().map(str::to_string);
        error
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_become_openai_errors_naming_the_field() {
        let e = RegisterError::invalid("format", "set it").into_api_error();
        assert_eq!(
            (e.status, e.kind, e.param.as_deref(), e.message.as_str()),
            (400, "invalid_request_error", Some("format"), "format: set it")
        );
        assert_eq!(e.code.as_deref(), Some("invalid_registration"));
        let e = RegisterError::upstream("hub down").into_api_error();
        assert_eq!((e.status, e.kind, e.param, e.message.as_str()), (502, "server_error", None, "hub down"));
        assert_eq!(RegisterError::not_found("repo", "x").status(), 404);
    }

    #[test]
    fn hub_errors_map_to_404_400_and_502() {
        let hub = |e: HubError| {
            let e = RegisterError::hub("url", e);
            (e.status(), e.param())
        };
        let endpoint = "http://hub".to_string();
        let (repo, revision) = ("o/m".to_string(), "v9".to_string());
        assert_eq!(hub(HubError::RepoNotFound { repo: repo.clone(), endpoint: endpoint.clone() }), (404, Some("url")));
        assert_eq!(hub(HubError::RevisionNotFound { repo, revision, endpoint }), (404, Some("revision")));
        assert_eq!(hub(HubError::Http { url: "http://x/m.gguf".into(), status: 403 }), (404, Some("url")));
        assert_eq!(hub(HubError::Http { url: "http://x/m.gguf".into(), status: 500 }), (502, None));
        let problem = llmr_cluster::PathProblem::ParentComponent;
        let unsafe_path = HubError::UnsafePath { repo: "o/m".into(), file: "../x".into(), problem };
        assert_eq!(hub(unsafe_path), (400, Some("url")));
    }
}

//! What can go wrong talking to a hub, in one type: every caller (`llmr pull`, the router's
//! registration, the node's sync) shows these messages or maps them, each in one place.

use llmr_cluster::PathProblem;
use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },
    #[error("model '{repo}' not found at {endpoint}")]
    RepoNotFound { repo: String, endpoint: String },
    #[error("model '{repo}' has no revision '{revision}' at {endpoint}")]
    RevisionNotFound { repo: String, revision: String, endpoint: String },
    #[error("file '{file}' of model '{repo}' not found at {endpoint}")]
    FileNotFound { repo: String, file: String, endpoint: String },
    #[error("{endpoint} refused access to '{repo}' (HTTP {status}); {}", if *token_sent {
        "the HF_TOKEN sent does not grant access to it"
    } else {
        "if it is gated or private, set HF_TOKEN to an access token"
    })]
    Unauthorized { repo: String, endpoint: String, status: u16, token_sent: bool },
    /// A listing named a file that could leave a model directory.
    #[error("refusing file name {file:?} from '{repo}': it could escape the model directory (it {problem})")]
    UnsafePath { repo: String, file: String, problem: PathProblem },
    /// Any other status; for a URL that is not a hub repository's file, every failed status.
    #[error("{url}: HTTP {status}")]
    Http { url: String, status: u16 },
    #[error("{url}: {reason}")]
    BadResponse { url: String, reason: String },
    #[error("request to {url} failed")]
    Request {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url}: the download broke off")]
    Transfer {
        url: String,
        #[source]
        source: io::Error,
    },
    #[error("{file}: expected {expected} bytes, received {actual}")]
    SizeMismatch { file: String, expected: u64, actual: u64 },
    #[error("{file}: sha256 mismatch: expected {expected}, the download has {actual}; the download was removed")]
    Sha256Mismatch { file: String, expected: String, actual: String },
    /// A local file of a download (the partial file, its folder, the destination).
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl HubError {
    pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(io::Error) -> Self + '_ {
        move |source| Self::Io { path: path.to_path_buf(), source }
    }

    /// The connection failed or broke off: the same call may well succeed later (and a download
    /// resumes where it stopped).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Request { source, .. } => !source.is_builder(),
            Self::Transfer { .. } => true,
            Self::Http { status, .. } => *status >= 500,
            _ => false,
        }
    }
}

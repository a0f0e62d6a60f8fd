//! What can go wrong in the node's core (models, admission, generation), in the node's own
//! terms. The HTTP layer maps it to a status and an OpenAI error in one place
//! (`http/error.rs`); the core never speaks the wire.

use llmr_engine_host::{CallError, Capability};

#[derive(Debug, Clone, thiserror::Error)]
pub enum NodeError {
    #[error("the model `{0}` does not exist")]
    ModelNotFound(String),
    /// The model exists but cannot do what the endpoint asks (chat with an embedding model).
    #[error("`{model}` {}", incapable(*.needs))]
    Incapable { model: String, needs: Capability },
    /// Every slot is busy and the queue is full.
    #[error("the server is busy: {running} requests running and {queued} queued (the queue limit); retry shortly")]
    QueueFull { running: usize, queued: usize },
    /// Another modality's requests hold the GPU (spec 000: refused at once, not queued).
    #[error("the GPU is serving {holding} requests; {wanted} requests are refused until they finish (one modality at a time on a GPU); retry shortly")]
    DeviceBusy { wanted: Capability, holding: Capability },
    /// The model was unloaded while the request waited for it.
    #[error("the model is being unloaded")]
    Unloading,
    #[error(
        "not enough memory to load `{model}` now: the budget is {budget_mib} MiB, {held_mib} MiB are held by models serving requests"
    )]
    NoMemory { model: String, budget_mib: u64, held_mib: u64 },
    /// No GPU has room for the model, with every idle model unloaded (spec 003: free memory is
    /// checked before a load).
    #[error(
        "no GPU has room for `{model}` now: it needs about {needed_mib} MiB, the GPU with the most free memory has {free_mib} MiB and its models are serving requests"
    )]
    NoDeviceMemory { model: String, needed_mib: u64, free_mib: u64 },
    #[error("loading model `{model}` failed: {}", .error.message)]
    LoadFailed { model: String, error: CallError },
    /// The chat template could not render the conversation.
    #[error("the chat template rejected them: {0}")]
    Template(String),
    /// The engine failed a call for this request.
    #[error("{}", .0.message)]
    Engine(CallError),
    /// A bug or a lost task in the node itself.
    #[error("{0}")]
    Internal(String),
}

fn incapable(needs: Capability) -> String {
    match needs {
        Capability::Text => "is an embedding model; it cannot generate text".into(),
        Capability::Embedding => "does not produce embeddings".into(),
        other => format!("cannot serve `{other}` requests"),
    }
}

impl From<CallError> for NodeError {
    fn from(e: CallError) -> Self {
        NodeError::Engine(e)
    }
}

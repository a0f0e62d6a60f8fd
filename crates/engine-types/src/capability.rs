//! What a model can serve, named as in plugin manifests' `modalities` and in `model_info`'s
//! `capabilities`.

use serde::{Serialize, Serializer};
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Capability {
    Text,
    Embedding,
    Vision,
    /// Speech to text.
    Asr,
    /// Text to speech.
    Tts,
    Image,
}

impl Capability {
    pub const ALL: [Capability; 6] = [
        Capability::Text,
        Capability::Embedding,
        Capability::Vision,
        Capability::Asr,
        Capability::Tts,
        Capability::Image,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Embedding => "embedding",
            Self::Vision => "vision",
            Self::Asr => "asr",
            Self::Tts => "tts",
            Self::Image => "image",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Capability {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

//! A generated token's probability, as an engine reports it and the wire formats render it.

/// One generated token with its log probability and the likeliest alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub text: String,
    pub logprob: f32,
    pub top: Vec<(String, f32)>,
}

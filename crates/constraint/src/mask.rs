//! One request's constraint state: which tokens may come next.

use llguidance::Matcher;
use std::sync::Arc;

/// The grammar state of one constrained generation.
pub struct TokenMask {
    /// Boxed: the parser state is large, and masks travel inside engines' job messages.
    matcher: Box<Matcher>,
    end_ids: Arc<[u32]>,
}

impl TokenMask {
    pub(crate) fn new(matcher: Matcher, end_ids: Arc<[u32]>) -> Self {
        TokenMask { matcher: Box::new(matcher), end_ids }
    }

    /// Writes `logits` into `masked` with every token the grammar does not allow next at minus
    /// infinity. Once the grammar is complete (nothing may follow), only the end tokens are left.
    /// An error is the grammar engine's (a limit reached); the caller ends the request with it.
    pub fn apply(&mut self, logits: &[f32], masked: &mut Vec<f32>) -> Result<(), String> {
        masked.clear();
        masked.resize(logits.len(), f32::NEG_INFINITY);
        if self.matcher.is_stopped() {
            if let Some(e) = self.matcher.get_error() {
                return Err(e);
            }
            for &id in self.end_ids.iter() {
                masked[id as usize] = logits[id as usize];
            }
            return Ok(());
        }
        let allowed = self.matcher.compute_mask().map_err(|e| e.to_string())?;
        // Allowed tokens are usually few (a JSON key, a digit): copying them onto a filled row
        // costs far less than copying the row and striking out the rest.
        let n = logits.len();
        allowed.iter_set_entries(|id| {
            if id < n {
                masked[id] = logits[id];
            }
        });
        Ok(())
    }

    /// Follows a token drawn from masked logits. An end token is accepted where the grammar is
    /// complete (the draw could not have picked it elsewhere).
    pub fn accept(&mut self, token: u32) -> Result<(), String> {
        if self.matcher.is_stopped() && self.end_ids.contains(&token) {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| e.to_string())
    }

    /// Whether the output so far is a complete sentence of the grammar.
    pub fn is_complete(&mut self) -> bool {
        self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false)
    }

    /// Whether the grammar allows nothing more than an end token.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

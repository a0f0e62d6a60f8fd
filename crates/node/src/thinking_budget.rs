//! A reasoning model's thinking budget (Anthropic's `thinking.budget_tokens`, Qwen's
//! `thinking_budget`): once the model has thought that many tokens without closing its
//! thinking, the generation is stopped, the close marker is written after the thinking, and the
//! answer is generated from there, continuing the same prompt. This works with any engine,
//! since the continuation is a prompt that shares the whole prefix (the engines' prefix reuse
//! makes it cheap); the answer's text carries the marker, so every reader splits it as if the
//! model had closed its thinking itself.

use llmr_engine_host::Constraint;

/// The budget a rendered prompt carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinkingBudget {
    /// Tokens of thinking allowed (at least one).
    pub tokens: u32,
    pub open: &'static str,
    pub close: &'static str,
    /// What is written after thinking cut short, before the answer (the format's own).
    pub resume: &'static str,
    /// The prompt opened the thinking already.
    pub inside: bool,
    /// The constraint for the answer once the thinking is closed, where the prompt's own holds
    /// thinking first (`prompt::after_thinking`); `None`: the same as before the cut.
    pub answer_constraint: Option<Constraint>,
}

impl ThinkingBudget {
    /// What is written after thinking cut short, before the answer.
    pub fn closing(&self) -> String {
        self.resume.to_owned()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: the model may still open its thinking.
    Start,
    /// Thinking, this many tokens so far.
    Thinking(u32),
    /// The thinking is over (closed, or never opened).
    Done,
}

/// Follows a generation's text and says when the budget is spent.
#[derive(Debug)]
pub struct BudgetWatch {
    budget: ThinkingBudget,
    state: State,
    /// Everything generated so far.
    text: String,
    /// Where the thinking starts in `text` (after the open marker).
    thinking_from: usize,
    cut: bool,
}

impl BudgetWatch {
    pub fn new(budget: ThinkingBudget) -> Self {
        let state = if budget.inside { State::Thinking(0) } else { State::Start };
        BudgetWatch { budget, state, text: String::new(), thinking_from: 0, cut: false }
    }

    /// Takes one generated token's text; false once the budget is spent (stop generating).
    pub fn push(&mut self, piece: &str) -> bool {
        self.text.push_str(piece);
        if self.state == State::Start {
            let trimmed = self.text.trim_start();
            if let Some(rest) = trimmed.strip_prefix(self.budget.open) {
                self.thinking_from = self.text.len() - rest.len();
                self.state = State::Thinking(0);
                // The token that opened it counts when it carries thinking too.
                if rest.trim().is_empty() {
                    return true;
                }
            } else if !trimmed.is_empty() && !self.budget.open.starts_with(trimmed) {
                self.state = State::Done;
            }
        }
        if let State::Thinking(n) = self.state {
            if self.text[self.thinking_from..].contains(self.budget.close) {
                self.state = State::Done;
                return true;
            }
            let n = n + 1;
            self.state = State::Thinking(n);
            if n >= self.budget.tokens.max(1) {
                self.cut = true;
                return false;
            }
        }
        true
    }

    /// Whether the generation was stopped for the budget.
    pub fn cut(&self) -> bool {
        self.cut
    }

    /// The text generated before the cut.
    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn budget(&self) -> &ThinkingBudget {
        &self.budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(tokens: u32, inside: bool) -> ThinkingBudget {
        ThinkingBudget {
            tokens,
            open: "<think>",
            close: "</think>",
            resume: "\n</think>\n\n",
            inside,
            answer_constraint: None,
        }
    }

    fn run(watch: &mut BudgetWatch, pieces: &[&str]) -> usize {
        pieces.iter().take_while(|p| watch.push(p)).count()
    }

    #[test]
    fn thinking_opened_by_the_prompt_is_cut_after_the_budget() {
        let mut w = BudgetWatch::new(budget(3, true));
        assert_eq!(run(&mut w, &["a", " b", " c", " d"]), 2, "the third token is the last");
        assert!(w.cut());
        assert_eq!(w.text(), "a b c");
    }

    #[test]
    fn thinking_the_model_opens_counts_from_its_first_token() {
        let mut w = BudgetWatch::new(budget(2, false));
        assert_eq!(run(&mut w, &[" ", "<think>", "x", " y", " z"]), 3);
        assert!(w.cut());
        // The marker cut into pieces, and a marker token that carries thinking too.
        let mut w = BudgetWatch::new(budget(2, false));
        assert_eq!(run(&mut w, &["<th", "ink>x", " y", " z"]), 2);
        assert_eq!(w.text(), "<think>x y");
    }

    #[test]
    fn harmony_thinking_is_the_analysis_message() {
        let harmony = |tokens| ThinkingBudget {
            tokens,
            open: "<|channel|>analysis<|message|>",
            close: "<|end|>",
            resume: "<|end|><|start|>assistant<|channel|>final<|message|>",
            inside: false,
            answer_constraint: None,
        };
        // The markers are tokens of their own; the header does not count.
        let mut w = BudgetWatch::new(harmony(2));
        assert_eq!(run(&mut w, &["<|channel|>", "analysis", "<|message|>", "a", " b", " c"]), 4);
        assert!(w.cut());
        assert_eq!(w.budget().closing(), "<|end|><|start|>assistant<|channel|>final<|message|>");
        // An answer straight to the final channel is not thinking.
        let mut w = BudgetWatch::new(harmony(1));
        assert_eq!(run(&mut w, &["<|channel|>", "final", "<|message|>", "a", " b"]), 5);
        assert!(!w.cut());
    }

    #[test]
    fn thinking_closed_in_time_or_never_opened_is_left_alone() {
        let mut w = BudgetWatch::new(budget(3, false));
        assert_eq!(run(&mut w, &["<think>", "a", "</th", "ink>", "b", "c", "d", "e"]), 8);
        assert!(!w.cut());
        let mut w = BudgetWatch::new(budget(1, false));
        assert_eq!(run(&mut w, &["Hello", " there", " friend"]), 3);
        assert!(!w.cut());
    }
}

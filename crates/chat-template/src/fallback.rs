//! The template used when a model ships none: ChatML, which most instruction-tuned models
//! without their own template were trained on (and the format transformers once defaulted to).

use crate::{ChatTemplate, SpecialTokens};

/// ChatML: `<|im_start|>{role}\n{content}<|im_end|>\n` per message. Content parts contribute
/// their text; tool calls are not rendered.
pub const CHATML_TEMPLATE: &str = "\
{%- for message in messages %}
<|im_start|>{{ message.role }}
{% if message.content is string %}{{ message.content }}\
{% elif message.content %}{% for part in message.content if part.type == 'text' %}{{ part.text }}{% endfor %}\
{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% endif %}";

impl ChatTemplate {
    /// The ChatML template, for a model that has no chat template of its own.
    pub fn chatml(tokens: SpecialTokens) -> Self {
        ChatTemplate::new(CHATML_TEMPLATE, tokens).expect("the built-in ChatML template compiles")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ContentPart, Message, RenderInput, Role};

    #[test]
    fn chatml_output() {
        let t = ChatTemplate::chatml(SpecialTokens::default());
        let messages = [Message::system("Be brief."), Message::user("Hi")];
        let with_prompt = t.render(&RenderInput::new(&messages, true)).unwrap();
        assert_eq!(
            with_prompt,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let without = t.render(&RenderInput::new(&messages, false)).unwrap();
        assert_eq!(without, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
    }

    #[test]
    fn chatml_renders_text_parts() {
        let t = ChatTemplate::chatml(SpecialTokens::default());
        let parts =
            vec![ContentPart::Text { text: "a".into() }, ContentPart::Image {}, ContentPart::Text { text: "b".into() }];
        let messages = [Message::with_parts(Role::User, parts)];
        assert_eq!(t.render(&RenderInput::new(&messages, false)).unwrap(), "<|im_start|>user\nab<|im_end|>\n");
    }
}

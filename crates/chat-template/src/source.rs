//! Source rewrites that let minijinja parse what transformers' jinja2 environment accepts.

use std::borrow::Cow;

/// Rewrites transformers' `{% generation %}...{% endgeneration %}` (which marks assistant tokens
/// for training masks and renders its body unchanged) as `{% with %}...{% endwith %}`.
///
/// `with` because jinja2 renders the body as a call block, a scope of its own: variables set
/// inside it do not leak out. Whitespace-control markers are kept, so trimming is unchanged.
pub(crate) fn rewrite_generation_tags(source: &str) -> Cow<'_, str> {
    if !source.contains("generation") {
        return Cow::Borrowed(source);
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        match rewrite_tag(tag) {
            Some((replacement, consumed)) => {
                out.push_str(&replacement);
                rest = &tag[consumed..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// If `tag` starts with a `generation`/`endgeneration` block tag, returns its replacement and
/// the length of the original tag.
fn rewrite_tag(tag: &str) -> Option<(String, usize)> {
    let end = tag.find("%}")?;
    let open_len = if tag[2..].starts_with(['-', '+']) { 3 } else { 2 };
    let inner = tag.get(open_len..end)?.trim_end();
    let close = match inner.chars().last() {
        Some('-') => "-",
        Some('+') => "+",
        _ => "",
    };
    let keyword = match inner[..inner.len() - close.len()].trim() {
        "generation" => "with",
        "endgeneration" => "endwith",
        _ => return None,
    };
    Some((format!("{} {keyword} {close}%}}", &tag[..open_len]), end + 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_generation_blocks_keeping_whitespace_control() {
        let src = "a{%- generation -%}b{% endgeneration %}c{%+ generation %}{%endgeneration-%}";
        assert_eq!(rewrite_generation_tags(src), "a{%- with -%}b{% endwith %}c{%+ with %}{% endwith -%}");
    }

    #[test]
    fn leaves_other_tags_alone() {
        let src = "{% if add_generation_prompt %}x{% endif %}{{ '{%' }}";
        assert_eq!(rewrite_generation_tags(src), src);
    }
}

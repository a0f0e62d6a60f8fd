//! The minijinja environment configured as transformers configures jinja2 for chat templates.

use crate::{globals, pycompat, pyobjects, tojson};
use minijinja::{AutoEscape, Environment, UndefinedBehavior};

pub(crate) const TEMPLATE_NAME: &str = "chat_template";

/// An environment holding no template yet. transformers uses
/// `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])`
/// and leaves jinja2's defaults otherwise: no autoescape, the trailing newline of the source
/// dropped, lenient undefined values.
pub(crate) fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    // `.strip()`, `.split()`, `.items()`, `.get()`...; mutating methods such as `.append()` stay
    // unknown, as they are forbidden by jinja2's immutable sandbox.
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(pycompat::format_output);

    // transformers' own `tojson`: Python's json.dumps, not minijinja's HTML-safe JSON.
    env.add_filter("tojson", tojson::tojson_filter);
    // Filters that read their input through Python's str().
    env.add_filter("string", pycompat::string);
    env.add_filter("trim", pycompat::trim);
    env.add_filter("upper", pycompat::upper);
    env.add_filter("lower", pycompat::lower);
    env.add_filter("capitalize", pycompat::capitalize);
    env.add_filter("title", pycompat::title);
    env.add_filter("replace", pycompat::replace);
    env.add_filter("join", pycompat::join);
    // Tests and filters where Python's types behave differently from minijinja's.
    env.add_filter("length", pycompat::length);
    env.add_filter("count", pycompat::length);
    env.add_test("sequence", pycompat::is_sequence);
    env.add_test("iterable", pyobjects::is_iterable);
    env.add_test("none", pyobjects::is_none);
    env.add_filter("map", pyobjects::map);
    env.add_filter("select", pyobjects::select);
    env.add_filter("reject", pyobjects::reject);
    env.add_filter("selectattr", pyobjects::selectattr);
    env.add_filter("rejectattr", pyobjects::rejectattr);

    env.add_function("raise_exception", globals::raise_exception);
    env.add_function("strftime_now", globals::strftime_now);
    env
}

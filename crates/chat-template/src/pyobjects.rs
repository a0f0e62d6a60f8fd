//! Two Python values that minijinja has no exact counterpart for.
//!
//! - `None` as transformers passes it for `tools` and `documents` when there are none: minijinja
//!   iterates its own `none` as an empty list and calls it iterable, where Python raises
//!   `TypeError`, so templates that loop over `tools` unguarded would render instead of failing.
//! - The generators that jinja2's `map`, `select`, `reject`, `selectattr` and `rejectattr`
//!   return: always truthy (even when empty), without a length, and not JSON-serializable.

use minijinja::value::{Enumerator, Object, ObjectExt, ObjectRepr, Rest, Value};
use minijinja::{filters, Error, State};
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

#[derive(Debug)]
pub(crate) struct PyNone;

impl Object for PyNone {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }

    fn is_true(self: &Arc<Self>) -> bool {
        false
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::NonEnumerable
    }

    fn render(self: &Arc<Self>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("None")
    }
}

/// Python's `None` for a template variable the caller did not provide.
pub(crate) fn py_none() -> Value {
    Value::from_object(PyNone)
}

/// `value is none`, for minijinja's `none` and for [`PyNone`].
pub(crate) fn is_none(value: &Value) -> bool {
    value.is_none() || value.downcast_object_ref::<PyNone>().is_some()
}

/// jinja2's `iterable` test: `iter(value)` succeeds, so not for `None`.
pub(crate) fn is_iterable(value: &Value) -> bool {
    !is_none(value) && value.try_iter().is_ok()
}

#[derive(Debug)]
pub(crate) struct Generator(Vec<Value>);

impl Object for Generator {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Iterable
    }

    fn is_true(self: &Arc<Self>) -> bool {
        true
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.mapped_enumerator(|this| Box::new(this.0.iter().cloned()))
    }

    /// Unknown, so that `length` fails as `len(generator)` does.
    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        None
    }

    fn render(self: &Arc<Self>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<generator object>")
    }
}

pub(crate) fn is_generator(value: &Value) -> bool {
    value.downcast_object_ref::<Generator>().is_some()
}

fn generator(items: Vec<Value>) -> Value {
    Value::from_object(Generator(items))
}

/// Runs a minijinja filter as the jinja2 generator does, which starts with `if value:` and so
/// yields nothing for a falsy input (`none | selectattr(...)` is empty, not an error).
fn lazily(value: Value, filter: impl FnOnce(Value) -> Result<Vec<Value>, Error>) -> Result<Value, Error> {
    if !value.is_true() {
        return Ok(generator(Vec::new()));
    }
    filter(value).map(generator)
}

pub(crate) fn map(state: &State, value: Value, args: Rest<Value>) -> Result<Value, Error> {
    lazily(value, |v| filters::map(state, v, args))
}

pub(crate) fn select(
    state: &State,
    value: Value,
    test: Option<Cow<'_, str>>,
    args: Rest<Value>,
) -> Result<Value, Error> {
    lazily(value, |v| filters::select(state, v, test, args))
}

pub(crate) fn reject(
    state: &State,
    value: Value,
    test: Option<Cow<'_, str>>,
    args: Rest<Value>,
) -> Result<Value, Error> {
    lazily(value, |v| filters::reject(state, v, test, args))
}

pub(crate) fn selectattr(
    state: &State,
    value: Value,
    attr: Cow<'_, str>,
    test: Option<Cow<'_, str>>,
    args: Rest<Value>,
) -> Result<Value, Error> {
    lazily(value, |v| filters::selectattr(state, v, attr, test, args))
}

pub(crate) fn rejectattr(
    state: &State,
    value: Value,
    attr: Cow<'_, str>,
    test: Option<Cow<'_, str>>,
    args: Rest<Value>,
) -> Result<Value, Error> {
    lazily(value, |v| filters::rejectattr(state, v, attr, test, args))
}

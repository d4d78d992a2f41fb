//! What Jinja2 under transformers does that minijinja does differently by default: the
//! `raise_exception` global, transformers' `tojson` (Python's `json.dumps` separators,
//! keys in insertion order, non-ASCII kept), and Python's `str()` of values where a
//! template prints or `| string`s them (lists and dicts as Python writes them:
//! `['string', 'null']`, `{'k': True}`), and Python's idea of what is iterable (not none).

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Output, State};
use serde::Serialize;
use std::fmt::Write;

/// Registers the Jinja2/transformers behaviour on `env`.
pub fn install(env: &mut Environment<'static>) {
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", crate::strftime::strftime_now);
    env.add_filter("tojson", tojson);
    env.add_filter("string", string);
    env.add_test("iterable", is_iterable);
    env.set_formatter(format_value);
}

/// `value is iterable` as Jinja2 answers it: strings, lists, dicts and undefined (Jinja2's
/// `Undefined` iterates as empty) are; none, numbers and booleans are not (minijinja
/// also counts none, which templates such as Qwen3-Coder's test before `| length`).
fn is_iterable(value: Value) -> bool {
    matches!(
        value.kind(),
        ValueKind::Undefined
            | ValueKind::String
            | ValueKind::Bytes
            | ValueKind::Seq
            | ValueKind::Map
            | ValueKind::Iterable
    )
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `{{ value }}`: a list or dict as Python's `str()` writes it; everything else as
/// minijinja writes it (which is Python's for strings, numbers, booleans and none).
fn format_value(out: &mut Output, state: &State, value: &Value) -> Result<(), Error> {
    if matches!(value.kind(), ValueKind::Seq | ValueKind::Map) {
        let mut s = String::new();
        py_repr(value, &mut s);
        return out.write_str(&s).map_err(Error::from);
    }
    minijinja::escape_formatter(out, state, value)
}

/// `value | string`: Python's `str(value)` (see [`format_value`]).
fn string(value: Value) -> Value {
    match value.kind() {
        ValueKind::String => value,
        ValueKind::Undefined => Value::from(""),
        ValueKind::Seq | ValueKind::Map => {
            let mut s = String::new();
            py_repr(&value, &mut s);
            Value::from(s)
        }
        _ => Value::from(value.to_string()),
    }
}

/// Python's `repr()` of a JSON-like value, appended to `out`.
fn py_repr(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::String => py_str_repr(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq => {
            out.push('[');
            if let Ok(items) = value.try_iter() {
                for (i, v) in items.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(&v, out);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(keys) = value.try_iter() {
                for (i, k) in keys.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(&k, out);
                    out.push_str(": ");
                    py_repr(&value.get_item(&k).unwrap_or_default(), out);
                }
            }
            out.push('}');
        }
        ValueKind::Undefined | ValueKind::None => out.push_str("None"),
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// Python's `repr()` of a string: single quotes unless the text holds a single quote and
/// no double quote; backslashes, the quote and control characters escaped.
fn py_str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// transformers' `tojson`: `json.dumps(value, ensure_ascii=False, indent=indent)`, with
/// Python's separators (`", "` and `": "`), keys in their order, non-ASCII kept as is.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    // Accepted for compatibility; output is always ensure_ascii=False, insertion order.
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let _: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let mut buf = Vec::new();
    let res = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let fmt = serde_json::ser::PrettyFormatter::with_indent(&pad);
            value.serialize(&mut serde_json::Serializer::with_formatter(&mut buf, fmt))
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(
            &mut buf, PyCompact,
        )),
    };
    res.map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let s = String::from_utf8(buf)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(Value::from_safe_string(s))
}

/// serde_json formatter with Python's default separators.
struct PyCompact;

impl serde_json::ser::Formatter for PyCompact {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, ctx: serde_json::Value) -> String {
        let mut env = Environment::new();
        install(&mut env);
        env.render_str(src, Value::from_serialize(&ctx)).unwrap()
    }

    #[test]
    fn lists_and_dicts_print_as_python_str_writes_them() {
        let ctx = serde_json::json!({"t": ["string", null], "m": {"b": true, "a": "it's"},
            "q": "say \"it's\"\n", "n": 2.5});
        // Python 3: str(['string', None]) and so on.
        assert_eq!(
            render("{{ t }}|{{ t | string }}", ctx.clone()),
            "['string', None]|['string', None]"
        );
        assert_eq!(render("{{ m }}", ctx.clone()), "{'b': True, 'a': \"it's\"}");
        assert_eq!(render("{{ [q] }}", ctx.clone()), "['say \"it\\'s\"\\n']");
        assert_eq!(
            render(
                "{{ n | string }}|{{ none | string }}|{{ true | string }}",
                ctx
            ),
            "2.5|None|True"
        );
    }
}

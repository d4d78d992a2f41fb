//! Calls a model writes without the `<tool_call>` tags its template teaches: the answer
//! is nothing but the call's JSON, `{"name": <a tool>, "arguments": {...}}` (or an
//! array of such calls), possibly inside a ```` ```json ```` fence. Small models do this
//! often, and the client asked for a call, not for its JSON as text. Only the
//! start of an answer is read this way, and only as a call to one of the request's
//! tools, so an answer that merely contains JSON stays text.

use serde_json::Value;

use super::Call;

/// The most held-back text a bare call may take before the answer is taken as text: a
/// call is short, and holding a long JSON answer back would delay it for nothing.
pub(super) const MAX_HELD: usize = 16 * 1024;

/// What the start of an answer is, read as bare calls.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Bare {
    /// It may still become a call: hold it back until more arrives.
    Wait,
    /// It is not one: pass it on as text.
    No,
    /// These calls, written in the first `usize` bytes.
    Calls(Vec<Call>, usize),
}

/// Reads the start of an answer, `t`, as bare calls to the tools named `names` (an array
/// of calls only when `parallel`).
pub(super) fn read(t: &str, names: &[String], parallel: bool) -> Bare {
    let s = t.trim_start();
    let lead = t.len() - s.len();
    if s.is_empty() {
        return Bare::Wait;
    }
    // An optional opening fence, ```` ``` ```` or ```` ```json ````, on a line of its own.
    let fenced = s.starts_with("```") || "```".starts_with(s);
    let body_at = if fenced {
        match s.find('\n') {
            None if s.len() <= "```json".len() => return Bare::Wait,
            None => return Bare::No,
            Some(nl) => {
                let tag = s.get(3..nl).unwrap_or("").trim();
                if !(tag.is_empty() || tag.eq_ignore_ascii_case("json")) {
                    return Bare::No;
                }
                nl + 1
            }
        }
    } else {
        0
    };
    let body = &s[body_at..];
    let b = body.trim_start();
    if b.is_empty() {
        return Bare::Wait;
    }
    if !(b.starts_with('{') || (parallel && b.starts_with('['))) {
        return Bare::No;
    }
    let mut values = serde_json::Deserializer::from_str(b).into_iter::<Value>();
    let v = match values.next() {
        Some(Ok(v)) => v,
        Some(Err(e)) if e.is_eof() => return Bare::Wait,
        _ => return Bare::No,
    };
    let Some(calls) = calls_of(&v, names) else {
        return Bare::No;
    };
    let mut used = lead + body_at + (body.len() - b.len()) + values.byte_offset();
    if fenced {
        let rest = &t[used..];
        let r = rest.trim_start();
        if r.len() < 3 && "```".starts_with(r) {
            return Bare::Wait;
        }
        if !r.starts_with("```") {
            return Bare::No;
        }
        used += rest.len() - r.len() + 3;
    }
    Bare::Calls(calls, used)
}

/// `v` as calls: one call object, or a non-empty array of them.
fn calls_of(v: &Value, names: &[String]) -> Option<Vec<Call>> {
    match v {
        Value::Array(items) if !items.is_empty() => {
            items.iter().map(|c| call_of(c, names)).collect()
        }
        _ => call_of(v, names).map(|c| vec![c]),
    }
}

/// `v` as one call: an object of exactly a known tool's `name` and its `arguments` (an
/// object; `parameters` is taken for it, as some models write).
fn call_of(v: &Value, names: &[String]) -> Option<Call> {
    let o = v.as_object()?;
    let name = o.get("name")?.as_str()?;
    if !names.iter().any(|n| n == name) {
        return None;
    }
    let args = match (o.get("arguments"), o.get("parameters")) {
        (Some(a), None) | (None, Some(a)) => a,
        _ => return None,
    };
    (o.len() == 2 && args.is_object()).then(|| Call {
        name: name.to_string(),
        arguments: args.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["add".into(), "get_weather".into()]
    }

    fn call(name: &str, args: &str) -> Call {
        Call {
            name: name.into(),
            arguments: args.into(),
        }
    }

    #[test]
    fn a_whole_answer_of_call_json_is_a_call() {
        let t = "{\"name\": \"add\", \"arguments\": {\"a\": 3, \"b\": 4}}";
        assert_eq!(
            read(t, &names(), true),
            Bare::Calls(vec![call("add", "{\"a\":3,\"b\":4}")], t.len())
        );
        let fenced = "\n```json\n{\"name\": \"add\", \"parameters\": {}}\n```";
        assert_eq!(
            read(fenced, &names(), true),
            Bare::Calls(vec![call("add", "{}")], fenced.len())
        );
        let two = "[{\"name\": \"add\", \"arguments\": {}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]";
        let Bare::Calls(calls, used) = read(two, &names(), true) else {
            panic!("an array of calls");
        };
        assert_eq!((calls.len(), used), (2, two.len()));
        // Without parallel calls an array is text.
        assert_eq!(read(two, &names(), false), Bare::No);
    }

    #[test]
    fn a_prefix_waits_and_anything_else_is_text() {
        for prefix in [
            "",
            "  ",
            "`",
            "```",
            "```json",
            "```json\n",
            "{",
            "{\"name\": \"ad",
        ] {
            assert_eq!(read(prefix, &names(), true), Bare::Wait, "{prefix:?}");
        }
        assert_eq!(
            read(
                "```json\n{\"name\": \"add\", \"arguments\": {}}\n``",
                &names(),
                true
            ),
            Bare::Wait
        );
        for text in [
            "The answer is 7.",
            "{\"name\": \"delete_all\", \"arguments\": {}}",
            "{\"name\": \"add\", \"arguments\": {}, \"id\": 1}",
            "{\"name\": \"add\", \"arguments\": \"a=1\"}",
            "{\"name\": \"add\"}",
            "{\"result\": 7}",
            "{not json",
            "```python\nprint(1)\n```",
            "```json\n{\"name\": \"add\", \"arguments\": {}}\nand more",
        ] {
            assert_eq!(read(text, &names(), true), Bare::No, "{text:?}");
        }
    }
}

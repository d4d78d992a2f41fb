//! Splitting generated text into content and tool calls, whole ([`split`]) or as it
//! streams ([`StreamSplitter`]): calls between `<tool_call>` tags in the request's
//! format, and the calls models write without their tags (a bare JSON answer, read by
//! `bare`; an XML function block opened alone).

use super::{bare, Call, CallParser, Function, CLOSE, OPEN};

/// Splits a whole output of JSON calls into its text and its calls (see
/// [`StreamSplitter::split`]).
pub fn split(text: &str) -> (String, Vec<Call>) {
    StreamSplitter::default().split(text)
}

impl StreamSplitter {
    /// Splits a whole output into its text and its calls. A closed block that does not
    /// parse as a call stays in the text, as generated; one the output ends inside (cut
    /// off by the token limit or a stop sequence) is dropped (see [`Self::finish`]).
    pub fn split(mut self, text: &str) -> (String, Vec<Call>) {
        let (mut content, mut calls) = (String::new(), Vec::new());
        let mut pieces = self.push(text);
        pieces.extend(self.finish());
        for piece in pieces {
            match piece {
                Piece::Text(t) => content.push_str(&t),
                Piece::Call(c) => calls.push(c),
            }
        }
        (content, calls)
    }
}

/// What the splitter hands on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Text outside any call.
    Text(String),
    /// A complete call.
    Call(Call),
}

/// Splits streamed text into content and calls: text is passed on as soon as it cannot
/// be the start of an opening tag; a call is passed on once its closing tag arrives.
/// The default reads JSON calls; [`ToolSpec::splitter`] reads the request's format and
/// also takes an answer that is only a call's JSON, without the tags, as that call
/// (`bare`): such a start is held back until it is one or cannot be.
#[derive(Debug)]
pub struct StreamSplitter {
    parser: CallParser,
    buf: String,
    in_call: bool,
    /// A call has ended: the blank between it and the next call, or the end, is no text.
    after_call: bool,
    /// The request's tool names, where a call without tags is read at the start.
    bare: Option<Vec<String>>,
    /// Whether a bare array of calls is read (`parallel_tool_calls`).
    parallel: bool,
    /// The start of the answer has been read as text: no bare call follows.
    started: bool,
    /// Calls passed on so far (without `parallel`, those after the first are dropped).
    calls: usize,
    /// The answer is a call by grammar (`required` or a named tool): text held back as
    /// the start of its opening tag when the output ends is that call, cut off.
    forced: bool,
    /// The call being read was opened by `<function=NAME>` alone, without `<tool_call>`.
    untagged: bool,
}

impl Default for StreamSplitter {
    /// JSON calls between tags, several to an answer.
    fn default() -> Self {
        StreamSplitter {
            parser: CallParser::default(),
            buf: String::new(),
            in_call: false,
            after_call: false,
            bare: None,
            parallel: true,
            started: false,
            calls: 0,
            forced: false,
            untagged: false,
        }
    }
}

/// How an XML call's function block opens.
const FUNCTION: &str = "<function=";

/// Length of the longest suffix of `s` that is a proper prefix of `tag`.
pub(crate) fn partial_tag(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && s.ends_with(&tag[..n]))
        .unwrap_or(0)
}

impl StreamSplitter {
    /// A splitter reading calls with `parser`; `bare`: the tool names whose JSON calls are
    /// also read without tags at the answer's start (arrays of them when `parallel`).
    pub(super) fn new(parser: CallParser, bare: Option<Vec<String>>, parallel: bool) -> Self {
        StreamSplitter {
            parser,
            bare,
            parallel,
            ..StreamSplitter::default()
        }
    }

    /// This splitter for an answer the grammar makes a call from its first token.
    pub(super) fn forced(mut self, forced: bool) -> Self {
        self.forced = forced;
        self
    }

    /// The tools whose XML calls may open without `<tool_call>`: Qwen3-Coder models
    /// sometimes write `<function=NAME>` alone (and still close with `</tool_call>`).
    fn untagged_tools(&self) -> &[Function] {
        match &self.parser {
            CallParser::Xml(functions) => functions,
            CallParser::Json => &[],
        }
    }

    /// Where the first `<function=NAME>` of a request's tool starts in the held text.
    fn untagged_open(&self) -> Option<usize> {
        let tools = self.untagged_tools();
        let mut from = 0;
        while let Some(i) = self.buf[from..].find(FUNCTION) {
            let at = from + i;
            let rest = &self.buf[at + FUNCTION.len()..];
            if let Some((name, _)) = rest.split_once('>') {
                if tools.iter().any(|f| f.name == name) {
                    return Some(at);
                }
            }
            from = at + FUNCTION.len();
        }
        None
    }

    /// Length of the held text's end that may still become `<function=NAME>` of a tool.
    fn partial_untagged(&self) -> usize {
        let Some(lt) = self.buf.rfind('<') else {
            return 0;
        };
        let tail = &self.buf[lt..];
        // A proper prefix of `<function=NAME>`, compared in its two parts (no string
        // built per tool on every piece of a stream).
        let could = match tail.strip_prefix(FUNCTION) {
            None => FUNCTION.starts_with(tail) && !self.untagged_tools().is_empty(),
            // The name so far (all of it while `>` is still to come).
            Some(rest) => self
                .untagged_tools()
                .iter()
                .any(|f| f.name.starts_with(rest)),
        };
        if could {
            tail.len()
        } else {
            0
        }
    }

    /// Takes the next piece of output; returns what can be passed on now.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        let out = self.read(text);
        self.keep(out)
    }

    /// Without `parallel_tool_calls`, an answer holds one call: the model's further ones
    /// (it may write them all the same, bare ones in particular, which no grammar
    /// constrains) are dropped with the blank between them.
    fn keep(&mut self, out: Vec<Piece>) -> Vec<Piece> {
        if self.parallel {
            return out;
        }
        let mut kept = Vec::with_capacity(out.len());
        for p in out {
            match p {
                Piece::Call(_) if self.calls > 0 => {}
                Piece::Call(c) => {
                    self.calls += 1;
                    kept.push(Piece::Call(c));
                }
                Piece::Text(t) if self.calls > 0 && t.trim().is_empty() => {}
                t => kept.push(t),
            }
        }
        kept
    }

    fn read(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            if let (Some(names), false, false) = (&self.bare, self.in_call, self.started) {
                match bare::read(&self.buf, names, self.parallel) {
                    bare::Bare::Wait if self.buf.len() <= bare::MAX_HELD => break,
                    bare::Bare::Calls(calls, used) => {
                        out.extend(calls.into_iter().map(Piece::Call));
                        self.buf.drain(..used);
                        // More bare calls may follow, each on its own.
                        self.after_call = true;
                        continue;
                    }
                    _ => self.started = true,
                }
            }
            if self.in_call {
                let Some(end) = self.buf.find(CLOSE) else {
                    break;
                };
                let body = self.buf[..end].to_string();
                self.buf.drain(..end + CLOSE.len());
                self.in_call = false;
                let open = if std::mem::take(&mut self.untagged) {
                    ""
                } else {
                    OPEN
                };
                match self.parser.parse(&body) {
                    Some(c) => out.push(Piece::Call(c)),
                    None => out.push(Piece::Text(format!("{open}{body}{CLOSE}"))),
                }
                self.after_call = true;
            } else if self.after_call && self.buf.starts_with('\n') {
                // The newline between consecutive calls belongs to neither.
                let mut nexts = vec![format!("\n{OPEN}")];
                if !self.untagged_tools().is_empty() {
                    nexts.push(format!("\n{FUNCTION}"));
                }
                if nexts.iter().any(|n| self.buf.starts_with(n.as_str())) {
                    self.buf.drain(..1);
                } else if nexts.iter().any(|n| n.starts_with(&self.buf)) {
                    break;
                } else {
                    self.after_call = false;
                }
            } else if let Some((at, tagged)) = match (self.buf.find(OPEN), self.untagged_open()) {
                (Some(t), Some(u)) => Some(if t <= u { (t, true) } else { (u, false) }),
                (Some(t), None) => Some((t, true)),
                (None, Some(u)) => Some((u, false)),
                (None, None) => None,
            } {
                let before = self.buf[..at].to_string();
                if !before.is_empty() {
                    out.push(Piece::Text(before));
                }
                // An untagged call's body starts at its `<function=`, as a tagged one's
                // does after the tag.
                self.buf.drain(..at + if tagged { OPEN.len() } else { 0 });
                self.in_call = true;
                self.untagged = !tagged;
            } else {
                let keep = partial_tag(&self.buf, OPEN).max(self.partial_untagged());
                let cut = self.buf.len() - keep;
                if cut > 0 {
                    out.push(Piece::Text(self.buf[..cut].to_string()));
                    self.buf.drain(..cut);
                }
                break;
            }
        }
        out
    }

    /// The end of the output: whatever is held back, as text. A call the output ends
    /// inside is a call when its body is whole (the model ended without the closing
    /// tag); otherwise it was cut off, by the token limit or a stop sequence, and is
    /// dropped: it is the template's markup, not an answer, and the finish reason
    /// (`length`, `max_tokens`, `stop_sequence`) tells the client the answer stopped
    /// short.
    pub fn finish(&mut self) -> Vec<Piece> {
        let out = self.end();
        self.keep(out)
    }

    /// Whether `rest`, held at the end of the output after a bare call, is the start of
    /// another bare call that never finished.
    fn cut_bare_call(&self, rest: &str) -> bool {
        match (&self.bare, self.started) {
            (Some(names), false) => bare::read(rest, names, self.parallel) == bare::Bare::Wait,
            _ => false,
        }
    }

    /// Whether `rest`, held at the end of an answer that began with it, is a bare call
    /// cut off: it could still have become a call, and it already names one of the
    /// request's tools (JSON that names none stays the answer's text).
    fn cut_named_bare_call(&self, rest: &str) -> bool {
        let Some(names) = &self.bare else {
            return false;
        };
        self.cut_bare_call(rest)
            && rest.contains("\"name\"")
            && names.iter().any(|n| rest.contains(&format!("\"{n}\"")))
    }

    fn end(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.buf);
        let text = if std::mem::take(&mut self.in_call) {
            self.untagged = false;
            return match self.parser.parse(rest.trim_end()) {
                Some(c) => vec![Piece::Call(c)],
                None => Vec::new(),
            };
        } else if (self.after_call && (rest.trim().is_empty() || self.cut_bare_call(&rest)))
            || (self.forced && !rest.is_empty() && OPEN.starts_with(rest.as_str()))
            || self.cut_named_bare_call(&rest)
        {
            // The blank after the last call, a bare call the output ends inside (a
            // further one, or one that already names its tool), or a forced call cut
            // off inside its opening tag: as a tagged call cut off, markup of a call and
            // not an answer.
            String::new()
        } else {
            rest
        };
        if text.is_empty() {
            Vec::new()
        } else {
            vec![Piece::Text(text)]
        }
    }
}

#[cfg(test)]
/// Every piece of `out` pushed through `s` in chunks of `step` characters, then its
/// end: the text and the calls.
pub(crate) fn stream(mut s: StreamSplitter, out: &str, step: usize) -> (String, Vec<Call>) {
    let chars: Vec<char> = out.chars().collect();
    let mut got = Vec::new();
    for chunk in chars.chunks(step) {
        got.extend(s.push(&chunk.iter().collect::<String>()));
    }
    got.extend(s.finish());
    let (mut text, mut calls) = (String::new(), Vec::new());
    for p in got {
        match p {
            Piece::Text(t) => text.push_str(&t),
            Piece::Call(c) => calls.push(c),
        }
    }
    (text, calls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::test_spec;

    #[test]
    fn calls_are_split_from_text_whole_and_streamed_in_any_pieces() {
        let out = "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"t\", \"arguments\": {}}\n</tool_call>\n";
        let (text, calls) = split(out);
        assert_eq!(text, "Let me check.");
        assert_eq!(
            calls,
            vec![
                Call {
                    name: "get_weather".into(),
                    arguments: "{\"city\":\"Paris\"}".into()
                },
                Call {
                    name: "t".into(),
                    arguments: "{}".into()
                }
            ]
        );
        for step in 1..8 {
            let (text, got) = stream(StreamSplitter::default(), out, step);
            assert_eq!(
                (text.as_str(), got.len()),
                ("Let me check.", 2),
                "step {step}"
            );
        }
        // Text that only looks like the start of a tag is passed on at the end.
        assert_eq!(split("a <tool"), ("a <tool".into(), vec![]));
        // A call cut off inside is dropped (markup, not an answer); one whose body is
        // whole but whose closing tag never came is a call.
        assert_eq!(split("Hm.<tool_call>\n{\"name\": "), ("Hm.".into(), vec![]));
        for step in [1, 3, 1000] {
            let (text, got) = stream(
                StreamSplitter::default(),
                "<tool_call>\n{\"name\": \"t\", \"arguments\": {}}\n",
                step,
            );
            assert_eq!((text.as_str(), got.len()), ("", 1), "step {step}");
        }
    }

    #[test]
    fn a_forced_call_cut_off_inside_its_opening_tag_is_dropped() {
        let spec = crate::tools::parse(
            Some(&serde_json::json!([{"type": "function", "function": {"name": "f"}}])),
            Some(&serde_json::json!("required")),
            None,
        )
        .unwrap()
        .unwrap();
        for cut in ["<", "<tool", "<tool_call"] {
            assert_eq!(
                stream(spec.splitter(), cut, 1),
                (String::new(), vec![]),
                "{cut:?}"
            );
        }
        // Without a forced call the same text is the answer's.
        assert_eq!(split("<tool").0, "<tool");
    }

    #[test]
    fn a_bare_call_cut_off_after_a_whole_one_is_dropped() {
        let spec = test_spec(&["get_weather"]);
        let out = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"";
        for step in [1, 5, 1000] {
            let (text, calls) = stream(spec.splitter(), out, step);
            assert_eq!((text.as_str(), calls.len()), ("", 1), "step {step}");
        }
        // Text after a call that is no call stays text.
        let out = "{\"name\": \"get_weather\", \"arguments\": {}}\nDone.";
        assert_eq!(stream(spec.splitter(), out, 3).0, "\nDone.");
    }

    #[test]
    fn without_parallel_calls_only_the_first_call_is_kept() {
        let mut spec = test_spec(&["add"]);
        spec.parallel = false;
        let one = "{\"name\": \"add\", \"arguments\": {\"a\": 1}}";
        let add = Call {
            name: "add".into(),
            arguments: "{\"a\":1}".into(),
        };
        // Bare calls one per line, and tagged ones.
        let bare = format!("{one}\n{one}\n{one}");
        let tagged = format!("<tool_call>\n{one}\n</tool_call>\n<tool_call>\n{one}\n</tool_call>");
        for out in [bare, tagged] {
            for step in [1, 4, 1000] {
                assert_eq!(
                    stream(spec.splitter(), &out, step),
                    (String::new(), vec![add.clone()]),
                    "{out:?} in pieces of {step}"
                );
            }
        }
        spec.parallel = true;
        let (_, calls) = stream(spec.splitter(), &format!("{one}\n{one}"), 1000);
        assert_eq!(calls.len(), 2);
    }

    #[test]
    fn an_answer_that_is_only_a_calls_json_is_that_call() {
        let spec = test_spec(&["add", "get_weather"]);
        let add = Call {
            name: "add".into(),
            arguments: "{\"a\":3,\"b\":4}".into(),
        };
        for (out, text, calls) in [
            (
                "{\"name\": \"add\", \"arguments\": {\"a\": 3, \"b\": 4}}",
                "",
                vec![add.clone()],
            ),
            (
                "\n```json\n{\"name\": \"add\", \"arguments\": {\"a\": 3, \"b\": 4}}\n```\n",
                "",
                vec![add.clone()],
            ),
            (
                "{\"name\": \"add\", \"arguments\": {\"a\": 3, \"b\": 4}}\nDone.",
                "\nDone.",
                vec![add.clone()],
            ),
            // JSON that is not a call of these tools, JSON after text: text, as written.
            ("{\"result\": 7}", "{\"result\": 7}", vec![]),
            (
                "{\"name\": \"rm\", \"arguments\": {}}",
                "{\"name\": \"rm\", \"arguments\": {}}",
                vec![],
            ),
            (
                "Sure: {\"name\": \"add\", \"arguments\": {}}",
                "Sure: {\"name\": \"add\", \"arguments\": {}}",
                vec![],
            ),
            // A call cut off once it names its tool is dropped, as a tagged one is;
            // before that it may be any JSON, and stays text.
            ("{\"name\": \"add\", \"argu", "", vec![]),
            ("{\"na", "{\"na", vec![]),
        ] {
            for step in [1, 2, 3, 7, 1000] {
                assert_eq!(
                    stream(spec.splitter(), out, step),
                    (text.to_string(), calls.clone()),
                    "{out:?} in pieces of {step}"
                );
            }
        }
        // Without tools shown (`tool_choice: none`), and in the plain splitter, the
        // JSON is text.
        let call = "{\"name\": \"add\", \"arguments\": {}}";
        assert_eq!(split(call), (call.to_string(), vec![]));
    }
}

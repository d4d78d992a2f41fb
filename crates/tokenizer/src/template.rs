//! Chat templates: `tokenizer.chat_template` rendered with minijinja the way Hugging Face
//! transformers renders it with Jinja2 (`trim_blocks`, `lstrip_blocks`, `raise_exception`,
//! a Python-style `tojson`, Python string methods, `tools` = none when not given).

use crate::error::TemplateError;
use crate::tokenizer::Tokenizer;
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

/// ChatML, the format used when a model has no template of its own.
pub const CHATML_TEMPLATE: &str = "{%- for message in messages %}\
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    fallback: bool,
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source`; `bos_token` and `eos_token` are exposed to it as variables.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| TemplateError::Syntax(describe(&e)))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            fallback: false,
        })
    }

    /// The ChatML template, flagged as a fallback.
    pub fn chatml(bos_token: &str, eos_token: &str) -> Self {
        match Self::new(CHATML_TEMPLATE, bos_token, eos_token) {
            Ok(mut t) => {
                t.fallback = true;
                t
            }
            // CHATML_TEMPLATE is a constant covered by the tests.
            Err(e) => unreachable!("built-in ChatML template: {e}"),
        }
    }

    /// The model's own template, or ChatML (with a note on stderr) when it has none.
    pub fn from_tokenizer(tokenizer: &Tokenizer) -> Result<Self, TemplateError> {
        let bos = tokenizer.special_text(tokenizer.bos());
        let eos = tokenizer.special_text(tokenizer.eos());
        match tokenizer.chat_template() {
            Some(src) => Self::new(src, &bos, &eos),
            None => {
                eprintln!("note: the model has no tokenizer.chat_template; using ChatML");
                Ok(Self::chatml(&bos, &eos))
            }
        }
    }

    /// Whether this is the ChatML fallback rather than the model's template.
    pub fn is_fallback(&self) -> bool {
        self.fallback
    }

    /// Renders plain role/content messages.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        self.render_values(
            Value::from_serialize(messages),
            Value::from(()),
            add_generation_prompt,
        )
    }

    /// Renders messages given as JSON (tool calls, extra fields), with optional `tools`.
    pub fn render_json(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let tools = tools.map_or(Value::from(()), Value::from_serialize);
        self.render_values(
            Value::from_serialize(messages),
            tools,
            add_generation_prompt,
        )
    }

    fn render_values(
        &self,
        messages: Value,
        tools: Value,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| TemplateError::Syntax(describe(&e)))?;
        tmpl.render(minijinja::context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        })
        .map_err(|e| TemplateError::Render(describe(&e)))
    }
}

/// The error with its causes on one line.
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `json.dumps(value, ensure_ascii=False, indent=indent)`: Python's separators (`", "` and
/// `": "`), non-ASCII kept as is.
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

    fn conv() -> Vec<ChatMessage> {
        vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
        ]
    }

    #[test]
    fn chatml_fallback_renders_chatml() {
        let t = ChatTemplate::chatml("", "<|im_end|>");
        assert!(t.is_fallback());
        let out = t.render(&conv(), true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let out = t.render(&conv(), false).unwrap();
        assert!(out.ends_with("Hi<|im_end|>\n"), "{out:?}");
    }

    #[test]
    fn model_without_template_falls_back_to_chatml() {
        let meta = crate::tokenizer::tests::tiny_metadata();
        let tok = crate::tokenizer::tests::build(&meta).unwrap();
        let t = ChatTemplate::from_tokenizer(&tok).unwrap();
        assert!(t.is_fallback());
        let chatml = ChatTemplate::chatml("", "<|im_end|>");
        assert_eq!(
            t.render(&conv(), true).unwrap(),
            chatml.render(&conv(), true).unwrap()
        );
        assert!(t
            .render(&conv(), true)
            .unwrap()
            .starts_with("<|im_start|>system\nBe brief."));
    }

    #[test]
    fn raise_exception_message_reaches_the_error() {
        let src = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with a user turn') }}{% endif %}ok";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let err = t.render(&conv(), false).unwrap_err();
        assert!(matches!(err, TemplateError::Render(_)));
        assert!(
            err.to_string()
                .contains("Conversations must start with a user turn"),
            "{err}"
        );
        let ok = t.render(&[ChatMessage::new("user", "x")], false).unwrap();
        assert_eq!(ok, "ok");
    }

    #[test]
    fn syntax_errors_are_reported() {
        let err = ChatTemplate::new("{% for %}", "", "").err().unwrap();
        assert!(matches!(err, TemplateError::Syntax(_)), "{err}");
    }

    #[test]
    fn python_helpers_and_tojson() {
        let src = "{{ messages[0].content.strip().startswith('a') }}|{{ '  x '.strip() }}|\
{{ 'a,b'.split(',') | length }}|{{ {'k': [1, 'é']} | tojson }}|{{ tools is none }}|\
{{ bos_token }}{{ eos_token }}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let out = t
            .render(&[ChatMessage::new("user", "  abc ")], false)
            .unwrap();
        // Booleans print the Python way, as Jinja2 renders them.
        assert_eq!(out, "True|x|2|{\"k\": [1, \"é\"]}|True|<s></s>");
    }

    #[test]
    fn tojson_indent_matches_python() {
        let t = ChatTemplate::new("{{ {'a': [1, 2]} | tojson(indent=2) }}", "", "").unwrap();
        assert_eq!(
            t.render(&[], false).unwrap(),
            "{\n  \"a\": [\n    1,\n    2\n  ]\n}"
        );
    }

    #[test]
    fn trim_and_lstrip_blocks_like_transformers() {
        let src = "{% for m in messages %}\n    {% if true %}\n[{{ m.role }}]\n    {% endif %}\n{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert_eq!(t.render(&conv(), false).unwrap(), "[system]\n[user]\n");
    }
}

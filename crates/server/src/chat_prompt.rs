//! A request's prompt tokens: a completion's text or ids, or a chat's messages rendered
//! by the model's template, message contents kept apart from the template's markers.
//!
//! A chat whose last message is the assistant's is a prefill (as llama-server, ollama
//! and Anthropic's API take it): the messages before it are rendered with the
//! generation prompt and its content follows, for the model to continue; the answer is
//! the continuation. `continue_final_message` and `add_generation_prompt` (vLLM's and
//! llama-server's fields) ask for this, or turn it off, explicitly.
//!
//! With fault injection on (tests only), marker text in a prompt asks for a fault.

use minfer_tokenizer::{ChatMessage, RenderedChat};

use crate::error::ApiError;
use crate::params::{GenRequest, Prompt};
use crate::tools::CallFormat;
use crate::worker::Fault;
use crate::{AppState, Model};

/// Text in a prompt that makes inference panic when fault injection is on (tests only).
pub const PANIC_MARKER: &str = "__minfer_inject_panic__";

/// Text in a prompt that makes a kernel panic inside its first engine step when fault
/// injection is on (tests only).
pub const KERNEL_PANIC_MARKER: &str = "__minfer_inject_kernel_panic__";

/// Text in a prompt that slows its decode steps when fault injection is on (tests only).
pub const SLOW_MARKER: &str = "__minfer_inject_slow__";

/// Text in a prompt that makes its prefill take 1.5 s when fault injection is on (tests
/// only).
pub const SLOW_PREFILL_MARKER: &str = "__minfer_inject_slow_prefill__";

/// The fault a prompt asks for, when fault injection is on.
pub fn fault_of(st: &AppState, text: &str) -> Option<Fault> {
    if !st.fault_injection {
        None
    } else if text.contains(PANIC_MARKER) {
        Some(Fault::Panic)
    } else if text.contains(KERNEL_PANIC_MARKER) {
        Some(Fault::KernelPanic)
    } else if text.contains(SLOW_MARKER) {
        Some(Fault::Slow)
    } else if text.contains(SLOW_PREFILL_MARKER) {
        Some(Fault::SlowPrefill)
    } else {
        None
    }
}

/// Prompt tokens of a completion request, checked against the vocabulary. A text prompt
/// is the caller's whole prompt, template markers included, so special-token text in it
/// is parsed (as llama-server and `minfer run` do); chat content never is.
pub fn completion_prompt(
    st: &AppState,
    m: &Model,
    p: Prompt,
) -> Result<(Vec<u32>, Option<Fault>), ApiError> {
    match p {
        Prompt::Text(s) => Ok((m.tok.encode(&s, true, true), fault_of(st, &s))),
        Prompt::Tokens(t) => {
            let n = m.tok.n_vocab();
            if let Some(bad) = t.iter().find(|&&id| id as usize >= n) {
                return Err(ApiError::bad_request(format!(
                    "field `prompt` holds token id {bad}, outside the vocabulary of {n}"
                )));
            }
            Ok((t, None))
        }
    }
}

/// Prompt tokens of a chat request: the template's markers as special tokens, message
/// contents as plain text (unless `--allow-special-in-content` restores the old parsing
/// of specials everywhere).
pub fn chat_prompt(
    st: &AppState,
    m: &Model,
    msgs: &[ChatMessage],
) -> Result<(Vec<u32>, Option<Fault>), ApiError> {
    chat_prompt_with_tools(st, m, msgs, None)
}

/// [`chat_prompt`] with the request's `tools` array shown to the template.
pub fn chat_prompt_with_tools(
    st: &AppState,
    m: &Model,
    msgs: &[ChatMessage],
    tools: Option<&serde_json::Value>,
) -> Result<(Vec<u32>, Option<Fault>), ApiError> {
    let p = render_chat(st, m, msgs, tools, &serde_json::Map::new())?;
    Ok((p.ids, p.fault))
}

/// A rendered and tokenised chat prompt.
#[derive(Debug)]
pub struct ChatPrompt {
    /// Its tokens.
    pub ids: Vec<u32>,
    /// The fault it asks for (tests only).
    pub fault: Option<Fault>,
    /// It ends inside an open `<think>` block: the answer starts as reasoning.
    pub think_open: bool,
    /// How the model's template writes tool calls.
    pub tool_format: CallFormat,
    /// It opens a harmony assistant message (gpt-oss): the answer is split by channel.
    pub harmony: bool,
}

impl ChatPrompt {
    /// Tells `g` what the rendered prompt decides about the answer: whether it starts
    /// inside a reasoning block or a harmony message, and the format its tool calls come
    /// in.
    pub fn shape(&self, g: &mut GenRequest) {
        g.reasoning.open = self.think_open;
        g.reasoning.harmony = self.harmony;
        if let Some(t) = &mut g.tools {
            t.format = self.tool_format;
        }
    }
}

/// How a chat's end is rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Continuation {
    /// `continue_final_message`: `Some(true)` continues the last message (it must be the
    /// assistant's), `Some(false)` never does, `None` continues a last assistant message.
    pub continue_final: Option<bool>,
    /// `add_generation_prompt`: open the assistant's turn after the messages (not with a
    /// continued message, which is inside that turn already).
    pub add_generation_prompt: Option<bool>,
}

impl Continuation {
    /// The default: a last assistant message is continued, else the turn is opened.
    pub const AUTO: Continuation = Continuation {
        continue_final: None,
        add_generation_prompt: None,
    };

    /// Whether the last of `msgs` is continued and whether the generation prompt is
    /// added; a refusal names the field or the messages at fault.
    fn plan(self, msgs: &[ChatMessage]) -> Result<(bool, bool), ApiError> {
        let last_assistant = msgs
            .last()
            .is_some_and(|m| m.role == "assistant" && m.tool_calls.is_empty());
        let cont = match self.continue_final {
            Some(true) if !last_assistant => {
                return Err(ApiError::bad_request(
                    "field `continue_final_message` is true, but the last message is not an \
                     assistant message without tool calls to continue",
                )
                .with_param("continue_final_message"))
            }
            Some(c) => c,
            None => last_assistant && self.add_generation_prompt != Some(true),
        };
        if cont && self.add_generation_prompt == Some(true) {
            return Err(ApiError::bad_request(
                "fields `add_generation_prompt` and `continue_final_message` cannot both be \
                 true: a continued message is already inside the assistant's turn",
            )
            .with_param("add_generation_prompt"));
        }
        let n = msgs.len();
        if cont && n >= 2 && msgs[n - 2].role == "assistant" && self.continue_final.is_none() {
            return Err(ApiError::bad_request(
                "`messages` ends with two assistant messages: the last one would be continued \
                 after another assistant turn; merge them, or set `continue_final_message` \
                 to false",
            )
            .with_param("messages"));
        }
        Ok((cont, self.add_generation_prompt.unwrap_or(true)))
    }
}

/// A template's failure on the request's messages, as the 400 that names it.
fn unrendered(e: minfer_tokenizer::TemplateError) -> ApiError {
    ApiError::bad_request(format!("rendering `messages` with the chat template: {e}"))
}

/// The prompt text of `msgs` as [`render_chat_with`] tokenises it, with the spans of
/// message contents.
pub fn render_text(
    m: &Model,
    msgs: &[ChatMessage],
    tools: Option<&serde_json::Value>,
    kwargs: &serde_json::Map<String, serde_json::Value>,
    how: Continuation,
) -> Result<RenderedChat, ApiError> {
    // The server's thinking default where the request leaves `enable_thinking` out.
    let mut with_default;
    let kwargs = if m.thinking || kwargs.contains_key("enable_thinking") {
        kwargs
    } else {
        with_default = kwargs.clone();
        with_default.insert("enable_thinking".into(), false.into());
        &with_default
    };
    let (cont, add) = how.plan(msgs)?;
    let Some((last, before)) = msgs.split_last().filter(|_| cont) else {
        return m
            .template
            .render_spans_with_context(msgs, tools, add, kwargs)
            .map_err(unrendered);
    };
    let mut r = m
        .template
        .render_spans_with_context(before, tools, true, kwargs)
        .map_err(|e| {
            if before.is_empty() {
                // Templates read `messages[0]`; with nothing before the continued message
                // the template's own error would name a line of it, not the request.
                ApiError::bad_request(
                    "`messages` holds only the assistant message to continue, and the chat \
                     template renders no conversation without a message before it: add a \
                     system or user message first",
                )
                .with_param("messages")
            } else {
                unrendered(e)
            }
        })?;
    r.push_content(&last.content);
    Ok(r)
}

/// [`chat_prompt_with_tools`] with extra template variables (`chat_template_kwargs`,
/// such as `enable_thinking`), telling whether the prompt leaves a reasoning block open;
/// a last assistant message is continued.
pub fn render_chat(
    st: &AppState,
    m: &Model,
    msgs: &[ChatMessage],
    tools: Option<&serde_json::Value>,
    kwargs: &serde_json::Map<String, serde_json::Value>,
) -> Result<ChatPrompt, ApiError> {
    render_chat_with(st, m, msgs, tools, kwargs, Continuation::AUTO)
}

/// [`render_chat`] with the chat's end rendered as `how` says.
pub fn render_chat_with(
    st: &AppState,
    m: &Model,
    msgs: &[ChatMessage],
    tools: Option<&serde_json::Value>,
    kwargs: &serde_json::Map<String, serde_json::Value>,
    how: Continuation,
) -> Result<ChatPrompt, ApiError> {
    let rendered = render_text(m, msgs, tools, kwargs, how)?;
    let ids = if st.allow_special_in_content {
        m.tok.encode(&rendered.text, true, true)
    } else {
        rendered.encode(&m.tok, msgs, true).map_err(unrendered)?
    };
    Ok(ChatPrompt {
        ids,
        fault: fault_of(st, &rendered.text),
        think_open: crate::reasoning::opened_by(&rendered.text),
        tool_format: CallFormat::of_template(m.template.source()),
        harmony: crate::harmony::opened_by(&rendered.text),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(cont: Option<bool>, add: Option<bool>, roles: &[&str]) -> Result<(bool, bool), String> {
        let msgs: Vec<ChatMessage> = roles.iter().map(|r| ChatMessage::new(*r, "x")).collect();
        let how = Continuation {
            continue_final: cont,
            add_generation_prompt: add,
        };
        how.plan(&msgs).map_err(|e| e.message)
    }

    #[test]
    fn a_last_assistant_message_is_continued_unless_told_otherwise() {
        assert_eq!(plan(None, None, &["user"]), Ok((false, true)));
        assert_eq!(plan(None, None, &["user", "assistant"]), Ok((true, true)));
        assert_eq!(
            plan(None, Some(false), &["user", "assistant"]),
            Ok((true, false))
        );
        assert_eq!(
            plan(Some(false), None, &["user", "assistant"]),
            Ok((false, true))
        );
        assert_eq!(
            plan(None, Some(true), &["user", "assistant"]),
            Ok((false, true))
        );
        assert_eq!(plan(None, Some(false), &["user"]), Ok((false, false)));
        // A call is not continued.
        let mut call = ChatMessage::new("assistant", "");
        call.tool_calls.push(minfer_tokenizer::ToolCall {
            id: "c".into(),
            name: "f".into(),
            arguments: "{}".into(),
        });
        let msgs = [ChatMessage::new("user", "x"), call];
        assert_eq!(
            Continuation::AUTO.plan(&msgs).map_err(|e| e.message),
            Ok((false, true))
        );
        for (cont, add, roles, field) in [
            (Some(true), None, &["user"][..], "continue_final_message"),
            (
                Some(true),
                Some(true),
                &["user", "assistant"][..],
                "add_generation_prompt",
            ),
            (
                None,
                None,
                &["user", "assistant", "assistant"][..],
                "two assistant",
            ),
        ] {
            let e = plan(cont, add, roles).unwrap_err();
            assert!(e.contains(field), "{field}: {e}");
        }
        // Asked for, two assistant messages are the caller's choice.
        assert_eq!(
            plan(Some(true), None, &["user", "assistant", "assistant"]),
            Ok((true, true))
        );
    }
}

//! Errors in OpenAI's JSON shape: `{"error":{"message","type","param","code"}}`, with
//! OpenAI's `code` strings where OpenAI defines one (`context_length_exceeded`,
//! `model_not_found`, `invalid_api_key`) and `null` elsewhere, as OpenAI answers. Every
//! error a client sees is an [`ApiError`] built by one of the constructors below.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answered to a client: an HTTP status and a message naming the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// HTTP status of the answer.
    pub status: StatusCode,
    /// Human-readable explanation, naming the offending field or limit.
    pub message: String,
    /// Seconds a client should wait before retrying (503 only).
    pub retry_after: Option<u64>,
    /// OpenAI's machine-readable `code`, where OpenAI defines one for this error.
    pub code: Option<&'static str>,
    /// The request field at fault (OpenAI's `param`), when one is.
    pub param: Option<String>,
    /// For a prompt over the context: its tokens and the positions a request can use,
    /// reported as llama-server's `n_prompt_tokens` and `n_ctx` beside OpenAI's fields.
    pub context: Option<(usize, usize)>,
}

impl ApiError {
    /// An error with `status` and `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            retry_after: None,
            code: None,
            param: None,
            context: None,
        }
    }

    /// The same error naming the request field at fault.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// 400: the request is malformed or a field is invalid.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 400 `context_length_exceeded`, in OpenAI's words: a prompt of `prompt` tokens
    /// leaves no room for a completion in the `max` positions a request can use.
    pub fn context_length_exceeded(max: usize, prompt: usize) -> Self {
        let message = format!(
            "This model's maximum context length is {max} tokens. However, your \
             messages resulted in {prompt} tokens, leaving no room for a completion. \
             Please reduce the length of the messages."
        );
        ApiError {
            code: Some("context_length_exceeded"),
            param: Some("messages".into()),
            context: Some((prompt, max)),
            ..Self::bad_request(message)
        }
    }

    /// This error with `param` set to the field its message names ("field `NAME` ..."),
    /// where it sets none: the shared field readers word each refusal so but leave
    /// `param` empty, and OpenAI's clients read the field from `param`
    /// (`BadRequestError.param`).
    pub fn naming_field(mut self) -> Self {
        if self.param.is_none() {
            self.param = self
                .message
                .strip_prefix("field `")
                .and_then(|rest| rest.split_once('`'))
                .map(|(name, _)| name.to_string());
        }
        self
    }

    /// A [`Self::context_length_exceeded`] refusal worded for an API whose prompt is
    /// `field` (`prompt`, `input`) rather than chat's `messages`; any other error as it is.
    pub fn naming_prompt(mut self, field: &str) -> Self {
        if self.code == Some("context_length_exceeded") {
            self.message = self.message.replace("messages", field);
            self.param = Some(field.to_string());
        }
        self
    }

    /// 404 `model_not_found`: the request names a model this server does not serve.
    pub fn model_not_found(model: &str, available: &str) -> Self {
        ApiError {
            code: Some("model_not_found"),
            param: Some("model".into()),
            ..Self::new(
                StatusCode::NOT_FOUND,
                format!(
                    "The model `{model}` does not exist or you do not have access to it \
                     (this server has: {available})."
                ),
            )
        }
    }

    /// 503 while the default model loads (llama-server's "Loading model"), with a
    /// `Retry-After` of one second.
    pub fn loading() -> Self {
        ApiError {
            retry_after: Some(1),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "Loading model")
        }
    }

    /// 401 `invalid_api_key`: the key is missing or wrong.
    pub fn invalid_api_key() -> Self {
        ApiError {
            code: Some("invalid_api_key"),
            ..Self::new(StatusCode::UNAUTHORIZED, "missing or invalid API key")
        }
    }

    /// The answer to a failed constraint: a 400 naming `field` when the request's grammar
    /// is at fault (it does not compile, or is past an engine limit, even mid-generation),
    /// else a 500.
    pub fn constraint(field: &str, e: &minfer_runtime::ConstraintError) -> Self {
        if e.is_caller_error() {
            Self::bad_request(format!("field `{field}`: {e}")).with_param(field)
        } else {
            Self::internal(e.to_string())
        }
    }

    /// 500: inference failed on the server side.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// 503 with a Retry-After hint: the server is saturated.
    pub fn unavailable(message: impl Into<String>, retry_after: u64) -> Self {
        ApiError {
            retry_after: Some(retry_after),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
        }
    }

    /// OpenAI's `type` for this status.
    pub fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            400 | 404 | 405 | 408 | 409 | 413 | 415 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            503 | 504 => "server_overloaded",
            _ => "server_error",
        }
    }

    /// The JSON body of this error.
    pub fn body(&self) -> serde_json::Value {
        let mut v = json!({"error": {
            "message": self.message,
            "type": self.kind(),
            "param": self.param,
            "code": self.code,
        }});
        if let Some((prompt, ctx)) = self.context {
            v["error"]["n_prompt_tokens"] = json!(prompt);
            v["error"]["n_ctx"] = json!(ctx);
        }
        v
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape() {
        let e = ApiError::bad_request("field `temperature` must be a number").with_param("t");
        let b = e.body();
        let keys: Vec<&String> = b["error"].as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), 4, "{b}");
        assert_eq!(b["error"]["code"], serde_json::Value::Null);
        assert_eq!(b["error"]["param"], "t");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(
            b["error"]["message"],
            "field `temperature` must be a number"
        );
    }

    #[test]
    fn openai_codes_and_their_messages() {
        let e = ApiError::context_length_exceeded(256, 300);
        assert_eq!(e.status, 400);
        assert_eq!(e.body()["error"]["code"], "context_length_exceeded");
        // llama-server's clients read the two counts beside OpenAI's fields.
        assert_eq!(e.body()["error"]["n_prompt_tokens"], 300);
        assert_eq!(e.body()["error"]["n_ctx"], 256);
        assert!(
            e.message.starts_with(
                "This model's maximum context length is 256 tokens. However, your messages \
                 resulted in 300 tokens"
            ),
            "{}",
            e.message
        );
        let e = ApiError::model_not_found("gpt-9", "a, b");
        assert_eq!((e.status.as_u16(), e.code), (404, Some("model_not_found")));
        assert!(e.message.contains("`gpt-9`") && e.message.contains("a, b"));
        let e = ApiError::invalid_api_key();
        assert_eq!((e.status.as_u16(), e.code), (401, Some("invalid_api_key")));
        assert_eq!(e.body()["error"]["type"], "authentication_error");
    }

    #[test]
    fn unavailable_sets_retry_after() {
        let r = ApiError::unavailable("queue full", 2).into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
    }
}

//! Errors in OpenAI's JSON shape: `{"error":{"message","type","code"}}`.

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
}

impl ApiError {
    /// An error with `status` and `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 400: the request is malformed or a field is invalid.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
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
            400 | 404 | 405 | 408 | 413 | 415 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            503 | 504 => "server_overloaded",
            _ => "server_error",
        }
    }

    /// The JSON body of this error.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind(),
            "code": self.status.as_u16(),
        }})
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
        let e = ApiError::bad_request("field `temperature` must be a number");
        let b = e.body();
        assert_eq!(b["error"]["code"], 400);
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(
            b["error"]["message"],
            "field `temperature` must be a number"
        );
    }

    #[test]
    fn unavailable_sets_retry_after() {
        let r = ApiError::unavailable("queue full", 2).into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
    }
}

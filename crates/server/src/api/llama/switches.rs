//! llama-server's `--no-slots` / `--no-metrics` switches and its 501 refusal of an
//! endpoint switched off.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::{AppState, Config};

/// Which of llama-server's monitoring endpoints are on (`--no-slots`, `--no-metrics`).
#[derive(Debug, Clone, Copy)]
pub struct Native {
    slots_endpoint: bool,
    metrics_endpoint: bool,
}

impl Native {
    /// Reads the endpoint switches from the config.
    pub fn new(config: &Config) -> Self {
        Native {
            slots_endpoint: !config.no_slots,
            metrics_endpoint: !config.no_metrics,
        }
    }
}

/// llama-server's answer for an endpoint switched off: 501 `not_supported_error`.
pub(super) fn not_supported(message: &str) -> Response {
    (
        StatusCode::NOT_IMPLEMENTED,
        Json(json!({"error": {
            "code": 501, "message": message, "type": "not_supported_error",
        }})),
    )
        .into_response()
}

/// `None` when `/slots` is on, else llama-server's refusal (`--no-slots`).
pub fn slots_refusal(st: &AppState) -> Option<Response> {
    (!st.native.slots_endpoint).then(|| {
        not_supported("This server does not support slots endpoint. Start it without `--no-slots`")
    })
}

/// `None` when `/metrics` is on, else llama-server's refusal (`--no-metrics`).
pub fn metrics_refusal(st: &AppState) -> Option<Response> {
    (!st.native.metrics_endpoint).then(|| {
        not_supported(
            "This server does not support metrics endpoint. Start it without `--no-metrics`",
        )
    })
}

//! The request body: read whole within the body limit and the body timeout, for the gate
//! and for every route that takes a body.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderMap, StatusCode};
use futures_util::StreamExt;

use crate::error::ApiError;

/// A route's body as axum hands it over: the bytes, or why they could not be read.
pub(crate) type Body = Result<Bytes, BytesRejection>;

/// The whole body, or 413 past the limit, or 408 when it does not arrive within the
/// body timeout (a `Content-Length` longer than what the client sends).
pub(crate) async fn read_body(
    headers: &HeaderMap,
    body: axum::body::Body,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body exceeds the limit of {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let collect = async {
        let mut buf = Vec::with_capacity(declared.map_or(0, |n| n as usize));
        let mut data = body.into_data_stream();
        while let Some(chunk) = data.next().await {
            let chunk = chunk
                .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
            if buf.len() + chunk.len() > limit {
                return Err(too_large());
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(buf))
    };
    tokio::time::timeout(timeout, collect).await.map_err(|_| {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {:.1}s",
                timeout.as_secs_f64()
            ),
        )
    })?
}

/// The body bytes, or 413 past the limit.
pub(crate) fn body(b: Body, limit: usize) -> Result<Bytes, ApiError> {
    b.map_err(|rej| {
        if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body exceeds the limit of {limit} bytes"),
            )
        } else {
            ApiError::new(rej.status(), rej.body_text())
        }
    })
}

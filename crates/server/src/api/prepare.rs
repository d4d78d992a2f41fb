//! A request's preparation off the async threads: its body read as a JSON object, then
//! parsed, tokenised and its model loaded on a blocking thread, since all of that is CPU
//! work (or file reading) that would stall every other connection.

use std::sync::Arc;

use crate::api::fields::{parse_object, Object};
use crate::body::{body, Body};
use crate::error::ApiError;
use crate::AppState;

/// Reads `b` (within the body limit) as a JSON object and runs `f` on it and the server
/// state on a blocking thread; an unreadable body, a non-object, a panic in `f` or its
/// own error is the request's error.
pub async fn prepare<T, F>(st: &Arc<AppState>, b: Body, f: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(&AppState, Object) -> Result<T, ApiError> + Send + 'static,
{
    let bytes = body(b, st.body_limit)?;
    let s = Arc::clone(st);
    st.blocking
        .run(move || f(&s, parse_object(&bytes)?))
        .await?
}

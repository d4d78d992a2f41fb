//! The size of a context's KV cache, and the check that refuses a context this machine
//! cannot hold before anything is allocated.

use minfer_graph::KvType;
use minfer_models::HParams;

use super::EngineError;

/// Bytes of the f32 K and V regions of every layer for `n_ctx` positions; `None` when the
/// product does not fit a `u64`.
pub fn kv_cache_bytes(hp: &HParams, n_ctx: usize) -> Option<u64> {
    kv_cache_bytes_as(hp, n_ctx, [KvType::F32; 2])
}

/// Bytes of the K and V regions of every layer for `n_ctx` positions stored as `types`
/// (K, V); `None` when a row is not whole blocks of its format or the product overflows.
pub fn kv_cache_bytes_as(hp: &HParams, n_ctx: usize, types: [KvType; 2]) -> Option<u64> {
    let row = hp.n_head_kv.checked_mul(hp.head_dim)?;
    types.iter().try_fold(0u64, |acc, t| {
        let words = u64::try_from(t.row_words(row)?).ok()?;
        [hp.n_layer, n_ctx]
            .iter()
            .try_fold(words.checked_mul(4)?, |a, &x| {
                a.checked_mul(u64::try_from(x).ok()?)
            })?
            .checked_add(acc)
    })
}

/// Refuses a context whose KV cache cannot be allocated on this machine, so an absurd `-c`
/// is a named error before anything is allocated rather than an allocation abort later.
pub(super) fn check_kv_fits(
    hp: &HParams,
    n_ctx: usize,
    types: [KvType; 2],
) -> Result<(), EngineError> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let too_big = |need: String, have: String| EngineError::Param {
        name: "context size (-c)",
        message: format!("{n_ctx} positions need {need} of KV cache, {have} (lower -c)"),
    };
    let Some(bytes) = kv_cache_bytes_as(hp, n_ctx, types) else {
        return Err(too_big(
            "more than 2^64 bytes".into(),
            "which nothing holds".into(),
        ));
    };
    match physical_memory() {
        Some(mem) if bytes > mem => Err(too_big(
            format!("{:.1} GiB", gib(bytes)),
            format!("more than this machine's {:.1} GiB of memory", gib(mem)),
        )),
        _ => Ok(()),
    }
}

/// Total physical memory in bytes, where the platform says (Linux: `/proc/meminfo`).
pub(super) fn physical_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

//! What the attention examples share: the number arguments, one causal layer's geometry,
//! and K/V regions of `n` tokens filled with the same pseudo-random values (so each
//! example's checksum stays comparable across commits).

use minfer_cpu::ops::kv;
use minfer_graph::{AttnMeta, KvType};

/// Argument `s` as a number, `default` when absent; the error names `what`.
pub fn number(s: Option<String>, what: &str, default: usize) -> Result<usize, String> {
    s.map_or(Ok(default), |s| {
        s.parse()
            .map_err(|_| format!("{what}: '{s}' is not a number"))
    })
}

/// A causal full-attention layer of `n_head` query heads over `n_head_kv` KV heads of
/// `hd`, for `n` positions.
pub fn layer(n_head: usize, n_head_kv: usize, hd: usize, n: usize) -> AttnMeta {
    AttnMeta {
        layer: 0,
        n_head,
        n_head_kv,
        hd,
        scale: 1.0 / (hd as f32).sqrt(),
        n_ctx: n,
        window: None,
        softcap: None,
        ring: None,
        sinks: None,
        causal: true,
    }
}

/// An example's inputs: K and V regions in `kv_type` holding `n` tokens, and `q_len`
/// query values.
pub struct Inputs {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub q: Vec<f32>,
}

/// K, V (stored at cells `0..n`) and then Q from one xorshift stream of values in
/// [-1, 1).
pub fn inputs(m: &AttnMeta, kv_type: KvType, n: usize, q_len: usize) -> Result<Inputs, String> {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut vals = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    };
    let (k, v) = (vals(m.nkt() * n), vals(m.nkt() * n));
    let q = vals(q_len);
    let words = kv::region_words(kv_type, m.nkt(), n)?.1;
    let (mut kr, mut vr) = (vec![0.0f32; words], vec![0.0f32; words]);
    let cells: Vec<f32> = (0..n as u32).map(f32::from_bits).collect();
    kv::store(
        0,
        m.nkt(),
        n,
        None,
        [kv_type; 2],
        &k,
        &v,
        &cells,
        &mut kr,
        &mut vr,
    )?;
    Ok(Inputs { k: kr, v: vr, q })
}

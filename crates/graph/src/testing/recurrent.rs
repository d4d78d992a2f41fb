//! Scalar references of the recurrent ops ([`Op::SsmConv`], [`Op::DeltaNet`]) and of
//! the strided split and element-wise gate beside them. Tokens are taken in batch
//! order, each against its own slot, so several sequences in one batch are exact as
//! long as each sequence's tokens keep their order.

use crate::ir::*;

fn ints(v: &[f32]) -> impl Iterator<Item = i64> + '_ {
    v.iter().map(|x| i64::from(x.to_bits() as i32))
}

/// Each token's `(position, slot)`, the slot checked against `m.slots`.
pub(crate) fn token_slots(
    m: &RecurrentMeta,
    pos: &[f32],
    slots: &[f32],
    nt: usize,
) -> Result<Vec<(i64, usize)>, String> {
    if pos.len() < nt || slots.len() < nt {
        return Err(format!(
            "layer {}: {} positions and {} slots for {nt} tokens",
            m.layer,
            pos.len(),
            slots.len()
        ));
    }
    ints(&pos[..nt])
        .zip(ints(&slots[..nt]))
        .map(|(p, s)| {
            usize::try_from(s)
                .ok()
                .filter(|&s| s < m.slots)
                .map(|s| (p, s))
                .ok_or_else(|| format!("layer {}: slot {s} outside 0..{}", m.layer, m.slots))
        })
        .collect()
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// ggml's softplus: `log(1 + e^x)`, the identity above 20.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// `x * sigmoid(g)`, element by element.
pub(crate) fn sigmoid_gate(x: &[f32], g: &[f32]) -> Result<Vec<f32>, String> {
    if x.len() != g.len() {
        return Err(format!(
            "sigmoid_gate: {} gates for {} values",
            g.len(),
            x.len()
        ));
    }
    Ok(x.iter().zip(g).map(|(&v, &g)| v * sigmoid(g)).collect())
}

/// [`Op::Slice`] of rows of `d` values.
pub(crate) fn slice(
    x: &[f32],
    d: usize,
    period: usize,
    start: usize,
    len: usize,
) -> Result<Vec<f32>, String> {
    if period == 0
        || d == 0
        || !d.is_multiple_of(period)
        || start + len > period
        || !x.len().is_multiple_of(d)
    {
        return Err(format!(
            "slice [{start}, {start}+{len}) of blocks of {period} in rows of {d} ({} values)",
            x.len()
        ));
    }
    let mut out = Vec::with_capacity(x.len() / period * len);
    for block in x.chunks(period) {
        out.extend_from_slice(&block[start..start + len]);
    }
    Ok(out)
}

/// The causal convolution: token `t` of slot `s` sees the window (its `d_conv - 1`
/// earlier inputs, zero at position 0) then its own input; the window then drops its
/// oldest entry and takes the token's input.
pub(crate) fn ssm_conv(
    m: &RecurrentMeta,
    x: &[f32],
    toks: &[(i64, usize)],
    state: &mut [f32],
    w: &[f32],
) -> Result<Vec<f32>, String> {
    let (c, k) = (m.channels, m.d_conv);
    let (nt, slot) = (toks.len(), m.conv_slot());
    if k == 0 || x.len() != c * nt || w.len() != c * k || state.len() < slot * m.slots {
        return Err(format!(
            "ssm_conv layer {}: {} inputs, {} weights, {} state for {m:?}",
            m.layer,
            x.len(),
            w.len(),
            state.len()
        ));
    }
    let mut out = vec![0.0; c * nt];
    for (t, &(p, s)) in toks.iter().enumerate() {
        let win = &mut state[s * slot..(s + 1) * slot];
        if p == 0 {
            win.fill(0.0);
        }
        let xt = &x[t * c..(t + 1) * c];
        for ch in 0..c {
            let wr = &w[ch * k..(ch + 1) * k];
            let wc = &mut win[ch * (k - 1)..(ch + 1) * (k - 1)];
            let mut acc = 0.0f32;
            for j in 0..k - 1 {
                acc += wc[j] * wr[j];
            }
            acc += xt[ch] * wr[k - 1];
            out[t * c + ch] = acc;
            if k > 1 {
                wc.rotate_left(1);
                wc[k - 2] = xt[ch];
            }
        }
    }
    Ok(out)
}

/// The gated delta rule, token after token. Per value head `h` (key head `h % h_k`):
/// `q`, `k` L2-normalised, `g = softplus(alpha) * a[h]`, `b = sigmoid(beta)`;
/// `S = e^g S`, `d = (v - S k) b`, `S += d k^T`, `o = S q / sqrt(s_k)`.
pub(crate) fn delta_net(
    m: &RecurrentMeta,
    [qkv, alpha, beta]: [&[f32]; 3],
    toks: &[(i64, usize)],
    state: &mut [f32],
    [a, dt]: [Option<&[f32]>; 2],
) -> Result<Vec<f32>, String> {
    let a = a.ok_or("delta_net: no decay factors")?;
    let (sk, hk, sv, hv) = (m.s_k, m.h_k, m.s_v, m.h_v);
    let nt = toks.len();
    let (kd, c, slot) = (sk * hk, m.channels, m.ssm_slot());
    if sk != sv
        || hk == 0
        || c != 2 * kd + sv * hv
        || qkv.len() != c * nt
        || alpha.len() != hv * nt
        || beta.len() != hv * nt
        || a.len() != hv
        || dt.is_some_and(|d| d.len() != hv)
        || state.len() < slot * m.slots
    {
        return Err(format!(
            "delta_net layer {}: qkv {}, alpha {}, beta {}, a {}, state {} for {m:?}",
            m.layer,
            qkv.len(),
            alpha.len(),
            beta.len(),
            a.len(),
            state.len()
        ));
    }
    let l2 = |v: &[f32]| -> Vec<f32> {
        let ss: f32 = v.iter().map(|x| x * x).sum();
        let r = 1.0 / (ss + m.eps).sqrt();
        v.iter().map(|x| x * r).collect()
    };
    let scale = 1.0 / (sk as f32).sqrt();
    let mut out = vec![0.0; hv * sv * nt];
    for (t, &(p, s)) in toks.iter().enumerate() {
        let row = &qkv[t * c..(t + 1) * c];
        let st = &mut state[s * slot..(s + 1) * slot];
        if p == 0 {
            st.fill(0.0);
        }
        for h in 0..hv {
            let kh = m.key_head(h);
            let q = l2(&row[kh * sk..(kh + 1) * sk]);
            let k = l2(&row[kd + kh * sk..kd + (kh + 1) * sk]);
            let v = &row[2 * kd + h * sv..2 * kd + (h + 1) * sv];
            let al = alpha[t * hv + h] + dt.map_or(0.0, |d| d[h]);
            let decay = (softplus(al) * a[h]).exp();
            let b = sigmoid(beta[t * hv + h]);
            let mat = &mut st[h * sv * sk..(h + 1) * sv * sk];
            for j in 0..sv {
                let r = &mut mat[j * sk..(j + 1) * sk];
                r.iter_mut().for_each(|x| *x *= decay);
                let sk_j: f32 = r.iter().zip(&k).map(|(x, y)| x * y).sum();
                let d = (v[j] - sk_j) * b;
                r.iter_mut().zip(&k).for_each(|(x, y)| *x += y * d);
                let o: f32 = r.iter().zip(&q).map(|(x, y)| x * y).sum();
                out[t * hv * sv + h * sv + j] = o * scale;
            }
        }
    }
    Ok(out)
}

//! The recurrent ops of Gated DeltaNet layers: the causal depthwise convolution over
//! each slot's window of earlier inputs, and the gated delta rule over each slot's
//! state matrices, plus the strided split and element-wise sigmoid gate beside them.
//!
//! Tokens run in batch order, each against the slot the `slots` input names (a token
//! at position 0 starts from zero state). Work is cut by channel (convolution) or by
//! value head (delta rule): a channel's or head's state is touched by one thread only,
//! and every value is computed in a fixed order, so results do not depend on the
//! thread count.

use super::delta_chunk::{chunk_step, ChunkScratch, Dims};
use super::vec::VecIsa;
use super::{as_i32, SharedMut};
use crate::threadpool::{chunk_range, ThreadPool};
use minfer_graph::RecurrentMeta;

/// Each token's `(starts a sequence, slot)`, the slot checked against `m.slots`.
pub fn token_slots(
    m: &RecurrentMeta,
    pos: &[f32],
    slots: &[f32],
    nt: usize,
    out: &mut Vec<(bool, usize)>,
) -> Result<(), String> {
    if pos.len() < nt || slots.len() < nt {
        return Err(format!(
            "{} positions and {} slots for {nt} tokens",
            pos.len(),
            slots.len()
        ));
    }
    out.clear();
    for (&p, &s) in pos[..nt].iter().zip(&slots[..nt]) {
        let s = as_i32(s);
        let slot = usize::try_from(s)
            .ok()
            .filter(|&s| s < m.slots)
            .ok_or_else(|| format!("slot {s} outside 0..{}", m.slots))?;
        out.push((as_i32(p) == 0, slot));
    }
    Ok(())
}

/// `out = x * sigmoid(g)`, element by element.
pub fn sigmoid_gate(x: &[f32], g: &[f32], out: &mut [f32]) -> Result<(), String> {
    if x.len() != g.len() || out.len() < x.len() {
        return Err(format!(
            "{} gates for {} values into {}",
            g.len(),
            x.len(),
            out.len()
        ));
    }
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(g) {
        *o = v / (1.0 + (-g).exp());
    }
    Ok(())
}

/// The values `[start, start + len)` of every block of `period` values of `x`.
pub fn slice(
    x: &[f32],
    period: usize,
    start: usize,
    len: usize,
    out: &mut [f32],
) -> Result<(), String> {
    if period == 0 || start + len > period || !x.len().is_multiple_of(period) {
        return Err(format!(
            "[{start}, {start}+{len}) of blocks of {period} in {} values",
            x.len()
        ));
    }
    let n = x.len() / period * len;
    let out = out
        .get_mut(..n)
        .ok_or_else(|| format!("output holds fewer than {n} values"))?;
    for (o, b) in out.chunks_mut(len.max(1)).zip(x.chunks(period)) {
        o.copy_from_slice(&b[start..start + len]);
    }
    Ok(())
}

/// The causal convolution of `x` (`[channels, nt]`) with the `[channels][d_conv]`
/// weight `w` over the conv windows in `state`, which it advances.
pub fn ssm_conv(
    pool: &ThreadPool,
    m: &RecurrentMeta,
    x: &[f32],
    toks: &[(bool, usize)],
    state: &mut [f32],
    w: &[f32],
    out: &mut [f32],
) -> Result<(), String> {
    let (c, k, nt, slot) = (m.channels, m.d_conv, toks.len(), m.conv_slot());
    if k == 0
        || x.len() != c * nt
        || w.len() != c * k
        || state.len() < slot * m.slots
        || out.len() < c * nt
    {
        return Err(format!(
            "{} inputs, {} weights, {} state, {} output for {m:?}",
            x.len(),
            w.len(),
            state.len(),
            out.len()
        ));
    }
    let state = SharedMut::new(state);
    let out = SharedMut::new(out);
    let work = |lo: usize, hi: usize| {
        let km = k - 1;
        for (t, &(fresh, s)) in toks.iter().enumerate() {
            let at = s * slot;
            // SAFETY: this thread alone owns channels lo..hi of every window and output row.
            let win = unsafe { state.slice(at + lo * km..at + hi * km) };
            // SAFETY: as above.
            let o = unsafe { out.slice(t * c + lo..t * c + hi) };
            if fresh {
                win.fill(0.0);
            }
            let xt = &x[t * c..(t + 1) * c];
            if k == 4 {
                // The kernel width of every model so far: the same steps, unrolled.
                conv_fixed::<3, 4>(win, &w[lo * k..hi * k], &xt[lo..hi], o);
                continue;
            }
            for ch in lo..hi {
                let wr = &w[ch * k..(ch + 1) * k];
                let wc = &mut win[(ch - lo) * km..(ch - lo + 1) * km];
                let mut acc = 0.0f32;
                for (&v, &wj) in wc.iter().zip(wr) {
                    acc += v * wj;
                }
                acc += xt[ch] * wr[km];
                o[ch - lo] = acc;
                if km > 0 {
                    // An element loop: a window is a few values, too short for a memmove call.
                    for i in 1..km {
                        wc[i - 1] = wc[i];
                    }
                    wc[km - 1] = xt[ch];
                }
            }
        }
    };
    if pool.n_threads() == 1 || c * nt * k < super::PAR_MIN_ELEMS {
        work(0, c);
    } else {
        pool.run(&|ith, nth| {
            let r = chunk_range(c, ith, nth);
            if !r.is_empty() {
                work(r.start, r.end);
            }
        });
    }
    Ok(())
}

/// One token's convolution over a run of channels with windows of `KM = K - 1` values
/// and weights of `K`: [`ssm_conv`]'s per-channel steps in the same order, with the
/// widths known at compile time. `win`, `w`, `xt` and `o` hold the same channels.
#[inline]
fn conv_fixed<const KM: usize, const K: usize>(
    win: &mut [f32],
    w: &[f32],
    xt: &[f32],
    o: &mut [f32],
) {
    let (wins, _) = win.as_chunks_mut::<KM>();
    let (ws, _) = w.as_chunks::<K>();
    for (((wc, wr), &xv), oc) in wins.iter_mut().zip(ws).zip(xt).zip(o.iter_mut()) {
        let mut acc = 0.0f32;
        for (&v, &wj) in wc.iter().zip(wr) {
            acc += v * wj;
        }
        acc += xv * wr[KM];
        *oc = acc;
        for i in 1..KM {
            wc[i - 1] = wc[i];
        }
        wc[KM - 1] = xv;
    }
}

/// The inputs of [`delta_net`] besides the state.
pub struct DeltaArgs<'a> {
    /// Geometry.
    pub meta: &'a RecurrentMeta,
    /// Convolved `[channels, nt]` rows: q heads, k heads, v heads.
    pub qkv: &'a [f32],
    /// `[h_v, nt]` decay inputs (bias added).
    pub alpha: &'a [f32],
    /// `[h_v, nt]` write-strength inputs.
    pub beta: &'a [f32],
    /// The `[h_v]` decay factors `a`.
    pub a: &'a [f32],
    /// The `[h_v]` bias added to `alpha`, when it arrives unbiased.
    pub dt: Option<&'a [f32]>,
    /// Each token's (fresh, slot).
    pub toks: &'a [(bool, usize)],
    /// The batch indices where a whole chunk of `meta.chunk` tokens starts, increasing
    /// ([`chunk_starts`]); those tokens run in the chunked form.
    pub chunks: &'a [usize],
}

/// The batch indices from which [`delta_net`] runs `m.chunk` tokens in the chunked
/// form: where a sequence's tokens at positions `j * chunk .. (j + 1) * chunk` stand in
/// the batch one after the other. The grid is fixed by position, so a prompt cut into
/// steps at multiples of the chunk gives the same values however it is cut; every other
/// token runs one step at a time. Empty when `m.chunk` is 0 or 1.
pub fn chunk_starts(m: &RecurrentMeta, pos: &[f32], toks: &[(bool, usize)]) -> Vec<usize> {
    let (cs, nt) = (m.chunk, toks.len().min(pos.len()));
    let mut starts = Vec::new();
    if cs < 2 {
        return starts;
    }
    let p = |t: usize| i64::from(as_i32(pos[t]));
    let mut t = 0;
    while t + cs <= nt {
        let (p0, slot) = (p(t), toks[t].1);
        let whole = p0 >= 0
            && p0 % cs as i64 == 0
            && (1..cs).all(|i| toks[t + i].1 == slot && p(t + i) == p0 + i as i64);
        if whole {
            starts.push(t);
            t += cs;
        } else {
            t += 1;
        }
    }
    starts
}

/// q or k of one head, L2-normalised as ggml composes it (an RMS norm with `eps / n`,
/// sums in f64, then `1 / sqrt(n)`).
fn l2_into(x: &[f32], eps: f32, out: &mut [f32]) {
    let n = x.len() as f32;
    let sum: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps / n).sqrt();
    let post = 1.0 / n.sqrt();
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * scale * post;
    }
}

fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// The gated delta rule of every value head over every token (see the reference in the
/// graph crate's testing module): `[h_v * s_v, nt]` into `out`, the state advanced.
pub fn delta_net(
    pool: &ThreadPool,
    isa: VecIsa,
    d: &DeltaArgs<'_>,
    state: &mut [f32],
    out: &mut [f32],
) -> Result<(), String> {
    let m = d.meta;
    let (sk, hk, sv, hv) = (m.s_k, m.h_k, m.s_v, m.h_v);
    let nt = d.toks.len();
    let (kd, c, slot) = (sk * hk, m.channels, m.ssm_slot());
    let chunks_fit = d.chunks.windows(2).all(|w| w[0] + m.chunk <= w[1])
        && d.chunks
            .last()
            .is_none_or(|&t| m.chunk >= 2 && t + m.chunk <= nt);
    if !chunks_fit
        || sk != sv
        || hk == 0
        || c != 2 * kd + sv * hv
        || d.qkv.len() != c * nt
        || d.alpha.len() != hv * nt
        || d.beta.len() != hv * nt
        || d.a.len() != hv
        || d.dt.is_some_and(|b| b.len() != hv)
        || state.len() < slot * m.slots
        || out.len() < hv * sv * nt
    {
        return Err(format!(
            "qkv {}, alpha {}, beta {}, a {}, state {}, output {} for {m:?}",
            d.qkv.len(),
            d.alpha.len(),
            d.beta.len(),
            d.a.len(),
            state.len(),
            out.len()
        ));
    }
    let scale = 1.0 / (sk as f32).sqrt();
    let state = SharedMut::new(state);
    let out = SharedMut::new(out);
    let cs = m.chunk;
    // Token t's inputs for value head h: its query and key (before the L2 norm), its
    // values, its log decay `softplus(alpha + dt) * a` and its write strength
    // `sigmoid(beta)`.
    let head = |t: usize, h: usize| {
        let row = &d.qkv[t * c..(t + 1) * c];
        let kh = m.key_head(h);
        let q = &row[kh * sk..(kh + 1) * sk];
        let k = &row[kd + kh * sk..kd + (kh + 1) * sk];
        let v = &row[2 * kd + h * sv..2 * kd + (h + 1) * sv];
        let g = softplus(d.alpha[t * hv + h] + d.dt.map_or(0.0, |b| b[h])) * d.a[h];
        let b = 1.0 / (1.0 + (-d.beta[t * hv + h]).exp());
        (q, k, v, g, b)
    };
    // Where head h's matrices of slot s, and its outputs of token t, lie.
    let matrices = |s: usize, h: usize| s * slot + h * sv * sk..s * slot + (h + 1) * sv * sk;
    let outputs = |t: usize, h: usize| t * hv * sv + h * sv..t * hv * sv + (h + 1) * sv;
    // Tokens t..t + cs, one sequence's whole chunk, in the chunked form; heads lo..hi.
    let chunk = |sc: &mut ChunkScratch, t: usize, lo: usize, hi: usize| {
        let dims = Dims { sk, sv, c: cs };
        sc.shape(dims);
        let (fresh, s) = d.toks[t];
        for h in lo..hi {
            for i in 0..cs {
                let (q, k, v, g, b) = head(t + i, h);
                l2_into(k, m.eps, &mut sc.kq[i * sk..(i + 1) * sk]);
                l2_into(q, m.eps, &mut sc.kq[(cs + i) * sk..(cs + i + 1) * sk]);
                sc.v[i * sv..(i + 1) * sv].copy_from_slice(v);
                (sc.g[i], sc.b[i]) = (g, b);
            }
            // SAFETY: head h's matrices and output values belong to this thread alone.
            let mat = unsafe { state.slice(matrices(s, h)) };
            if fresh {
                mat.fill(0.0);
            }
            chunk_step(isa, sc, dims, scale, mat);
            for (i, oi) in sc.o.chunks_exact(sv).enumerate() {
                // SAFETY: as above.
                unsafe { out.slice(outputs(t + i, h)) }.copy_from_slice(oi);
            }
        }
    };
    // Token t one step; heads lo..hi, with `q` and `k` as scratch.
    let step = |q: &mut [f32], k: &mut [f32], t: usize, lo: usize, hi: usize| {
        let (fresh, s) = d.toks[t];
        for h in lo..hi {
            let (qr, kr, v, g, b) = head(t, h);
            l2_into(qr, m.eps, q);
            l2_into(kr, m.eps, k);
            let decay = g.exp();
            // SAFETY: head h's matrices and output values belong to this thread alone.
            let mat = unsafe { state.slice(matrices(s, h)) };
            // SAFETY: as above.
            let o = unsafe { out.slice(outputs(t, h)) };
            if fresh {
                mat.fill(0.0);
            }
            for (j, r) in mat.chunks_exact_mut(sk).enumerate() {
                // Decay, read, write, read: two passes over the row (`delta_row`),
                // with the bits of the four separate steps.
                let delta = (v[j] - isa.scale_dot(r, decay, k)) * b;
                o[j] = isa.axpy_dot(r, delta, k, q) * scale;
            }
        }
    };
    let work = |lo: usize, hi: usize| {
        let (mut q, mut k) = (vec![0.0f32; sk], vec![0.0f32; sk]);
        // Allocated by the first chunk only.
        let mut sc = ChunkScratch::default();
        let mut starts = d.chunks.iter().copied().peekable();
        let mut t = 0;
        while t < nt {
            if starts.next_if_eq(&t).is_some() {
                chunk(&mut sc, t, lo, hi);
                t += cs;
            } else {
                step(&mut q, &mut k, t, lo, hi);
                t += 1;
            }
        }
    };
    if pool.n_threads() == 1 || hv < 2 || hv * sv * sk * nt < super::PAR_MIN_ELEMS {
        work(0, hv);
    } else {
        pool.run(&|ith, nth| {
            let r = chunk_range(hv, ith, nth);
            if !r.is_empty() {
                work(r.start, r.end);
            }
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_testkit::Rng;

    fn meta(slots: usize) -> RecurrentMeta {
        RecurrentMeta {
            layer: 0,
            slots,
            d_conv: 4,
            channels: 2 * 2 * 32 + 8 * 32,
            s_k: 32,
            h_k: 2,
            s_v: 32,
            h_v: 8,
            conv_weight: String::new(),
            a_weight: String::new(),
            dt_bias: None,
            grouped: false,
            eps: 1e-6,
            chunk: 0,
        }
    }

    /// Runs the conv then the delta rule over `toks` on `nth` threads; returns the
    /// outputs and the states.
    fn run(nth: usize, toks: &[(bool, usize)]) -> [Vec<f32>; 4] {
        let m = meta(2);
        let nt = toks.len();
        let mut r = Rng::new(41);
        let x = r.vec(m.channels * nt, 1.0);
        let w = r.vec(m.channels * m.d_conv, 0.5);
        let alpha = r.vec(m.h_v * nt, 1.0);
        let beta = r.vec(m.h_v * nt, 1.0);
        let a: Vec<f32> = (0..m.h_v).map(|h| -0.1 - 0.2 * h as f32).collect();
        let pool = ThreadPool::new(nth);
        let mut conv_state = r.vec(m.conv_slot() * m.slots, 1.0);
        let mut conv = vec![0.0; m.channels * nt];
        ssm_conv(&pool, &m, &x, toks, &mut conv_state, &w, &mut conv).unwrap();
        let mut state = r.vec(m.ssm_slot() * m.slots, 0.1);
        let mut out = vec![0.0; m.h_v * m.s_v * nt];
        let args = DeltaArgs {
            meta: &m,
            qkv: &conv,
            alpha: &alpha,
            beta: &beta,
            a: &a,
            dt: None,
            toks,
            chunks: &[],
        };
        delta_net(&pool, VecIsa::detect(), &args, &mut state, &mut out).unwrap();
        [conv, conv_state, out, state]
    }

    /// The unrolled width-4 convolution gives the bits of the per-channel steps written
    /// out here (window dot in order, then the new input), and shifts the windows.
    #[test]
    fn width_four_convolution_gives_the_reference_bits() {
        let m = meta(2);
        let toks = [(false, 1), (false, 0), (true, 1), (false, 1)];
        let nt = toks.len();
        let mut r = Rng::new(43);
        let x = r.vec(m.channels * nt, 1.0);
        let w = r.vec(m.channels * 4, 0.5);
        let state0 = r.vec(m.conv_slot() * m.slots, 1.0);
        let mut state = state0.clone();
        let mut out = vec![0.0; m.channels * nt];
        ssm_conv(&ThreadPool::new(2), &m, &x, &toks, &mut state, &w, &mut out).unwrap();
        let mut want_state = state0;
        for (t, &(fresh, s)) in toks.iter().enumerate() {
            for ch in 0..m.channels {
                let at = s * m.conv_slot() + ch * 3;
                let win = &mut want_state[at..at + 3];
                if fresh {
                    win.fill(0.0);
                }
                let wr = &w[ch * 4..ch * 4 + 4];
                let xv = x[t * m.channels + ch];
                let mut acc = 0.0f32;
                acc += win[0] * wr[0];
                acc += win[1] * wr[1];
                acc += win[2] * wr[2];
                acc += xv * wr[3];
                assert_eq!(
                    out[t * m.channels + ch].to_bits(),
                    acc.to_bits(),
                    "t {t} ch {ch}"
                );
                win.copy_from_slice(&[win[1], win[2], xv]);
            }
        }
        assert_eq!(state, want_state);
    }

    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        // Two interleaved sequences, the second starting fresh mid-batch.
        // 24 tokens: enough work for both kernels to split it across threads.
        let toks: Vec<(bool, usize)> = (0..24).map(|t| (t == 5, t % 2)).collect();
        let one = run(1, &toks);
        for nth in [2, 3, 4] {
            assert_eq!(run(nth, &toks), one, "{nth} threads");
        }
    }

    #[test]
    fn a_fresh_token_ignores_the_state_and_others_carry_it() {
        let fresh = run(1, &[(true, 0)]);
        let carried = run(1, &[(false, 0)]);
        assert_ne!(fresh[2], carried[2], "the state was not read");
        // Two steps of one token equal one step of two.
        let m = meta(1);
        let pool = ThreadPool::new(1);
        let mut r = Rng::new(7);
        let x = r.vec(m.channels * 2, 1.0);
        let w = r.vec(m.channels * m.d_conv, 0.5);
        let (mut s1, mut s2) = (vec![0.0; m.conv_slot()], vec![0.0; m.conv_slot()]);
        let mut both = vec![0.0; m.channels * 2];
        ssm_conv(
            &pool,
            &m,
            &x,
            &[(true, 0), (false, 0)],
            &mut s1,
            &w,
            &mut both,
        )
        .unwrap();
        let mut step = vec![0.0; m.channels];
        ssm_conv(
            &pool,
            &m,
            &x[..m.channels],
            &[(true, 0)],
            &mut s2,
            &w,
            &mut step,
        )
        .unwrap();
        assert_eq!(step, both[..m.channels]);
        ssm_conv(
            &pool,
            &m,
            &x[m.channels..],
            &[(false, 0)],
            &mut s2,
            &w,
            &mut step,
        )
        .unwrap();
        assert_eq!(step, both[m.channels..]);
        assert_eq!(s1, s2);
    }

    #[test]
    fn bad_slots_and_shapes_are_refused() {
        let m = meta(2);
        let mut toks = Vec::new();
        let bits = |v: i32| f32::from_bits(v as u32);
        let e = token_slots(&m, &[bits(0)], &[bits(2)], 1, &mut toks).unwrap_err();
        assert!(e.contains("slot 2 outside 0..2"), "{e}");
        let e = token_slots(&m, &[bits(0)], &[bits(-1)], 1, &mut toks).unwrap_err();
        assert!(e.contains("slot -1"), "{e}");
        let pool = ThreadPool::new(1);
        let e = ssm_conv(&pool, &m, &[0.0; 3], &[(true, 0)], &mut [], &[], &mut []).unwrap_err();
        assert!(e.contains("inputs"), "{e}");
    }
}

//! The checks of an attention node's inputs: its geometry, the lengths the kernel
//! indexes, and every token's key range.

use super::super::{as_i32, kv};
use super::{AttnArgs, MAX_GROUP};

/// The key range of every token, checked against the region.
pub(super) fn key_ranges(a: &AttnArgs, ranges: &mut Vec<(usize, usize)>) -> Result<(), String> {
    let m = a.meta;
    // Spans and positions name virtual rows; a ring maps them (see `KvRing`).
    let rows = m.virtual_rows();
    ranges.clear();
    for t in 0..a.nt {
        let (lo, hi) = match a.span {
            Some(s) => {
                let pair = s.get(2 * t..2 * t + 2).ok_or_else(|| {
                    format!("span input has {} values, token {t} needs a pair", s.len())
                })?;
                (i64::from(as_i32(pair[0])), i64::from(as_i32(pair[1])))
            }
            None => {
                let p = i64::from(as_i32(a.pos[t]));
                if p < 0 || p >= rows as i64 {
                    return Err(format!(
                        "token {t}: position {p} outside the {rows}-row KV region of layer {}",
                        m.layer
                    ));
                }
                (0, p + 1)
            }
        };
        if lo < 0 || lo >= hi || hi > rows as i64 {
            return Err(format!(
                "token {t}: key range [{lo}, {hi}) invalid for the {rows}-row KV region of layer {}",
                m.layer
            ));
        }
        // A sliding-window layer reads only the last `window` rows: evicted rows are
        // never scanned, so the cost of a token is bounded by the window.
        let lo = match m.window {
            Some(w) => lo.max(hi - w as i64),
            None => lo,
        };
        if let Some(r) = m.ring {
            // One sequence's keys, no more than the ring holds.
            if hi - lo > r.rows as i64 || lo as usize / r.seq_rows != (hi as usize - 1) / r.seq_rows
            {
                return Err(format!(
                    "token {t}: key range [{lo}, {hi}) does not fit layer {}'s ring of {} rows per {}-row sequence",
                    m.layer, r.rows, r.seq_rows
                ));
            }
        }
        ranges.push((lo as usize, hi as usize));
    }
    // An encoder's tokens read their whole sequence's rows of the step (validated: no
    // window or ring, so the widened range stays inside the region).
    m.widen_non_causal(ranges);
    Ok(())
}

/// Checks every length the kernel indexes.
pub(super) fn validate(a: &AttnArgs, out_len: usize) -> Result<(), String> {
    let m = a.meta;
    if m.hd == 0
        || m.n_head == 0
        || m.n_head_kv == 0
        || !m.n_head.is_multiple_of(m.n_head_kv)
        || m.n_head / m.n_head_kv > MAX_GROUP
    {
        return Err(format!(
            "attention geometry: n_head {} n_head_kv {} hd {} (n_head must be a positive multiple of n_head_kv, at most {MAX_GROUP} times it)",
            m.n_head, m.n_head_kv, m.hd
        ));
    }
    if m.window == Some(0) || m.window.is_some_and(|w| w > i64::MAX as usize) {
        return Err(format!(
            "attention: a sliding window of {:?} rows (it must hold at least the token's own row)",
            m.window
        ));
    }
    if !m.causal && (m.window.is_some() || m.ring.is_some()) {
        return Err(format!(
            "attention: a non-causal layer {} with a window {:?} or ring (both are causal)",
            m.layer, m.window
        ));
    }
    if m.softcap.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
        return Err(format!(
            "attention: a score soft-cap of {:?} (it must be a positive number)",
            m.softcap
        ));
    }
    if a.sinks.is_some() != m.sinks.is_some() || a.sinks.is_some_and(|s| s.len() != m.n_head) {
        return Err(format!(
            "attention: sinks {:?} with {:?} values for {} heads",
            m.sinks,
            a.sinks.map(<[f32]>::len),
            m.n_head
        ));
    }
    let qrow = m.n_head * m.hd;
    if a.q_stride < qrow || a.q.len() < a.nt * a.q_stride {
        return Err(format!(
            "attention: q holds {} values, {} tokens of {qrow} needed (row stride {})",
            a.q.len(),
            a.nt,
            a.q_stride
        ));
    }
    for t in a.types {
        if !m.hd.is_multiple_of(t.block()) {
            return Err(format!(
                "attention: heads of {} cannot be read as {t} (blocks of {})",
                m.hd,
                t.block()
            ));
        }
    }
    let (_, k_need) = kv::region_words(a.types[0], m.nkt(), m.n_ctx)?;
    let (_, v_need) = kv::region_words(a.types[1], m.nkt(), m.n_ctx)?;
    if a.k.len() < k_need || a.v.len() < v_need {
        return Err(format!(
            "attention: layer {} K/V regions hold {}/{} words, {} rows of {} as {}/{} need {k_need}/{v_need}",
            m.layer,
            a.k.len(),
            a.v.len(),
            m.n_ctx,
            m.nkt(),
            a.types[0],
            a.types[1]
        ));
    }
    if out_len < a.nt * qrow || a.pos.len() < a.nt {
        return Err(format!(
            "attention: output {out_len} values / {} positions for {} tokens of {qrow}",
            a.pos.len(),
            a.nt
        ));
    }
    Ok(())
}

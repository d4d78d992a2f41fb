use super::*;
use minfer_testkit::Rng;

fn meta() -> AttnMeta {
    AttnMeta {
        layer: 3,
        n_head: 4,
        n_head_kv: 2,
        hd: 16,
        scale: 0.25,
        n_ctx: 40,
        window: None,
        softcap: None,
        ring: None,
        sinks: None,
        causal: true,
    }
}

/// f64 reference straight from the definition.
fn reference(a: &AttnArgs) -> Vec<f64> {
    let m = a.meta;
    let (hd, nkt, group) = (m.hd, m.nkt(), m.n_head / m.n_head_kv);
    let mut out = vec![0.0; a.nt * m.n_head * hd];
    // Non-causal: every token reads the rows up to the step's last position.
    let last = (0..a.nt)
        .map(|t| as_i32(a.pos[t]) as usize)
        .max()
        .unwrap_or(0);
    for t in 0..a.nt {
        let hi = if m.causal {
            as_i32(a.pos[t]) as usize
        } else {
            last
        } + 1;
        for h in 0..m.n_head {
            let q = &a.q[t * a.q_stride + h * hd..][..hd];
            let off = (h / group) * hd;
            let s: Vec<f64> = (0..hi)
                .map(|j| {
                    let k = &a.k[j * nkt + off..][..hd];
                    q.iter()
                        .zip(k)
                        .map(|(x, y)| *x as f64 * *y as f64)
                        .sum::<f64>()
                        * m.scale as f64
                })
                .collect();
            let sink = a.sinks.map(|s| f64::from(s[h]));
            let mx = s
                .iter()
                .cloned()
                .chain(sink)
                .fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
            let sum: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - mx).exp());
            for (j, p) in e.iter().enumerate() {
                for d in 0..hd {
                    out[t * m.n_head * hd + h * hd + d] += p / sum * a.v[j * nkt + off + d] as f64;
                }
            }
        }
    }
    out
}

#[test]
fn matches_reference_for_every_isa_and_thread_count() {
    let m = meta();
    let mut r = Rng::new(5);
    let nt = 6;
    let q_stride = m.n_head * m.hd + 32; // a wider fused q|k|v row
    let q = r.vec(nt * q_stride, 1.0);
    let k = r.vec(m.nkt() * m.n_ctx, 1.0);
    let v = r.vec(m.nkt() * m.n_ctx, 1.0);
    let positions = [0, 1, 2, 17, 30, 39];
    let pos: Vec<f32> = positions
        .iter()
        .map(|&p: &i32| f32::from_bits(p as u32))
        .collect();
    let a = AttnArgs {
        meta: &m,
        q: &q,
        q_stride,
        nt,
        pos: &pos,
        span: None,
        k: &k,
        v: &v,
        types: [KvType::F32; 2],
        sinks: None,
    };
    let want = reference(&a);
    let mut results = Vec::new();
    for isa in [VecIsa::Scalar, VecIsa::detect()] {
        for nth in [1, 2, 3] {
            let pool = ThreadPool::new(nth);
            let mut out = vec![f32::NAN; nt * m.n_head * m.hd];
            let mut s = AttnScratch::default();
            attention(&pool, isa, &a, &mut out, &mut s).unwrap();
            for (x, y) in out.iter().zip(&want) {
                assert!((*x as f64 - y).abs() < 1e-5, "{isa:?} t{nth}: {x} vs {y}");
            }
            results.push((isa, out));
        }
    }
    for w in results.windows(2) {
        if w[0].0 == w[1].0 {
            assert_eq!(w[0].1, w[1].1, "thread count changed the result");
        }
    }
}

/// An encoder's bidirectional attention: over three key tiles and several query blocks,
/// each token reads every row of the step (the f64 definition, on one to three threads
/// with the same bits), which differs from the causal result for all but the last token.
#[test]
fn non_causal_reads_every_row_of_the_step() {
    let nt = 150;
    let m = AttnMeta {
        causal: false,
        n_ctx: 160,
        ..meta()
    };
    let mut r = Rng::new(31);
    let q = r.vec(nt * m.n_head * m.hd, 1.0);
    let k = r.vec(m.nkt() * m.n_ctx, 1.0);
    let v = r.vec(m.nkt() * m.n_ctx, 1.0);
    let pos: Vec<f32> = (0..nt as u32).map(f32::from_bits).collect();
    let a = AttnArgs {
        meta: &m,
        q: &q,
        q_stride: m.n_head * m.hd,
        nt,
        pos: &pos,
        span: None,
        k: &k,
        v: &v,
        types: [KvType::F32; 2],
        sinks: None,
    };
    let want = reference(&a);
    let mut outs = Vec::new();
    for nth in [1, 3] {
        let pool = ThreadPool::new(nth);
        let mut out = vec![f32::NAN; nt * m.n_head * m.hd];
        attention(
            &pool,
            VecIsa::detect(),
            &a,
            &mut out,
            &mut AttnScratch::default(),
        )
        .unwrap();
        for (x, y) in out.iter().zip(&want) {
            assert!((*x as f64 - y).abs() < 1e-5, "{x} vs {y}");
        }
        outs.push(out);
    }
    assert_eq!(outs[0], outs[1], "thread count changed the result");
    let causal = AttnMeta {
        causal: true,
        ..m.clone()
    };
    let c = reference(&AttnArgs { meta: &causal, ..a });
    let row = m.n_head * m.hd;
    assert!(
        (c[0] - want[0]).abs() > 1e-3,
        "token 0 must see the later rows"
    );
    assert_eq!(
        c[(nt - 1) * row..],
        want[(nt - 1) * row..],
        "the last token reads all rows either way"
    );
    // A window or ring on a non-causal node is refused by name.
    let bad = AttnMeta {
        window: Some(4),
        ..m.clone()
    };
    let mut out = vec![0.0; nt * row];
    let e = attention(
        &ThreadPool::new(1),
        VecIsa::Scalar,
        &AttnArgs { meta: &bad, ..a },
        &mut out,
        &mut AttnScratch::default(),
    )
    .unwrap_err();
    assert!(e.contains("non-causal"), "{e}");
}

/// Attention sinks (one logit per head in the normaliser, no value): the f64 definition,
/// on one to three threads with the same bits, a decode token's bits equal to its row in
/// the prefill, and a sink above every score (the fold's other branch) scaling the row down.
#[test]
fn sinks_join_the_normaliser_with_the_same_bits_everywhere() {
    let m = AttnMeta {
        sinks: Some("blk.3.attn_sinks.weight".into()),
        ..meta()
    };
    let mut r = Rng::new(21);
    let nt = 70; // past one key tile
    let q = r.vec(nt * m.n_head * m.hd, 1.0);
    let k = r.vec(m.nkt() * 80, 1.0);
    let v = r.vec(m.nkt() * 80, 1.0);
    let m = AttnMeta { n_ctx: 80, ..m };
    let pos: Vec<f32> = (0..nt as u32).map(f32::from_bits).collect();
    // Below, among and far above the scores (about 0.25 * N(0, 16) here).
    let sinks = [-3.0f32, 0.2, 1.0, 30.0];
    let a = AttnArgs {
        meta: &m,
        q: &q,
        q_stride: m.n_head * m.hd,
        nt,
        pos: &pos,
        span: None,
        k: &k,
        v: &v,
        types: [KvType::F32; 2],
        sinks: Some(&sinks),
    };
    let want = reference(&a);
    let plain = reference(&AttnArgs { sinks: None, ..a });
    let run = |a: &AttnArgs, nth: usize, isa: VecIsa| {
        let mut out = vec![f32::NAN; a.nt * m.n_head * m.hd];
        attention(
            &ThreadPool::new(nth),
            isa,
            a,
            &mut out,
            &mut AttnScratch::default(),
        )
        .unwrap();
        out
    };
    for isa in [VecIsa::Scalar, VecIsa::detect()] {
        let one = run(&a, 1, isa);
        for (x, y) in one.iter().zip(&want) {
            assert!((*x as f64 - y).abs() < 1e-5, "{isa:?}: {x} vs {y}");
        }
        for nth in [2, 3] {
            assert_eq!(run(&a, nth, isa), one, "{isa:?}: {nth} threads");
        }
        // Each token alone (decode) gives its prefill row's bits.
        let row = m.n_head * m.hd;
        for t in [0usize, 1, 63, 64, 69] {
            let dec = AttnArgs {
                q: &q[t * row..(t + 1) * row],
                nt: 1,
                pos: &pos[t..t + 1],
                ..a
            };
            assert_eq!(
                run(&dec, 2, isa),
                one[t * row..(t + 1) * row],
                "{isa:?} token {t}"
            );
        }
    }
    // The sinks are felt: head 3's sink dwarfs its scores, so its output nearly vanishes.
    let hd = m.hd;
    let diff = |h: usize| {
        (0..nt * hd)
            .map(|i| {
                (want[(i / hd) * 4 * hd + h * hd + i % hd]
                    - plain[(i / hd) * 4 * hd + h * hd + i % hd])
                    .abs()
            })
            .fold(0.0, f64::max)
    };
    assert!(
        diff(0) < diff(3) && diff(3) > 0.1,
        "{} {}",
        diff(0),
        diff(3)
    );
    let head3 = (0..nt * hd).map(|i| want[(i / hd) * 4 * hd + 3 * hd + i % hd].abs());
    assert!(head3.fold(0.0, f64::max) < 1e-6);
}

/// A causal row whose largest score lies in its first key tile gets the bits of the
/// two-pass softmax (scores, their maximum, exponentials, one weighted sum in key order):
/// the tiles start where that kernel's key blocks started, and no rescaling happens. With
/// a dominant first key, as attention sinks make it in real models, the tiled kernel
/// moves no bits.
#[test]
fn a_first_tile_maximum_gives_the_two_pass_bits() {
    let m = AttnMeta {
        layer: 0,
        n_head: 6,
        n_head_kv: 2,
        hd: 32,
        scale: 0.18,
        n_ctx: 300,
        window: None,
        softcap: None,
        ring: None,
        sinks: None,
        causal: true,
    };
    let mut r = Rng::new(9);
    let positions = [0i32, 7, 64, 130, 299];
    let nt = positions.len();
    let mut q = r.vec(nt * m.n_head * m.hd, 1.0);
    let mut k = r.vec(m.nkt() * m.n_ctx, 1.0);
    let v = r.vec(m.nkt() * m.n_ctx, 1.0);
    // Key 0 dominates every head's scores: q leans on dimension 0, key 0 is large there.
    for qh in q.chunks_exact_mut(m.hd) {
        qh[0] = 3.0 + qh[0].abs();
    }
    for g in 0..m.n_head_kv {
        k[g * m.hd] = 20.0;
    }
    let pos: Vec<f32> = positions
        .iter()
        .map(|&p| f32::from_bits(p as u32))
        .collect();
    let a = AttnArgs {
        meta: &m,
        q: &q,
        q_stride: m.n_head * m.hd,
        nt,
        pos: &pos,
        span: None,
        k: &k,
        v: &v,
        types: [KvType::F32; 2],
        sinks: None,
    };
    for isa in [VecIsa::Scalar, VecIsa::detect()] {
        let mut out = vec![f32::NAN; nt * m.n_head * m.hd];
        attention(
            &ThreadPool::new(2),
            isa,
            &a,
            &mut out,
            &mut AttnScratch::default(),
        )
        .unwrap();
        for (t, &p) in positions.iter().enumerate() {
            let len = p as usize + 1;
            for h in 0..m.n_head {
                let qh = &q[(t * m.n_head + h) * m.hd..][..m.hd];
                let off = (h / 3) * m.hd;
                // Scores in blocks of 64 keys from key 0, as the two-pass kernel made them.
                let mut s = vec![0.0; len];
                for (b, chunk) in s.chunks_mut(KEY_TILE).enumerate() {
                    isa.dot_rows(qh, &k, m.nkt(), b * KEY_TILE * m.nkt() + off, chunk);
                }
                let mut mx = f32::NEG_INFINITY;
                for x in s.iter_mut() {
                    *x *= m.scale;
                    mx = mx.max(*x);
                }
                assert_eq!(mx, s[0], "key 0 must hold the maximum");
                isa.exp_sub(&mut s, mx);
                let sum = s.iter().fold(0.0f32, |a, &b| a + b);
                let mut o = vec![0.0; m.hd];
                isa.weighted_rows(&s, &v, m.nkt(), off, &mut o);
                isa.scale(&mut o, 1.0 / sum);
                let got = &out[(t * m.n_head + h) * m.hd..][..m.hd];
                assert_eq!(
                    got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    o.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{isa:?} token {t} head {h}"
                );
            }
        }
    }
}

/// Packs `k` and `v` (`n_ctx` rows of `nkt`, physical order) as `types`, and the f32
/// rows they decode to.
fn pack(m: &AttnMeta, types: [KvType; 2], k: &[f32], v: &[f32]) -> [Vec<f32>; 4] {
    let words = |t: KvType| kv::region_words(t, m.nkt(), m.n_ctx).unwrap().1;
    let (mut kp, mut vp) = (vec![0.0; words(types[0])], vec![0.0; words(types[1])]);
    let cells: Vec<f32> = (0..m.n_ctx as u32).map(f32::from_bits).collect();
    kv::store(
        m.layer,
        m.nkt(),
        m.n_ctx,
        None,
        types,
        k,
        v,
        &cells,
        &mut kp,
        &mut vp,
    )
    .unwrap();
    let unpack = |t: KvType, region: &[f32]| -> Vec<f32> {
        let rw = t.row_words(m.nkt()).unwrap();
        let mut out = vec![0.0; m.nkt() * m.n_ctx];
        for (j, o) in out.chunks_exact_mut(m.nkt()).enumerate() {
            let bytes: &[u8] = bytemuck::cast_slice(&region[j * rw..(j + 1) * rw]);
            kv::decode(t, &bytes[..t.bytes_for(m.nkt()).unwrap()], o).unwrap();
        }
        out
    };
    let (kd, vd) = (unpack(types[0], &kp), unpack(types[1], &vp));
    [kp, vp, kd, vd]
}

/// f64 attention of token `t` from the definition, over f32 regions, with the window,
/// ring and soft-cap of `m`: one row of `n_head * hd`.
fn reference_row(a: &AttnArgs, t: usize) -> Vec<f64> {
    let m = a.meta;
    let mut ranges = Vec::new();
    check::key_ranges(a, &mut ranges).unwrap();
    let (lo, hi) = ranges[t];
    let (hd, nkt, group) = (m.hd, m.nkt(), m.n_head / m.n_head_kv);
    let phys = |j: usize| m.ring.map_or(j, |r| r.row(j));
    let mut out = vec![0.0; m.n_head * hd];
    for h in 0..m.n_head {
        let q = &a.q[t * a.q_stride + h * hd..][..hd];
        let off = (h / group) * hd;
        let s: Vec<f64> = (lo..hi)
            .map(|j| {
                let k = &a.k[phys(j) * nkt + off..][..hd];
                let x = q
                    .iter()
                    .zip(k)
                    .map(|(x, y)| *x as f64 * *y as f64)
                    .sum::<f64>()
                    * m.scale as f64;
                m.softcap.map_or(x, |c| c as f64 * (x / c as f64).tanh())
            })
            .collect();
        let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
        let sum: f64 = e.iter().sum();
        for (j, p) in (lo..hi).zip(&e) {
            for d in 0..hd {
                out[h * hd + d] += p / sum * a.v[phys(j) * nkt + off + d] as f64;
            }
        }
    }
    out
}

/// A token's result is the same bits whether it is computed alone (a decode step), in
/// a long prefill block, or in a batch of other tokens in another order, for every
/// thread count and K/V format; with a sliding window, a soft-cap, and a KV ring shared
/// by two interleaved sequences; and it matches the definition.
#[test]
fn rows_do_not_depend_on_their_block_batch_or_threads() {
    let base = AttnMeta {
        layer: 0,
        n_head: 6,
        n_head_kv: 2,
        hd: 32,
        scale: 0.18,
        n_ctx: 300,
        window: None,
        softcap: None,
        ring: None,
        sinks: None,
        causal: true,
    };
    // (meta, positions, optional spans): causal prefill; windowed and soft-capped; two
    // sequences of a ring (150 virtual rows, 64 physical, window 30) interleaved.
    let causal: Vec<i32> = (0..200).collect();
    let ring = minfer_graph::KvRing {
        rows: 64,
        seq_rows: 150,
    };
    let ringed = AttnMeta {
        window: Some(30),
        ring: Some(ring),
        n_ctx: ring.physical_rows(300),
        ..base.clone()
    };
    let (mut rpos, mut rspan) = (Vec::new(), Vec::new());
    for i in 0..30 {
        for (s, p0) in [(0i32, 100), (1, 90)] {
            rpos.push(p0 + i);
            rspan.extend([s * 150, s * 150 + p0 + i + 1]);
        }
    }
    let configs = [
        (base.clone(), causal.clone(), None),
        (
            AttnMeta {
                window: Some(40),
                softcap: Some(3.0),
                ..base.clone()
            },
            causal,
            None,
        ),
        (ringed, rpos, Some(rspan)),
    ];
    let mut r = Rng::new(21);
    for (m, positions, spans) in configs {
        let nt = positions.len();
        let q = r.vec(nt * m.n_head * m.hd, 1.5);
        let k = r.vec(m.nkt() * m.n_ctx, 1.0);
        let v = r.vec(m.nkt() * m.n_ctx, 1.0);
        let ids =
            |xs: &[i32]| -> Vec<f32> { xs.iter().map(|&p| f32::from_bits(p as u32)).collect() };
        for types in [
            [KvType::F32; 2],
            [KvType::F16; 2],
            [KvType::Q8_0, KvType::F16],
        ] {
            let [kp, vp, kd, vd] = pack(&m, types, &k, &v);
            for isa in [VecIsa::Scalar, VecIsa::detect()] {
                // The tokens `sel` of the batch, in that order, on `nth` threads.
                let run = |sel: &[usize], nth: usize| -> Vec<u32> {
                    let qs: Vec<f32> = sel
                        .iter()
                        .flat_map(|&t| q[t * m.n_head * m.hd..][..m.n_head * m.hd].to_vec())
                        .collect();
                    let ps = ids(&sel.iter().map(|&t| positions[t]).collect::<Vec<_>>());
                    let ss = spans.as_ref().map(|s: &Vec<i32>| {
                        ids(&sel
                            .iter()
                            .flat_map(|&t| [s[2 * t], s[2 * t + 1]])
                            .collect::<Vec<_>>())
                    });
                    let a = AttnArgs {
                        meta: &m,
                        q: &qs,
                        q_stride: m.n_head * m.hd,
                        nt: sel.len(),
                        pos: &ps,
                        span: ss.as_deref(),
                        k: &kp,
                        v: &vp,
                        types,
                        sinks: None,
                    };
                    let mut out = vec![f32::NAN; sel.len() * m.n_head * m.hd];
                    attention(
                        &ThreadPool::new(nth),
                        isa,
                        &a,
                        &mut out,
                        &mut AttnScratch::default(),
                    )
                    .unwrap();
                    out.iter().map(|x| x.to_bits()).collect()
                };
                let all: Vec<usize> = (0..nt).collect();
                let full = run(&all, 1);
                let row = |bits: &[u32], i: usize| {
                    bits[i * m.n_head * m.hd..][..m.n_head * m.hd].to_vec()
                };
                assert_eq!(run(&all, 3), full, "{types:?} {isa:?}: threads");
                for t in (0..nt).step_by(7).chain([nt - 1]) {
                    assert_eq!(
                        run(&[t], 1),
                        row(&full, t),
                        "{types:?} {isa:?}: token {t} alone"
                    );
                }
                let mixed: Vec<usize> = (0..nt).rev().step_by(3).collect();
                let got = run(&mixed, 2);
                for (i, &t) in mixed.iter().enumerate() {
                    assert_eq!(
                        row(&got, i),
                        row(&full, t),
                        "{types:?} {isa:?}: token {t} in a mixed batch"
                    );
                }
                // Against the definition, over the decoded values.
                let ps = ids(&positions);
                let ss = spans.as_ref().map(|s: &Vec<i32>| ids(s));
                let a = AttnArgs {
                    meta: &m,
                    q: &q,
                    q_stride: m.n_head * m.hd,
                    nt,
                    pos: &ps,
                    span: ss.as_deref(),
                    k: &kd,
                    v: &vd,
                    types: [KvType::F32; 2],
                    sinks: None,
                };
                for t in (0..nt).step_by(11) {
                    for (x, y) in row(&full, t).iter().zip(reference_row(&a, t)) {
                        let x = f32::from_bits(*x) as f64;
                        assert!(
                            (x - y).abs() < 1e-5,
                            "{types:?} {isa:?} token {t}: {x} vs {y}"
                        );
                    }
                }
            }
        }
    }
}

/// Attention over packed K/V is, bit for bit, attention over the f32 values they
/// decode to: the tiles change where keys are read from, never the arithmetic.
#[test]
fn packed_regions_equal_f32_regions_of_their_decoded_values() {
    // A group of two over 64-dim heads, and Qwen3.5's group of four over 256-dim heads
    // (the four-row kernels, several blocks of 32 per row).
    packed_equals_decoded(4, 2, 64);
    packed_equals_decoded(8, 2, 256);
}

/// [`packed_regions_equal_f32_regions_of_their_decoded_values`] for one geometry.
fn packed_equals_decoded(n_head: usize, n_head_kv: usize, hd: usize) {
    let m = AttnMeta {
        layer: 1,
        n_head,
        n_head_kv,
        hd,
        scale: 1.0 / (hd as f32).sqrt(),
        n_ctx: 150,
        window: None,
        softcap: None,
        ring: None,
        sinks: None,
        causal: true,
    };
    let mut r = Rng::new(11);
    let positions = [0i32, 5, 63, 64, 149];
    let nt = positions.len();
    let q = r.vec(nt * m.n_head * m.hd, 1.0);
    let k = r.vec(m.nkt() * m.n_ctx, 1.0);
    let v = r.vec(m.nkt() * m.n_ctx, 1.0);
    let pos: Vec<f32> = positions
        .iter()
        .map(|&p| f32::from_bits(p as u32))
        .collect();
    let cells: Vec<f32> = (0..m.n_ctx as u32).map(f32::from_bits).collect();
    let pool = ThreadPool::new(2);
    for types in [
        [KvType::F16, KvType::F16],
        [KvType::Q8_0, KvType::Q8_0],
        [KvType::Q8_0, KvType::F16],
        [KvType::F32, KvType::Q8_0],
    ] {
        let words = |t: KvType| kv::region_words(t, m.nkt(), m.n_ctx).unwrap().1;
        let (mut kp, mut vp) = (vec![0.0; words(types[0])], vec![0.0; words(types[1])]);
        kv::store(
            m.layer,
            m.nkt(),
            m.n_ctx,
            None,
            types,
            &k,
            &v,
            &cells,
            &mut kp,
            &mut vp,
        )
        .unwrap();
        // The f32 regions of the decoded rows.
        let unpack = |t: KvType, region: &[f32]| -> Vec<f32> {
            let rw = t.row_words(m.nkt()).unwrap();
            let mut out = vec![0.0; m.nkt() * m.n_ctx];
            for (j, o) in out.chunks_exact_mut(m.nkt()).enumerate() {
                let bytes: &[u8] = bytemuck::cast_slice(&region[j * rw..(j + 1) * rw]);
                kv::decode(t, &bytes[..t.bytes_for(m.nkt()).unwrap()], o).unwrap();
            }
            out
        };
        let (kd, vd) = (unpack(types[0], &kp), unpack(types[1], &vp));
        for isa in [VecIsa::Scalar, VecIsa::detect()] {
            let run = |k: &[f32], v: &[f32], types| {
                let a = AttnArgs {
                    meta: &m,
                    q: &q,
                    q_stride: m.n_head * m.hd,
                    nt,
                    pos: &pos,
                    span: None,
                    k,
                    v,
                    types,
                    sinks: None,
                };
                let mut out = vec![f32::NAN; nt * m.n_head * m.hd];
                attention(&pool, isa, &a, &mut out, &mut AttnScratch::default()).unwrap();
                out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            };
            let packed = run(&kp, &vp, types);
            let plain = run(&kd, &vd, [KvType::F32; 2]);
            assert_eq!(packed, plain, "{types:?} {isa:?} head {hd}");
            // A decode token alone: its few rows read packed rows in place (widened in
            // registers) rather than from a decoded tile; the same bits as its row of
            // the block above.
            let row = m.n_head * m.hd;
            for t in 0..nt {
                let a = AttnArgs {
                    meta: &m,
                    q: &q[t * row..(t + 1) * row],
                    q_stride: row,
                    nt: 1,
                    pos: &pos[t..t + 1],
                    span: None,
                    k: &kp,
                    v: &vp,
                    types,
                    sinks: None,
                };
                let mut out = vec![f32::NAN; row];
                attention(&pool, isa, &a, &mut out, &mut AttnScratch::default()).unwrap();
                let bits: Vec<u32> = out.iter().map(|x| x.to_bits()).collect();
                assert_eq!(
                    bits,
                    plain[t * row..(t + 1) * row],
                    "{types:?} {isa:?} head {hd} token {t}"
                );
            }
        }
    }
    // A head that is not whole Q8_0 blocks is refused, naming the format.
    let bad = AttnMeta {
        hd: 16,
        ..m.clone()
    };
    let a = AttnArgs {
        meta: &bad,
        q: &q,
        q_stride: bad.n_head * bad.hd,
        nt: 1,
        pos: &pos,
        span: None,
        k: &k,
        v: &v,
        types: [KvType::Q8_0, KvType::F32],
        sinks: None,
    };
    let mut out = vec![0.0; bad.n_head * bad.hd];
    let e = attention(
        &pool,
        VecIsa::Scalar,
        &a,
        &mut out,
        &mut AttnScratch::default(),
    )
    .unwrap_err();
    assert!(e.contains("q8_0") && e.contains("16"), "{e}");
}

#[test]
fn explicit_span_limits_the_keys() {
    let m = meta();
    let mut r = Rng::new(6);
    let q = r.vec(m.n_head * m.hd, 1.0);
    let k = r.vec(m.nkt() * m.n_ctx, 1.0);
    let v = r.vec(m.nkt() * m.n_ctx, 1.0);
    let pos = [f32::from_bits(9)];
    let span = [f32::from_bits(0), f32::from_bits(10)];
    let pool = ThreadPool::new(1);
    let mut a = AttnArgs {
        meta: &m,
        q: &q,
        q_stride: m.n_head * m.hd,
        nt: 1,
        pos: &pos,
        span: None,
        k: &k,
        v: &v,
        types: [KvType::F32; 2],
        sinks: None,
    };
    let mut causal = vec![0.0; m.n_head * m.hd];
    let mut s = AttnScratch::default();
    attention(&pool, VecIsa::Scalar, &a, &mut causal, &mut s).unwrap();
    a.span = Some(&span);
    let mut spanned = vec![0.0; m.n_head * m.hd];
    attention(&pool, VecIsa::Scalar, &a, &mut spanned, &mut s).unwrap();
    assert_eq!(causal, spanned, "[0, pos+1) is the causal range");
    let narrow = [f32::from_bits(5), f32::from_bits(6)];
    a.span = Some(&narrow);
    attention(&pool, VecIsa::Scalar, &a, &mut spanned, &mut s).unwrap();
    // A single key: the output is that key's V row.
    assert_eq!(&spanned[..m.hd], &v[5 * m.nkt()..5 * m.nkt() + m.hd]);
}

#[test]
fn out_of_range_positions_and_bad_geometry_are_errors() {
    let m = meta();
    let q = vec![0.0; m.n_head * m.hd];
    let kv = vec![0.0; m.nkt() * m.n_ctx];
    let pool = ThreadPool::new(1);
    let mut out = vec![0.0; m.n_head * m.hd];
    let mut s = AttnScratch::default();
    let beyond = [f32::from_bits(40)];
    let a = AttnArgs {
        meta: &m,
        q: &q,
        q_stride: m.n_head * m.hd,
        nt: 1,
        pos: &beyond,
        span: None,
        k: &kv,
        v: &kv,
        types: [KvType::F32; 2],
        sinks: None,
    };
    let e = attention(&pool, VecIsa::Scalar, &a, &mut out, &mut s).unwrap_err();
    assert!(e.contains("position 40") && e.contains("layer 3"), "{e}");
    let short = &kv[..10];
    let pos0 = [0.0];
    let b = AttnArgs {
        k: short,
        pos: &pos0,
        ..a
    };
    assert!(attention(&pool, VecIsa::Scalar, &b, &mut out, &mut s).is_err());
    let bad = AttnMeta {
        n_head_kv: 3,
        ..m.clone()
    };
    let c = AttnArgs {
        meta: &bad,
        pos: &pos0,
        ..a
    };
    assert!(attention(&pool, VecIsa::Scalar, &c, &mut out, &mut s).is_err());
}

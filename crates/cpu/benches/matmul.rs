//! Matmul throughput: weight-streaming GB/s for decode shapes (one token) and GOP/s for
//! prefill shapes (512 tokens), per weight type, with 1 and 2 threads. Shapes whose row
//! length is not a whole number of blocks are skipped (896 columns take no k-quant).
//!
//! Types with a repacked layout are measured both ways (`x8`: [`RepackedMatrix`]; Q6_K too,
//! whose tiles are used where [`RepackedMatrix::supports`] says so).
//! Decode cycles through enough copies of each matrix to exceed the last-level cache, so
//! the figure is memory streaming, not cache bandwidth. A read-bandwidth probe runs first
//! (a plain sum over a buffer far above the last-level cache, on the same huge-page memory
//! as the repacked weights, 1 and 2 threads, each thread reading one contiguous half as the
//! decode split does), and every decode line gives its
//! GB/s as a share of the probe's figure for its thread count.
//!
//! Run with `cargo bench -p minfer-cpu --bench matmul [-- [--decode] [filter...]]`; the
//! filter matches the type name, `--decode` runs only the probe and the decode kernels at
//! the shapes of the two real models (Qwen2.5-Coder 0.5B and 1.5B Q4_K_M), `--fused` only
//! the decode fusions' products (separate against one multi call, SwiGLU included).
//! `MINFER_ISA=avx2` measures the AVX2 path on a CPU with AVX-512.

use minfer_cpu::hugemem::HugeVec;
use minfer_cpu::matmul::{
    matmul, matmul_repacked, matmul_repacked_multi_then, MatmulScratch, MultiEpilogue, QMatrix,
    RepackedMatrix,
};
use minfer_cpu::ops::elementwise::swiglu_slice;
use minfer_cpu::quant::Isa;
use minfer_cpu::threadpool::{chunk_range, ThreadPool};
use minfer_gguf::quant::{has_quantizer, quantize_to_vec};
use minfer_gguf::GgmlType;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Bytes of weights cycled through in decode runs (well above a 32 MiB L3).
const STREAM_BYTES: usize = 256 << 20;

fn rand_f32(n: usize, seed: u64) -> Vec<f32> {
    minfer_testkit::Rng::new(seed).vec(n, 1.0)
}

/// A `rows x cols` matrix of `ty`: 64 distinct quantized rows repeated (quantizing
/// 150k rows with the reference quantizers would dominate the run). Stored in u64s so
/// every block type is aligned. Types without an encoder take random bytes: every byte
/// pattern of the lattice i-quants decodes to valid levels, and no kernel's speed depends
/// on the values (a scale that reads as NaN costs nothing on x86).
fn matrix(ty: GgmlType, rows: usize, cols: usize) -> (Vec<u64>, usize) {
    let distinct = 64.min(rows);
    let seed = if has_quantizer(ty) {
        quantize_to_vec(ty, &rand_f32(distinct * cols, 7)).expect("block multiple")
    } else {
        let n = ty
            .bytes_for((distinct * cols) as u64)
            .expect("block multiple") as usize;
        let mut r = minfer_testkit::Rng::new(7);
        (0..n).map(|_| r.next_u64() as u8).collect()
    };
    let row_bytes = seed.len() / distinct;
    let total = row_bytes * rows;
    let mut store = vec![0u64; total.div_ceil(8)];
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut store);
    for (r, chunk) in bytes[..total].chunks_exact_mut(row_bytes).enumerate() {
        let k = r % distinct;
        chunk.copy_from_slice(&seed[k * row_bytes..(k + 1) * row_bytes]);
    }
    (store, total)
}

/// Bytes the bandwidth probe reads (far above any last-level cache).
const PROBE_BYTES: usize = 512 << 20;

/// Read bandwidth in GB/s per thread count of `pools` (index = position in `pools`): the
/// best of several passes in which each thread sums its own contiguous half of a buffer,
/// as the decode split streams weights.
fn bandwidth(pools: &[ThreadPool]) -> Vec<f64> {
    // On the backend's weight memory (huge pages where the kernel gives them), as the
    // repacked weights are: the same memory, so the same bound.
    let vals: Vec<u64> = (0..PROBE_BYTES / 8).map(|i| i as u64).collect();
    let buf = HugeVec::from_slice(&vals).expect("probe buffer");
    drop(vals);
    let sink = AtomicU64::new(0);
    pools
        .iter()
        .map(|pool| {
            let mut best = f64::INFINITY;
            for _ in 0..6 {
                let start = Instant::now();
                pool.run(&|ith, nth| {
                    let part = &buf[chunk_range(buf.len(), ith, nth)];
                    // Eight independent sums so the loop is load-bound, not add-bound.
                    let mut acc = [0u64; 8];
                    for c in part.chunks_exact(8) {
                        for (a, v) in acc.iter_mut().zip(c) {
                            *a = a.wrapping_add(*v);
                        }
                    }
                    sink.fetch_add(acc.iter().fold(0, |a, v| a ^ v), Relaxed);
                });
                best = best.min(start.elapsed().as_secs_f64());
            }
            let gbs = PROBE_BYTES as f64 / best / 1e9;
            println!(
                "memory  read bandwidth  {:>6} MiB t={}  {:>6.2} GB/s",
                PROBE_BYTES >> 20,
                pool.n_threads(),
                gbs
            );
            gbs
        })
        .collect()
}

/// Runs `f` repeatedly for at least `min` and returns the mean seconds per call.
fn time(min: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut n = 0u32;
    while start.elapsed() < min || n < 3 {
        f();
        n += 1;
    }
    start.elapsed().as_secs_f64() / n as f64
}

fn decode(
    ty: GgmlType,
    rows: usize,
    cols: usize,
    pools: &[ThreadPool],
    bw: &[f64],
    repacked: bool,
) {
    if !cols.is_multiple_of(ty.block_size())
        || (repacked && !(RepackedMatrix::supports(ty) || ty == GgmlType::Q6K))
    {
        return;
    }
    let (store, len) = matrix(ty, rows, cols);
    // Small matrices take many copies: a real decode step reads each of them cold.
    let copies = STREAM_BYTES.div_ceil(len).max(1);
    fn q(ty: GgmlType, s: &[u64], len: usize, rows: usize, cols: usize) -> QMatrix<'_> {
        QMatrix {
            ty,
            data: &bytemuck::cast_slice::<u64, u8>(s)[..len],
            rows,
            cols,
        }
    }
    // Only the layout being measured is held, so the large heads fit beside each other.
    // On the backend's weight memory, where it copies the matrices it does not repack.
    let stores: Vec<HugeVec<u64>> = if repacked {
        Vec::new()
    } else {
        (0..copies)
            .map(|_| HugeVec::from_slice(&store).expect("weight copy"))
            .collect()
    };
    let packed: Vec<RepackedMatrix> = if repacked {
        let start = Instant::now();
        let one =
            RepackedMatrix::from_qmatrix(&q(ty, &store, len, rows, cols)).expect("valid shapes");
        let secs = start.elapsed().as_secs_f64();
        println!(
            "repack  {:<5}   {:>6}x{:<5} t=1  {:>8.1} us  {:>6.2} GB/s",
            ty.name(),
            rows,
            cols,
            secs * 1e6,
            len as f64 / secs / 1e9
        );
        (0..copies).map(|_| one.clone()).collect()
    } else {
        Vec::new()
    };
    let x = rand_f32(cols, 3);
    let mut y = vec![0.0; rows];
    let mut scratch = MatmulScratch::new();
    for (pool, bw) in pools.iter().zip(bw) {
        let mut i = 0;
        let secs = time(Duration::from_millis(600), || {
            if repacked {
                matmul_repacked(pool, &packed[i % copies], &x, 1, &mut y, &mut scratch)
            } else {
                matmul(
                    pool,
                    &q(ty, &stores[i % copies][..], len, rows, cols),
                    &x,
                    1,
                    &mut y,
                    &mut scratch,
                )
            }
            .expect("valid shapes");
            i += 1;
        });
        let gbs = len as f64 / secs / 1e9;
        println!(
            "decode  {:<5}{} {:>6}x{:<5} t={}  {:>8.1} us  {:>6.2} GB/s  {:>4.0}% of bw",
            ty.name(),
            if repacked { "x8" } else { "  " },
            rows,
            cols,
            pool.n_threads(),
            secs * 1e6,
            gbs,
            100.0 * gbs / bw
        );
    }
}

/// Decode of matrices that read one activation (`shapes`, all of `ty`), as separate
/// products and as one [`matmul_repacked_multi_then`] call, each with 1 and 2 threads.
/// With `swiglu` (gate and up), the separate side runs the serial SwiGLU after the two
/// products, as the unfused nodes do, and the multi call its in-region epilogue. The two
/// sides alternate in short laps and the figure is the median of the lap ratios, so a
/// machine whose load drifts still compares them fairly.
fn fused(label: &str, ty: GgmlType, shapes: &[(usize, usize)], pools: &[ThreadPool]) {
    let swiglu = label == "ffn";
    let cols = shapes[0].1;
    let one: Vec<RepackedMatrix> = shapes
        .iter()
        .map(|&(rows, cols)| {
            let (store, len) = matrix(ty, rows, cols);
            let q = QMatrix {
                ty,
                data: &bytemuck::cast_slice::<u64, u8>(&store)[..len],
                rows,
                cols,
            };
            RepackedMatrix::from_qmatrix(&q).expect("valid shapes")
        })
        .collect();
    let bytes: usize = one.iter().map(RepackedMatrix::bytes).sum();
    let copies = STREAM_BYTES.div_ceil(bytes).max(1);
    let sets: Vec<Vec<RepackedMatrix>> = (0..copies).map(|_| one.clone()).collect();
    let ld: usize = shapes.iter().map(|s| s.0).sum();
    let x = rand_f32(cols, 3);
    let mut y = vec![0.0; ld];
    let mut act = vec![0.0; shapes[0].0];
    let mut scratch = MatmulScratch::new();
    let isa = Isa::detect();
    let epi = if swiglu {
        MultiEpilogue::SwiGlu
    } else {
        MultiEpilogue::None
    };
    for pool in pools {
        let mut i = 0;
        let (mut ratios, mut seps, mut muls) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..15 {
            let separate = time(Duration::from_millis(40), || {
                let mut off = 0;
                for m in &sets[i % copies] {
                    let out = &mut y[off..off + m.rows()];
                    matmul_repacked(pool, m, &x, 1, out, &mut scratch).expect("valid shapes");
                    off += m.rows();
                }
                if swiglu {
                    let (g, u) = y.split_at(shapes[0].0);
                    swiglu_slice(g, u, &mut act);
                }
                i += 1;
            });
            let multi = time(Duration::from_millis(40), || {
                let set = &sets[i % copies];
                let mut parts = Vec::with_capacity(set.len());
                let mut off = 0;
                for m in set {
                    parts.push((m, off));
                    off += m.rows();
                }
                matmul_repacked_multi_then(isa, pool, &parts, &x, 1, &mut y, ld, &mut scratch, epi)
                    .expect("valid shapes");
                i += 1;
            });
            ratios.push(separate / multi);
            seps.push(separate);
            muls.push(multi);
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (r, sep, mul) = (med(&mut ratios), med(&mut seps), med(&mut muls));
        println!(
            "fused   {label:<5} {ty:<5} {ld:>6}x{cols:<5} t={}  separate {:>7.1} us  multi {:>7.1} us  (median lap ratio {:>5.3}x)  {:>6.2} GB/s",
            pool.n_threads(),
            sep * 1e6,
            mul * 1e6,
            r,
            bytes as f64 / mul / 1e9
        );
    }
}

/// Cache-resident decode (64 rows, one thread): the kernels' compute ceiling, in the
/// layout the backend uses for `ty` on this CPU.
fn cached(ty: GgmlType, pool: &ThreadPool) {
    let (rows, cols) = (64, 4864);
    let (store, len) = matrix(ty, rows, cols);
    let data = &bytemuck::cast_slice::<u64, u8>(&store)[..len];
    let x = rand_f32(cols, 3);
    let mut y = vec![0.0; rows];
    let mut scratch = MatmulScratch::new();
    let m = QMatrix {
        ty,
        data,
        rows,
        cols,
    };
    let packed = RepackedMatrix::supports(ty)
        .then(|| RepackedMatrix::from_qmatrix(&m).expect("valid shapes"));
    let secs = time(Duration::from_millis(300), || {
        match &packed {
            Some(p) => matmul_repacked(pool, p, &x, 1, &mut y, &mut scratch),
            None => matmul(pool, &m, &x, 1, &mut y, &mut scratch),
        }
        .expect("valid shapes");
    });
    println!(
        "cached  {:<5}{} {:>6}x{:<5} t=1  {:>8.1} us  {:>6.2} GB/s  {:>6.2} Gelem/s",
        ty.name(),
        if packed.is_some() { "x8" } else { "  " },
        rows,
        cols,
        secs * 1e6,
        len as f64 / secs / 1e9,
        (rows * cols) as f64 / secs / 1e9
    );
}

fn prefill(
    ty: GgmlType,
    rows: usize,
    cols: usize,
    nt: usize,
    pools: &[ThreadPool],
    repacked: bool,
) {
    if !cols.is_multiple_of(ty.block_size())
        || (repacked && !(RepackedMatrix::supports(ty) || ty == GgmlType::Q6K))
    {
        return;
    }
    let (store, len) = matrix(ty, rows, cols);
    let data = &bytemuck::cast_slice::<u64, u8>(&store)[..len];
    let x = rand_f32(nt * cols, 5);
    let mut y = vec![0.0; nt * rows];
    let mut scratch = MatmulScratch::new();
    let m = QMatrix {
        ty,
        data,
        rows,
        cols,
    };
    let packed = repacked.then(|| RepackedMatrix::from_qmatrix(&m).expect("valid shapes"));
    for pool in pools {
        let secs = time(Duration::from_millis(800), || {
            match &packed {
                Some(p) => matmul_repacked(pool, p, &x, nt, &mut y, &mut scratch),
                None => matmul(pool, &m, &x, nt, &mut y, &mut scratch),
            }
            .expect("valid shapes");
        });
        println!(
            "prefill {:<5}{} {:>6}x{:<5} nt={nt} t={}  {:>8.2} ms  {:>7.1} GOP/s  {:>8.0} tok/s",
            ty.name(),
            if repacked { "x8" } else { "  " },
            rows,
            cols,
            pool.n_threads(),
            secs * 1e3,
            2.0 * (rows * cols * nt) as f64 / secs / 1e9,
            nt as f64 / secs
        );
    }
}

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wanted = |ty: GgmlType| {
        filter.is_empty() || filter.iter().any(|f| f.eq_ignore_ascii_case(ty.name()))
    };
    let decode_only = std::env::args().any(|a| a == "--decode");
    let fused_only = std::env::args().any(|a| a == "--fused");
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    println!("isa: {}", Isa::detect().name());
    let bw = bandwidth(&pools);
    use GgmlType::*;
    if decode_only || fused_only {
        for ty in [Q5_0, Q8_0, Q4K, Q6K]
            .into_iter()
            .filter(|t| wanted(*t) && !fused_only)
        {
            cached(ty, &pools[0]);
        }
        // Every decode matmul of the two real models, by (type, rows, cols), the lm heads
        // last: Qwen2.5-Coder 0.5B (Q5_0 q/k/o/gate/up and half of v, Q8_0 the other v and
        // the head, Q4_K/Q6_K ffn_down), then 1.5B (Q4_K everywhere, Q6_K half of v and
        // ffn_down, and the head).
        let shapes = [
            (Q5_0, 896, 896),
            (Q5_0, 128, 896),
            (Q8_0, 128, 896),
            (Q5_0, 4864, 896),
            (Q4K, 896, 4864),
            (Q6K, 896, 4864),
            (Q8_0, 151936, 896),
            (Q4K, 1536, 1536),
            (Q4K, 256, 1536),
            (Q6K, 256, 1536),
            (Q4K, 8960, 1536),
            (Q4K, 1536, 8960),
            (Q6K, 1536, 8960),
            (Q6K, 151936, 1536),
        ];
        for (ty, rows, cols) in shapes.into_iter().filter(|s| wanted(s.0) && !fused_only) {
            let repacked = RepackedMatrix::supports(ty);
            decode(ty, rows, cols, &pools, &bw, repacked);
        }
        // The decode fusions' products: q|k|v and gate|up of the two models.
        if wanted(Q5_0) {
            fused("qkv", Q5_0, &[(896, 896), (128, 896), (128, 896)], &pools);
            fused("ffn", Q5_0, &[(4864, 896), (4864, 896)], &pools);
        }
        if wanted(Q4K) {
            fused(
                "qkv",
                Q4K,
                &[(1536, 1536), (256, 1536), (256, 1536)],
                &pools,
            );
            fused("ffn", Q4K, &[(8960, 1536), (8960, 1536)], &pools);
        }
        return;
    }
    for pool in &pools {
        for share_us in [0.0, 2.0] {
            let mut laps: Vec<f64> = (0..20_000)
                .map(|_| {
                    let t = Instant::now();
                    pool.run(&|_, _| {
                        let s = Instant::now();
                        while s.elapsed().as_secs_f64() * 1e6 < share_us {
                            std::hint::spin_loop();
                        }
                    });
                    t.elapsed().as_secs_f64()
                })
                .collect();
            laps.sort_by(f64::total_cmp);
            let mean = laps.iter().sum::<f64>() / laps.len() as f64;
            println!(
                "pool    {share_us} us shares t={}  median {:>6.2} us  p99 {:>8.2} us  mean {:>8.2} us",
                pool.n_threads(),
                laps[laps.len() / 2] * 1e6,
                laps[laps.len() * 99 / 100] * 1e6,
                mean * 1e6
            );
        }
    }
    let main_types = [Q5_0, Q8_0, Q4K, Q6K, Q4_0, Q5K, F16, F32];
    for ty in main_types.into_iter().filter(|t| wanted(*t)) {
        cached(ty, &pools[0]);
    }
    let decode_shapes = [(4864, 896), (896, 4864), (896, 896), (128, 896)];
    for ty in main_types.into_iter().filter(|t| wanted(*t)) {
        for repacked in [false, true] {
            for (rows, cols) in decode_shapes {
                decode(ty, rows, cols, &pools, &bw, repacked);
            }
        }
    }
    for ty in [Q8_0].into_iter().filter(|t| wanted(*t)) {
        for repacked in [false, true] {
            decode(ty, 151936, 896, &pools, &bw, repacked);
        }
    }
    for ty in main_types.into_iter().filter(|t| wanted(*t)) {
        for repacked in [false, true] {
            for (rows, cols) in decode_shapes {
                prefill(ty, rows, cols, 512, &pools, repacked);
            }
        }
    }
    // The 1.5B model's projections (q/o, k/v, gate/up, down), in its k-quants and in the
    // two 4-bit i-quants a requantized copy would use.
    let large_shapes = [(1536, 1536), (256, 1536), (8960, 1536), (1536, 8960)];
    for ty in [Q4K, Q6K, Iq4Xs, Iq4Nl].into_iter().filter(|t| wanted(*t)) {
        for repacked in [false, true] {
            for (rows, cols) in large_shapes {
                decode(ty, rows, cols, &pools, &bw, repacked);
            }
            for (rows, cols) in large_shapes {
                prefill(ty, rows, cols, 512, &pools, repacked);
            }
        }
    }
    // The lattice i-quants and the ternary types (no repacked layout) at the same shapes.
    let low_bit = [Tq2_0, Tq1_0, Iq3S, Iq3Xxs, Iq2S, Iq2Xs, Iq2Xxs, Iq1M, Iq1S];
    for ty in low_bit.into_iter().filter(|t| wanted(*t)) {
        for (rows, cols) in large_shapes {
            decode(ty, rows, cols, &pools, &bw, false);
        }
        for (rows, cols) in large_shapes {
            prefill(ty, rows, cols, 512, &pools, false);
        }
    }
}

//! The host's int8 multiply-add peak, the ceiling of the quantized matmul kernels: the
//! throughput of the instruction mixes they are built from, measured on register-only
//! loops with enough independent accumulators to hide latency. Detected at run time;
//! a mix the CPU lacks is reported as absent, never assumed.
//!
//! - AVX2: `vpmaddubsw` (u8 × i8, pairs summed to i16), `vpmaddwd` by ones (to i32) and
//!   `vpaddd`: 32 multiply-adds per three instructions (256-bit).
//! - AVX-512 VNNI: `vpdpbusd` on 256-bit registers (what the VNNI tile kernels use: 32
//!   multiply-adds, accumulated in i32, per instruction), and on 512-bit ones (64).
//!
//! Figures are GOP/s (one multiply-add = 2 operations), per thread and for all threads
//! together; compare a kernel's achieved GOP/s with the mix it runs on.
//!
//! `cargo run --release -p minfer-cpu --example peak -- [threads] [seconds per mix]`

use std::time::Instant;

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let threads: usize = match args.next() {
        Some(t) => t
            .parse()
            .map_err(|_| format!("threads: '{t}' is not a number"))?,
        None => 1,
    };
    let secs: f64 = match args.next() {
        Some(s) => s
            .parse()
            .map_err(|_| format!("seconds: '{s}' is not a number"))?,
        None => 0.5,
    };
    if threads == 0 || secs.is_nan() || secs <= 0.0 {
        return Err("threads and seconds must be positive".into());
    }
    println!("int8 multiply-add peak, {threads} thread(s), {secs} s per mix");
    for mix in mixes() {
        match mix.run {
            None => println!("  {:<34} not available on this CPU", mix.name),
            Some(run) => {
                let per = measure(run, mix.macs_per_iter, threads, secs);
                println!(
                    "  {:<34} {:>8.1} GOP/s per thread, {:>8.1} GOP/s in all",
                    mix.name,
                    per / threads as f64,
                    per
                );
            }
        }
    }
    Ok(())
}

/// One instruction mix: `run(iters)` performs `iters` loop iterations of
/// `macs_per_iter` multiply-adds each and returns a value that depends on all of them.
struct Mix {
    name: &'static str,
    macs_per_iter: f64,
    run: Option<fn(u64) -> i32>,
}

/// The mixes this build knows, each with its kernel where the CPU has it.
fn mixes() -> Vec<Mix> {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = is_x86_feature_detected!("avx2");
        let vnni = is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl");
        let vnni512 = vnni && is_x86_feature_detected!("avx512f");
        vec![
            Mix {
                name: "avx2 vpmaddubsw+vpmaddwd (ymm)",
                macs_per_iter: x86::ACC_AVX2 as f64 * 32.0,
                run: avx2.then_some(x86::maddubs as fn(u64) -> i32),
            },
            Mix {
                name: "avx512-vnni vpdpbusd (ymm)",
                macs_per_iter: x86::ACC as f64 * 32.0,
                run: vnni.then_some(x86::dpbusd256 as fn(u64) -> i32),
            },
            Mix {
                name: "avx512-vnni vpdpbusd (zmm)",
                macs_per_iter: x86::ACC as f64 * 64.0,
                run: vnni512.then_some(x86::dpbusd512 as fn(u64) -> i32),
            },
        ]
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Vec::new()
    }
}

/// Multiply-adds per second of `run` on `threads` threads together, each running
/// batches of iterations until `secs` have passed.
fn measure(run: fn(u64) -> i32, macs_per_iter: f64, threads: usize, secs: f64) -> f64 {
    const BATCH: u64 = 1 << 16;
    run(BATCH); // warm-up: clocks and caches settle
    let t0 = Instant::now();
    let iters: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    let mut n = 0u64;
                    let mut sink = 0i32;
                    while t0.elapsed().as_secs_f64() < secs {
                        sink = sink.wrapping_add(run(BATCH));
                        n += BATCH;
                    }
                    std::hint::black_box(sink);
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    iters as f64 * macs_per_iter * 2.0 / t0.elapsed().as_secs_f64() / 1e9
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Independent accumulators per iteration: more than latency × issue width, so the
    /// loop runs at the ports' throughput.
    pub const ACC: usize = 12;

    /// The inputs, opaque to the optimizer so nothing is folded away.
    fn inputs() -> (i8, i8) {
        std::hint::black_box((3, -2))
    }

    pub fn maddubs(iters: u64) -> i32 {
        // SAFETY: chosen only after AVX2 was detected.
        unsafe { maddubs_impl(iters) }
    }

    /// Accumulators of the AVX2 mix: each needs a temporary too, and AVX2 has 16
    /// registers.
    pub const ACC_AVX2: usize = 6;

    /// In assembly: with constant inputs the compiler would hoist the products out of
    /// the loop and time the additions alone.
    #[target_feature(enable = "avx2")]
    unsafe fn maddubs_impl(iters: u64) -> i32 {
        use std::arch::asm;
        let (x, y) = inputs();
        let (a, b, ones) = (
            _mm256_set1_epi8(x),
            _mm256_set1_epi8(y),
            _mm256_set1_epi16(1),
        );
        let mut c = [_mm256_setzero_si256(); ACC_AVX2];
        for _ in 0..iters {
            // SAFETY: register-only AVX2 instructions (detected by the caller).
            asm!(
                "vpmaddubsw {t0}, {a}, {b}",
                "vpmaddubsw {t1}, {a}, {b}",
                "vpmaddubsw {t2}, {a}, {b}",
                "vpmaddubsw {t3}, {a}, {b}",
                "vpmaddubsw {t4}, {a}, {b}",
                "vpmaddubsw {t5}, {a}, {b}",
                "vpmaddwd {t0}, {t0}, {one}",
                "vpmaddwd {t1}, {t1}, {one}",
                "vpmaddwd {t2}, {t2}, {one}",
                "vpmaddwd {t3}, {t3}, {one}",
                "vpmaddwd {t4}, {t4}, {one}",
                "vpmaddwd {t5}, {t5}, {one}",
                "vpaddd {c0}, {c0}, {t0}",
                "vpaddd {c1}, {c1}, {t1}",
                "vpaddd {c2}, {c2}, {t2}",
                "vpaddd {c3}, {c3}, {t3}",
                "vpaddd {c4}, {c4}, {t4}",
                "vpaddd {c5}, {c5}, {t5}",
                a = in(ymm_reg) a,
                b = in(ymm_reg) b,
                one = in(ymm_reg) ones,
                c0 = inout(ymm_reg) c[0],
                c1 = inout(ymm_reg) c[1],
                c2 = inout(ymm_reg) c[2],
                c3 = inout(ymm_reg) c[3],
                c4 = inout(ymm_reg) c[4],
                c5 = inout(ymm_reg) c[5],
                t0 = out(ymm_reg) _,
                t1 = out(ymm_reg) _,
                t2 = out(ymm_reg) _,
                t3 = out(ymm_reg) _,
                t4 = out(ymm_reg) _,
                t5 = out(ymm_reg) _,
                options(nomem, nostack),
            );
        }
        fold256(&c)
    }

    pub fn dpbusd256(iters: u64) -> i32 {
        // SAFETY: chosen only after AVX-512 VNNI and VL were detected.
        unsafe { dpbusd256_impl(iters) }
    }

    #[target_feature(enable = "avx512vnni,avx512vl")]
    unsafe fn dpbusd256_impl(iters: u64) -> i32 {
        let (x, y) = inputs();
        let (a, b) = (_mm256_set1_epi8(x), _mm256_set1_epi8(y));
        let mut acc = [_mm256_setzero_si256(); ACC];
        for _ in 0..iters {
            for c in acc.iter_mut() {
                *c = _mm256_dpbusd_epi32(*c, a, b);
            }
        }
        fold256(&acc)
    }

    pub fn dpbusd512(iters: u64) -> i32 {
        // SAFETY: chosen only after AVX-512 F, VNNI and VL were detected.
        unsafe { dpbusd512_impl(iters) }
    }

    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn dpbusd512_impl(iters: u64) -> i32 {
        let (x, y) = inputs();
        let (a, b) = (_mm512_set1_epi8(x), _mm512_set1_epi8(y));
        let mut acc = [_mm512_setzero_si512(); ACC];
        for _ in 0..iters {
            for c in acc.iter_mut() {
                *c = _mm512_dpbusd_epi32(*c, a, b);
            }
        }
        acc.iter()
            .fold(0i32, |s, &v| s.wrapping_add(_mm512_reduce_add_epi32(v)))
    }

    /// A value depending on every accumulator, so none is dead code.
    #[target_feature(enable = "avx2")]
    unsafe fn fold256(acc: &[__m256i]) -> i32 {
        acc.iter()
            .fold(0i32, |s, &v| s.wrapping_add(_mm256_extract_epi32(v, 0)))
    }
}

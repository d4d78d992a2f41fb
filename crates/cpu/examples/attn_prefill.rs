//! The attention of one layer through a whole prefill, alone: a prompt of N tokens in
//! chunks of the engine's batch (512), each chunk attending to every key before it, with
//! the default model's geometry (14 query heads, 2 KV heads of 64). Prints the time; its
//! real use is under an instruction counter, which a busy machine does not disturb:
//!
//! `valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/attn_prefill 4096 f16 1`
//!
//! `cargo run --release -p minfer-cpu --example attn_prefill -- [tokens] [kv type] [threads]`

use std::time::Instant;

use minfer_cpu::ops::attn::{attention, AttnArgs, AttnScratch};
use minfer_cpu::ops::vec::VecIsa;
use minfer_cpu::threadpool::ThreadPool;
use minfer_graph::KvType;

mod common;
use common::number;

/// Tokens per prefill step (the engine's default batch).
const CHUNK: usize = 512;

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let n = number(args.next(), "tokens", 512)?;
    let kv_type = KvType::parse(&args.next().unwrap_or_else(|| "f32".into()))?;
    let threads = number(args.next(), "threads", 1)?;
    if n == 0 || threads == 0 {
        return Err("tokens and threads must be at least 1".into());
    }
    let m = common::layer(14, 2, 64, n);
    let common::Inputs { k: kr, v: vr, q } =
        common::inputs(&m, kv_type, n, CHUNK.min(n) * m.n_head * m.hd)?;
    let types = [kv_type; 2];
    let pool = ThreadPool::new(threads);
    let isa = VecIsa::detect();
    let mut scratch = AttnScratch::default();
    let mut out = vec![0.0f32; CHUNK.min(n) * m.n_head * m.hd];
    let t0 = Instant::now();
    let mut p0 = 0;
    while p0 < n {
        let nt = CHUNK.min(n - p0);
        let pos: Vec<f32> = (p0 as u32..(p0 + nt) as u32).map(f32::from_bits).collect();
        let a = AttnArgs {
            meta: &m,
            q: &q,
            q_stride: m.n_head * m.hd,
            nt,
            pos: &pos,
            span: None,
            k: &kr,
            v: &vr,
            types,
            sinks: None,
        };
        attention(&pool, isa, &a, &mut out, &mut scratch)?;
        p0 += nt;
    }
    let dt = t0.elapsed().as_secs_f64();
    let check: f64 = out.iter().map(|&x| f64::from(x)).sum();
    println!(
        "attention of one layer, {n} tokens, {kv_type} K/V, {threads} threads, {isa:?}: {:.1} ms (checksum {check:.6})",
        dt * 1e3
    );
    Ok(())
}

//! The attention of one layer in decode, alone: one token at a time after a context of N
//! tokens, with Qwen3.5's full-attention geometry (8 query heads, 2 KV heads of 256).
//! Prints the time per token and the K/V bytes it reads per second.
//!
//! `cargo run --release -p minfer-cpu --example attn_decode -- [depth] [kv type] [threads] [tokens] [layers]`
//!
//! With `layers` above one, each token runs that many layers, each over K/V of its own,
//! as a model does: enough layers that their K/V outgrow the last-level cache make the
//! reads come from memory, where one layer's K/V would stay cached between tokens.

use std::time::Instant;

use minfer_cpu::hugemem::HugeVec;
use minfer_cpu::ops::attn::{attention, AttnArgs, AttnScratch};
use minfer_cpu::ops::vec::VecIsa;
use minfer_cpu::threadpool::ThreadPool;
use minfer_graph::KvType;

mod common;
use common::number;

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let depth = number(args.next(), "depth", 4096)?;
    let kv_type = KvType::parse(&args.next().unwrap_or_else(|| "f32".into()))?;
    let threads = number(args.next(), "threads", 1)?;
    let steps = number(args.next(), "tokens", 64)?;
    let layers = number(args.next(), "layers", 1)?;
    if depth == 0 || threads == 0 || steps == 0 || layers == 0 {
        return Err("depth, threads, tokens and layers must be at least 1".into());
    }
    let n = depth + steps;
    let m = common::layer(8, 2, 256, n);
    let common::Inputs { k: kr, v: vr, q } = common::inputs(&m, kv_type, n, m.n_head * m.hd)?;
    let types = [kv_type; 2];
    let row_words = minfer_cpu::ops::kv::region_words(kv_type, m.nkt(), n)?.0;
    // The other layers hold copies: the same values at other addresses, on huge pages
    // as the backend's regions are (`hugemem::advise_huge`).
    let on_huge = |x: &[f32]| HugeVec::from_slice(x).map_err(|e| format!("K/V memory: {e}"));
    let regions = (0..layers)
        .map(|_| Ok((on_huge(&kr)?, on_huge(&vr)?)))
        .collect::<Result<Vec<_>, String>>()?;
    let pool = ThreadPool::new(threads);
    let isa = VecIsa::detect();
    let mut scratch = AttnScratch::default();
    let mut out = vec![0.0f32; m.n_head * m.hd];
    let mut check = 0.0f64;
    let t0 = Instant::now();
    let steps_and_layers = (depth..n).flat_map(|p| regions.iter().map(move |r| (p, r)));
    for (p, (kr, vr)) in steps_and_layers {
        let pos = [f32::from_bits(p as u32)];
        let a = AttnArgs {
            meta: &m,
            q: &q,
            q_stride: m.n_head * m.hd,
            nt: 1,
            pos: &pos,
            span: None,
            k: kr,
            v: vr,
            types,
            sinks: None,
        };
        attention(&pool, isa, &a, &mut out, &mut scratch)?;
        check += out.iter().map(|&x| f64::from(x)).sum::<f64>();
    }
    let per = t0.elapsed().as_secs_f64() / (steps * layers) as f64;
    // K and V rows read per token, at the mean depth.
    let bytes = 2.0 * (depth as f64 + steps as f64 / 2.0) * (row_words * 4) as f64;
    println!(
        "decode attention after {depth} tokens, {kv_type} K/V, {threads} threads, {layers} layers, {isa:?}: {:.3} ms a token and layer, {:.1} GB/s of K/V (checksum {check:.6})",
        per * 1e3,
        bytes / per / 1e9
    );
    Ok(())
}

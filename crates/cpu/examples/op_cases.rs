//! The shared op-case table as micro-benchmarks on the CPU backend: each case is
//! prepared once (weights registered, graph assigned and allocated) and then executed
//! repeatedly; prints the median time per execution.
//!
//! `cargo run --release -p minfer-cpu --example op_cases -- [threads] [filter]`

use std::time::Instant;

use minfer_cpu::CpuBackend;
use minfer_graph::testing::cases::{op_cases, Prepared};
use minfer_graph::BackendImpl;

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let threads: usize = match args.next() {
        Some(t) => t
            .parse()
            .map_err(|_| format!("threads: '{t}' is not a number"))?,
        None => minfer_cpu::threadpool::physical_cores(),
    };
    let filter = args.next().unwrap_or_default();
    for case in op_cases().iter().filter(|c| c.name.contains(&filter)) {
        let backends: Vec<Box<dyn BackendImpl>> = vec![Box::new(CpuBackend::new(threads))];
        let mut p = Prepared::new(case, backends)?;
        p.run()?; // warm-up: scratch grows once
        let mut times: Vec<f64> = (0..21)
            .map(|_| {
                let t = Instant::now();
                p.run().map(|_| t.elapsed().as_secs_f64() * 1e6)
            })
            .collect::<Result<_, _>>()?;
        times.sort_by(f64::total_cmp);
        println!("{:<60} {:>9.1} us", case.name, times[times.len() / 2]);
    }
    Ok(())
}

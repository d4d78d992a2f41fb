//! The op-case table every backend runs (design §3.5): one small graph per case,
//! covering every op the Qwen2/Qwen3 graphs emit, every weight type, odd shapes,
//! one and several tokens, and several sequences in one KV arena.
//!
//! A case is data: a graph built through [`GraphBuilder`], its inputs, and its
//! weights as an in-memory GGUF (quantized by the project's reference quantizers), so
//! every backend receives them through [`BackendImpl::register_gguf`] exactly as it
//! receives a model's. [`run_cases`] executes each case through the real
//! [`GraphAllocator`] and [`BackendScheduler`] on the backend under test and on a
//! reference, and compares the outputs within the case's bound: the largest absolute
//! difference divided by the largest reference magnitude. The bounds are what the
//! reference quantizers and the activation quantization of the quantized kernels
//! (Q8_0 / Q8_K rows, as in ggml) cost against an f32 reference, with headroom; a
//! float case is bounded by summation order alone. [`Prepared`] keeps one case
//! allocated so the same table serves as micro-benchmarks.

use std::sync::Arc;

use minfer_gguf::{GgmlType, GgufFile, GgufWriter};

use crate::backend::BackendImpl;
use crate::builder::GraphBuilder;
use crate::fusion::FusionPass;
use crate::ir::{AttnMode, Backend, ComputeGraph, DType, RopeStyle, WeightRef, WeightType};
use crate::meta::{AttnMeta, RoPEMeta};
use crate::scheduler::BackendScheduler;
use crate::GraphAllocator;

mod activation;
mod moe;
mod recurrent;

/// One input's values: f32 activations or u32 ids (positions, cells, spans).
#[derive(Debug, Clone, PartialEq)]
pub enum CaseInput {
    /// Activations.
    F32(Vec<f32>),
    /// Token ids, positions, KV cells or spans.
    U32(Vec<u32>),
}

/// One case of the table.
#[derive(Clone)]
pub struct OpCase {
    /// Unique, descriptive name (op, type, shape, tokens).
    pub name: String,
    /// `Op::name` of the op under test; the case fails if a backend claiming it does
    /// not execute it.
    pub op: &'static str,
    /// The graph; its first output is compared.
    pub graph: ComputeGraph,
    /// Values of every input, by name.
    pub inputs: Vec<(String, CaseInput)>,
    /// The weights, as a GGUF file.
    pub weights: Arc<GgufFile>,
    /// Largest accepted `max |got - want| / max |want|`.
    pub bound: f32,
}

/// What one case gave.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseOutcome {
    /// The case's name.
    pub name: String,
    /// Measured `max |got - want| / max |want|`.
    pub error: f32,
    /// The case's bound.
    pub bound: f32,
}

impl std::fmt::Debug for OpCase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpCase")
            .field("name", &self.name)
            .field("op", &self.op)
            .field("bound", &self.bound)
            .finish_non_exhaustive()
    }
}

/// The result of a table run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CaseReport {
    /// Cases the backend under test executed, with their errors.
    pub passed: Vec<CaseOutcome>,
    /// Cases whose op the backend under test does not claim (they ran elsewhere by
    /// capability, so they prove nothing about it).
    pub unclaimed: Vec<String>,
    /// One line per failing case, naming it and what went wrong.
    pub failures: Vec<String>,
}

impl CaseReport {
    /// `Ok` when no case failed, else every failure, one per line.
    pub fn check(&self) -> Result<(), String> {
        if self.failures.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} of {} op cases failed:\n{}",
                self.failures.len(),
                self.failures.len() + self.passed.len() + self.unclaimed.len(),
                self.failures.join("\n")
            ))
        }
    }
}

/// Builds a fresh set of backends for one case (one allocator holds them).
pub type MakeBackends<'a> = &'a dyn Fn() -> Vec<Box<dyn BackendImpl>>;

/// One case registered, assigned, fused and allocated on a set of backends, ready to
/// run any number of times (the micro-benchmark path).
pub struct Prepared {
    graph: ComputeGraph,
    alloc: GraphAllocator,
    sched: BackendScheduler,
    inputs: Vec<(String, CaseInput)>,
}

impl Prepared {
    /// Registers the case's weights on every backend, then assigns, fuses and
    /// allocates its graph as the engine does.
    pub fn new(case: &OpCase, mut backends: Vec<Box<dyn BackendImpl>>) -> Result<Self, String> {
        for b in &mut backends {
            b.register_gguf(&case.weights)
                .map_err(|e| format!("{}: weights: {e}", b.name()))?;
        }
        let mut alloc = GraphAllocator::new(backends).map_err(|e| e.to_string())?;
        let mut graph = case.graph.clone();
        let mut sched = BackendScheduler::new();
        sched.assign_backends(&mut graph, &alloc);
        FusionPass::new().run(&mut graph, &alloc);
        alloc.alloc_graph(&graph).map_err(|e| e.to_string())?;
        Ok(Prepared {
            graph,
            alloc,
            sched,
            inputs: case.inputs.clone(),
        })
    }

    /// The backend each node of op `op` was assigned to, in build order.
    pub fn placements(&self, op: &str) -> Vec<Option<Backend>> {
        self.graph
            .nodes
            .iter()
            .filter(|n| n.op.name() == op)
            .map(|n| n.backend)
            .collect()
    }

    /// Fills the inputs, executes, and reads the first output back to the host.
    pub fn run(&mut self) -> Result<Vec<f32>, String> {
        for (name, v) in &self.inputs {
            match v {
                CaseInput::F32(x) => self.alloc.fill_input(&self.graph, name, x),
                CaseInput::U32(x) => self.alloc.fill_input_u32(&self.graph, name, x),
            }
            .map_err(|e| format!("input '{name}': {e}"))?;
        }
        self.sched
            .execute(&self.graph, &mut self.alloc)
            .map_err(|e| e.to_string())?;
        let out = *self
            .graph
            .outputs
            .first()
            .ok_or("the graph has no output")?;
        self.alloc
            .copy_to_cpu(out)
            .ok_or_else(|| "the output is not readable".to_string())
    }
}

/// `max |got - want| / max |want|`; infinite on a length mismatch or a non-finite value.
pub fn relative_error(got: &[f32], want: &[f32]) -> f32 {
    if got.len() != want.len() || got.iter().chain(want).any(|v| !v.is_finite()) {
        return f32::INFINITY;
    }
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    let diff = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    diff / scale
}

/// Runs every case on `under_test` (whose op claims are checked on backend `target`)
/// and on `reference`, and compares within each case's bound. Every failing case is
/// reported by name; none stops the run.
pub fn run_cases(
    cases: &[OpCase],
    target: Backend,
    under_test: MakeBackends,
    reference: MakeBackends,
) -> CaseReport {
    let mut report = CaseReport::default();
    for case in cases {
        let outcome = (|| -> Result<Option<f32>, String> {
            let mut test = Prepared::new(case, under_test())?;
            let placed = test.placements(case.op);
            if placed.is_empty() {
                return Err(format!("the graph holds no '{}' node", case.op));
            }
            if placed.iter().any(|&b| b != Some(target)) {
                let claims = test.alloc.backend(target).is_some_and(|b| {
                    case.graph
                        .nodes
                        .iter()
                        .filter(|n| n.op.name() == case.op)
                        .all(|n| b.supports_node(n))
                });
                if claims {
                    return Err(format!(
                        "{target} claims '{}' but it was placed on {placed:?}",
                        case.op
                    ));
                }
                return Ok(None);
            }
            let got = test.run()?;
            let want = Prepared::new(case, reference())?.run()?;
            Ok(Some(relative_error(&got, &want)))
        })();
        match outcome {
            Ok(None) => report.unclaimed.push(case.name.clone()),
            Ok(Some(error)) if error <= case.bound => report.passed.push(CaseOutcome {
                name: case.name.clone(),
                error,
                bound: case.bound,
            }),
            Ok(Some(error)) => report.failures.push(format!(
                "{}: error {error:.3e} exceeds the bound {:.1e}",
                case.name, case.bound
            )),
            Err(e) => report.failures.push(format!("{}: {e}", case.name)),
        }
    }
    report
}

/// Runs the whole table on a device backend as its integration test does: `device`
/// builds the CPU host and the device `target` (called `name`) afresh for each case,
/// the scalar f32 reference backend is the yardstick, and each case's outcome is printed
/// with a summary line. The run passes [`check_device_report`] against `decoded`, the
/// weight types the device's kernels decode; `Err` says every way it did not.
pub fn run_device_cases(
    target: Backend,
    name: &str,
    device: MakeBackends,
    decoded: &[GgmlType],
) -> Result<CaseReport, String> {
    let cases = op_cases();
    let t0 = std::time::Instant::now();
    let reference =
        || -> Vec<Box<dyn BackendImpl>> { vec![Box::new(crate::testing::RefBackend::cpu())] };
    let report = run_cases(&cases, target, device, &reference);
    for o in &report.passed {
        println!("{:<60} {:.2e} (bound {:.0e})", o.name, o.error, o.bound);
    }
    println!(
        "RESULT op_cases {} of {} on {name} in {:.1?}",
        report.passed.len(),
        cases.len(),
        t0.elapsed()
    );
    println!("declined by capability: {:?}", report.unclaimed);
    check_device_report(&report, cases.len(), name, decoded)?;
    Ok(report)
}

/// `Ok` when a device backend's run of a table of `n_cases` cases shows full coverage:
/// no case failed; every case it did not run is one it declines by capability (a matmul
/// over a weight type outside `decoded`, rope with Llama 3 frequency factors, or
/// sliding-window attention on a backend whose kernel has no term for it, attention over
/// a KV ring, the experts' routing and products
/// (not the shared expert's sigmoid gate), the hybrid recurrent layers' ops, BERT's LayerNorm and bidirectional attention:
/// those nodes run on the CPU in a real graph); at
/// least one matmul case ran for each type in `decoded`; and every case is accounted for.
pub fn check_device_report(
    report: &CaseReport,
    n_cases: usize,
    name: &str,
    decoded: &[GgmlType],
) -> Result<(), String> {
    report.check()?;
    for case in &report.unclaimed {
        let mut words = case.split_whitespace();
        let (op, ty) = (words.next(), words.next().unwrap_or(""));
        // No device kernel has the frequency factors or the YaRN terms
        // (`device_kit::supports_op` and `supports_node`).
        let declined_rope =
            op == Some("rope") && (case.contains("freq_factors") || case.contains(" yarn "));
        // A device kernel without a window term declines it (`device_kit::supports_node`).
        let declined_window = op == Some("attn") && case.contains(" window ");
        // No device kernel maps rows onto a KV ring (`device_kit::supports_node`).
        let declined_ring = op == Some("attn") && case.contains(" ring ");
        // Nor attention sinks (gpt-oss; `device_kit::supports_node`).
        let declined_sinks = op == Some("attn") && case.contains(" sinks");
        // Nor an encoder's terms: bidirectional attention and LayerNorm (BERT;
        // `device_kit::supports_node` and `supports_op`).
        let declined_encoder =
            op == Some("layer_norm") || (op == Some("attn") && case.contains(" non-causal"));
        let declined_matmul = op == Some("matmul") && !decoded.iter().any(|d| d.name() == ty);
        // No device kernel routes experts or has a softmax (`device_kit::supports_op`);
        // the shared expert's `mul_sigmoid` has one.
        let declined_moe = matches!(
            op,
            Some("softmax" | "top_k" | "mul_mat_id" | "mul_mat_id_swiglu" | "moe_sum")
        );
        // No device kernel has the hybrid recurrent layers' ops (`device_kit::supports_op`).
        let declined_recurrent = matches!(
            op,
            Some("slice" | "sigmoid_gate" | "ssm_conv" | "delta_net")
        );
        if !(declined_rope
            || declined_matmul
            || declined_window
            || declined_moe
            || declined_ring
            || declined_sinks
            || declined_encoder
            || declined_recurrent)
        {
            return Err(format!(
                "'{case}' was not run on {name}, though the backend implements it"
            ));
        }
    }
    for ty in decoded {
        let prefix = format!("matmul {} ", ty.name());
        if !report.passed.iter().any(|o| o.name.starts_with(&prefix)) {
            return Err(format!("no {ty} matmul case ran on {name}"));
        }
    }
    let counted = report.passed.len() + report.unclaimed.len();
    if counted != n_cases {
        return Err(format!(
            "{counted} of {n_cases} cases accounted for on {name} ({} passed, {} declined)",
            report.passed.len(),
            report.unclaimed.len()
        ));
    }
    Ok(())
}

/// Deterministic values in `[-0.5, 0.5)` from the shared test generator (same everywhere).
pub fn values(seed: u64, n: usize) -> Vec<f32> {
    minfer_testkit::Rng::new(seed).vec(n, 0.5)
}

/// A GGUF holding `tensors` (name, GGUF dims, type, values).
fn gguf(tensors: &[(&str, Vec<u64>, GgmlType, Vec<f32>)]) -> Arc<GgufFile> {
    let mut w = GgufWriter::new();
    for (name, dims, ty, data) in tensors {
        // The table's own data: a failure here is a bug in the table, not user input.
        w.add_tensor_f32(name, dims, *ty, data)
            .unwrap_or_else(|e| panic!("op case weight '{name}': {e}"));
    }
    let bytes = w
        .to_bytes()
        .unwrap_or_else(|e| panic!("op case weights: {e}"));
    Arc::new(GgufFile::from_bytes(bytes).unwrap_or_else(|e| panic!("op case weights: {e}")))
}

fn wref(name: &str, ty: GgmlType, shape: [usize; 2]) -> WeightRef {
    WeightRef::new(name, WeightType(ty.id()), shape)
}

/// The weight types of the op cases, from every family the CPU backend multiplies, with
/// the bound its case meets against an f32 reference (activations are quantized to Q8 for
/// quantized types).
pub const MATMUL_TYPES: &[(GgmlType, f32)] = &[
    (GgmlType::F32, 1e-5),
    (GgmlType::F16, 1e-4),
    (GgmlType::BF16, 1e-4),
    (GgmlType::Q4_0, 2e-2),
    (GgmlType::Q4_1, 2e-2),
    (GgmlType::Q5_0, 2e-2),
    (GgmlType::Q5_1, 2e-2),
    (GgmlType::Q8_0, 2e-2),
    (GgmlType::Q2K, 2e-2),
    (GgmlType::Q3K, 2e-2),
    (GgmlType::Q4K, 2e-2),
    (GgmlType::Q5K, 2e-2),
    (GgmlType::Q6K, 2e-2),
    (GgmlType::Iq4Nl, 2e-2),
    (GgmlType::Iq4Xs, 2e-2),
    (GgmlType::Iq3S, 2e-2),
    (GgmlType::Iq3Xxs, 2e-2),
    (GgmlType::Iq2S, 2e-2),
    (GgmlType::Iq2Xs, 2e-2),
    (GgmlType::Iq2Xxs, 2e-2),
    (GgmlType::Iq1M, 2e-2),
    (GgmlType::Iq1S, 2e-2),
    (GgmlType::Mxfp4, 2e-2),
    (GgmlType::Tq1_0, 2e-2),
    (GgmlType::Tq2_0, 2e-2),
];

/// The weight types every device backend decodes: those of the real models (the table a
/// GPU backend must cover first) and the IQ4 pair. Their embedding lookups are cases, and
/// a device may decline none of them.
pub const DEVICE_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4K,
    GgmlType::Q6K,
    GgmlType::Iq4Nl,
    GgmlType::Iq4Xs,
];

/// Token counts: one (decode) and several, odd and past a 4-token kernel tile.
const TOKENS: [usize; 3] = [1, 3, 7];

fn ids_input(name: &str, v: Vec<u32>) -> (String, CaseInput) {
    (name.to_string(), CaseInput::U32(v))
}

fn f32_input(name: &str, v: Vec<f32>) -> (String, CaseInput) {
    (name.to_string(), CaseInput::F32(v))
}

/// A `[in_dim x out_dim]` weight `w` of type `ty` and a bias `b`, seeded by the type.
fn matmul_weights(ty: GgmlType, in_dim: usize, out_dim: usize) -> Arc<GgufFile> {
    gguf(&[
        (
            "w",
            vec![in_dim as u64, out_dim as u64],
            ty,
            values(ty.id() as u64 + 1, in_dim * out_dim),
        ),
        (
            "b",
            vec![out_dim as u64],
            GgmlType::F32,
            values(99, out_dim),
        ),
    ])
}

/// `x [in_dim, nt] @ w (+ b)` over `weights` (see [`matmul_weights`]).
fn matmul_case(
    ty: GgmlType,
    [in_dim, out_dim]: [usize; 2],
    nt: usize,
    bias: bool,
    weights: &Arc<GgufFile>,
    bound: f32,
) -> OpCase {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [in_dim, nt, 1, 1], DType::F32);
    let w = wref("w", ty, [in_dim, out_dim]);
    let bw = wref("b", GgmlType::F32, [out_dim, 1]);
    let y = b.matmul(x, &w, bias.then_some(&bw));
    b.output(y);
    OpCase {
        name: format!(
            "matmul {} [{in_dim}x{out_dim}] nt={nt}{}",
            ty.name(),
            if bias { " +bias" } else { "" }
        ),
        op: "matmul",
        graph: b.build(),
        inputs: vec![f32_input("x", values(7 + nt as u64, in_dim * nt))],
        weights: Arc::clone(weights),
        bound,
    }
}

fn matmul_cases(out: &mut Vec<OpCase>) {
    // 37 outputs is odd, so no row count is a multiple of a device's rows per workgroup.
    let out_dim = 37;
    for &(ty, bound) in MATMUL_TYPES {
        // K-quants, the 256-element i-quants and TQ pack 256 values per block, the others
        // 32.
        let in_dim = if ty.block_size() == 256 { 256 } else { 96 };
        let weights = matmul_weights(ty, in_dim, out_dim);
        for nt in TOKENS {
            for bias in [false, true] {
                out.push(matmul_case(
                    ty,
                    [in_dim, out_dim],
                    nt,
                    bias,
                    &weights,
                    bound,
                ));
            }
        }
    }
    // The IQ4 pair, which the devices decode, over several super-blocks a row (sixteen
    // IQ4_NL blocks, two IQ4_XS super-blocks) for decode and for a prompt of 9 tokens,
    // past the devices' 8-token tiles and decode kernels.
    for &(ty, bound) in MATMUL_TYPES {
        if !matches!(ty, GgmlType::Iq4Nl | GgmlType::Iq4Xs) {
            continue;
        }
        let in_dim = 512;
        let weights = matmul_weights(ty, in_dim, out_dim);
        for nt in [1, 9] {
            out.push(matmul_case(
                ty,
                [in_dim, out_dim],
                nt,
                true,
                &weights,
                bound,
            ));
        }
    }
}

fn get_rows_cases(out: &mut Vec<OpCase>) {
    let (n_embd, n_vocab) = (256usize, 11u64);
    for &ty in DEVICE_TYPES {
        let weights = gguf(&[(
            "tok_embd",
            vec![n_embd as u64, n_vocab],
            ty,
            values(40 + ty.id() as u64, n_embd * n_vocab as usize),
        )]);
        for nt in TOKENS {
            let mut b = GraphBuilder::new();
            let ids = b.input("ids", [nt, 1, 1, 1], DType::I32);
            let e = b.embedding(ids, &wref("tok_embd", ty, [n_embd, n_vocab as usize]));
            b.output(e);
            let rows = (0..nt as u32)
                .map(|t| (t * 7 + 3) % n_vocab as u32)
                .collect();
            out.push(OpCase {
                name: format!("get_rows embedding {} nt={nt}", ty.name()),
                op: "get_rows",
                graph: b.build(),
                inputs: vec![ids_input("ids", rows)],
                weights: Arc::clone(&weights),
                // Dequantization is exact arithmetic on both sides.
                bound: 1e-6,
            });
        }
    }
    // Tail-row selection of an activation (G3): rows picked out of nt.
    for nt in [3usize, 7] {
        let mut b = GraphBuilder::new();
        let x = b.input("x", [33, nt, 1, 1], DType::F32);
        let ids = b.input("tail", [2, 1, 1, 1], DType::I32);
        let r = b.get_rows(x, ids, [33, 2, 1, 1]);
        b.output(r);
        out.push(OpCase {
            name: format!("get_rows tail rows of nt={nt}"),
            op: "get_rows",
            graph: b.build(),
            inputs: vec![
                f32_input("x", values(5, 33 * nt)),
                ids_input("tail", vec![0, nt as u32 - 1]),
            ],
            weights: gguf(&[]),
            bound: 0.0,
        });
    }
}

fn elementwise_cases(out: &mut Vec<OpCase>) {
    let d = 67usize;
    for nt in TOKENS {
        for (op, name) in [
            ("add", "add"),
            ("mul", "mul"),
            ("swiglu", "swiglu"),
            ("geglu", "geglu"),
        ] {
            for broadcast in [false, true] {
                if broadcast && (op == "swiglu" || op == "geglu") {
                    continue;
                }
                let mut b = GraphBuilder::new();
                let x = b.input("a", [d, nt, 1, 1], DType::F32);
                let bnt = if broadcast { 1 } else { nt };
                let y = b.input("b", [d, bnt, 1, 1], DType::F32);
                let z = match op {
                    "add" => b.add(x, y),
                    "mul" => b.mul(x, y),
                    "geglu" => b.geglu(x, y),
                    _ => b.swiglu(x, y),
                };
                b.output(z);
                out.push(OpCase {
                    name: format!(
                        "{name} [{d}] nt={nt}{}",
                        if broadcast { " broadcast" } else { "" }
                    ),
                    op,
                    graph: b.build(),
                    inputs: vec![
                        f32_input("a", values(11, d * nt)),
                        f32_input("b", values(12, d * bnt)),
                    ],
                    weights: gguf(&[]),
                    bound: 1e-6,
                });
            }
        }
    }
}

fn norm_cases(out: &mut Vec<OpCase>) {
    let (hd, nh) = (64usize, 3usize);
    let d = hd * nh;
    let weights = gguf(&[
        ("norm", vec![d as u64], GgmlType::F32, values(21, d)),
        ("qk", vec![hd as u64], GgmlType::F32, values(22, hd)),
        ("norm_b", vec![d as u64], GgmlType::F32, values(26, d)),
    ]);
    for nt in TOKENS {
        for weighted in [false, true] {
            let mut b = GraphBuilder::new();
            let x = b.input("x", [d, nt, 1, 1], DType::F32);
            let w = wref("norm", GgmlType::F32, [d, 1]);
            let y = b.rms_norm(x, weighted.then_some(&w), 1e-6);
            b.output(y);
            out.push(OpCase {
                name: format!(
                    "rms_norm [{d}] nt={nt}{}",
                    if weighted { " weighted" } else { "" }
                ),
                op: "rms_norm",
                graph: b.build(),
                inputs: vec![f32_input("x", values(23, d * nt))],
                weights: Arc::clone(&weights),
                bound: 1e-5,
            });
        }
        // BERT's layer norm, with its weight and bias and bare; the inputs are offset so
        // that the mean matters.
        for affine in [false, true] {
            let mut b = GraphBuilder::new();
            let x = b.input("x", [d, nt, 1, 1], DType::F32);
            let (w, bias) = (
                wref("norm", GgmlType::F32, [d, 1]),
                wref("norm_b", GgmlType::F32, [d, 1]),
            );
            let y = b.layer_norm(x, affine.then_some(&w), affine.then_some(&bias), 1e-12);
            b.output(y);
            let xs = values(25, d * nt).into_iter().map(|v| v + 0.75).collect();
            out.push(OpCase {
                name: format!(
                    "layer_norm [{d}] nt={nt}{}",
                    if affine { " weight bias" } else { "" }
                ),
                op: "layer_norm",
                graph: b.build(),
                inputs: vec![f32_input("x", xs)],
                weights: Arc::clone(&weights),
                bound: 1e-5,
            });
        }
        let mut b = GraphBuilder::new();
        let x = b.input("x", [d, nt, 1, 1], DType::F32);
        let w = wref("qk", GgmlType::F32, [hd, 1]);
        let y = b.qk_norm(x, Some(&w), hd, nh, 1e-6);
        b.output(y);
        out.push(OpCase {
            name: format!("qk_norm hd={hd} nh={nh} nt={nt}"),
            op: "qk_norm",
            graph: b.build(),
            inputs: vec![f32_input("x", values(24, d * nt))],
            weights: Arc::clone(&weights),
            bound: 1e-5,
        });
    }
}

fn rope_meta(hd: usize, nh: usize, style: RopeStyle) -> RoPEMeta {
    RoPEMeta {
        n_dims: hd,
        freq_base: 1_000_000.0,
        freq_scale: 1.0,
        n_head: nh,
        hd,
        style,
        freq_factors: None,
        yarn: None,
    }
}

fn rope_cases(out: &mut Vec<OpCase>) {
    let (hd, nh) = (64usize, 3usize);
    for style in [RopeStyle::NonInterleaved, RopeStyle::Interleaved] {
        for nt in TOKENS {
            let mut b = GraphBuilder::new();
            let x = b.input("x", [hd * nh, nt, 1, 1], DType::F32);
            let pos = b.input("pos", [nt, 1, 1, 1], DType::I32);
            let y = b.rope(x, pos, style, rope_meta(hd, nh, style));
            b.output(y);
            // Positions far from 0 too: the angle computation must hold there.
            let positions = (0..nt as u32).map(|t| t * 37 + 5).collect();
            out.push(OpCase {
                name: format!("rope {style:?} hd={hd} nh={nh} nt={nt}"),
                op: "rope",
                graph: b.build(),
                inputs: vec![
                    f32_input("x", values(31, hd * nh * nt)),
                    ids_input("pos", positions),
                ],
                weights: gguf(&[]),
                bound: 1e-4,
            });
        }
    }
    // Partial rotation (n_dims < hd): each head's tail passes through unchanged, and a
    // freq_scale below 1 stretches the angles.
    for style in [RopeStyle::NonInterleaved, RopeStyle::Interleaved] {
        let (hd, nh, nt) = (16usize, 3usize, 4usize);
        let mut b = GraphBuilder::new();
        let x = b.input("x", [hd * nh, nt, 1, 1], DType::F32);
        let pos = b.input("pos", [nt, 1, 1, 1], DType::I32);
        let meta = RoPEMeta {
            n_dims: 8,
            freq_base: 10000.0,
            freq_scale: 0.5,
            ..rope_meta(hd, nh, style)
        };
        let y = b.rope(x, pos, style, meta);
        b.output(y);
        out.push(OpCase {
            name: format!("rope {style:?} partial n_dims=8 hd={hd} nh={nh} nt={nt}"),
            op: "rope",
            graph: b.build(),
            inputs: vec![
                f32_input("x", values(32, hd * nh * nt)),
                ids_input("pos", vec![0, 1, 9, 30]),
            ],
            weights: gguf(&[]),
            bound: 1e-4,
        });
    }
    // YaRN (gpt-oss's scaling: factor 32 over a 4096-token original context, so the ramp
    // falls inside the head's pairs), at positions up to those of the other cases (f32
    // angles of far positions differ by their rounding between a running product and a
    // direct power).
    for style in [RopeStyle::NonInterleaved, RopeStyle::Interleaved] {
        let nt = 7usize;
        let mut b = GraphBuilder::new();
        let x = b.input("x", [hd * nh, nt, 1, 1], DType::F32);
        let pos = b.input("pos", [nt, 1, 1, 1], DType::I32);
        let meta = RoPEMeta {
            freq_base: 150_000.0,
            freq_scale: 1.0 / 32.0,
            yarn: Some(crate::meta::Yarn {
                ext_factor: 1.0,
                attn_factor: 1.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                n_ctx_orig: 4096,
            }),
            ..rope_meta(hd, nh, style)
        };
        let y = b.rope(x, pos, style, meta);
        b.output(y);
        out.push(OpCase {
            name: format!("rope {style:?} yarn hd={hd} nh={nh} nt={nt}"),
            op: "rope",
            graph: b.build(),
            inputs: vec![
                f32_input("x", values(33, hd * nh * nt)),
                ids_input("pos", vec![0, 1, 5, 37, 100, 211, 300]),
            ],
            weights: gguf(&[]),
            bound: 1e-4,
        });
    }
    // Llama 3 scaling: per-pair divisors of the angle, from a weight (the last pairs kept
    // at 1, as real files do for the high frequencies).
    let style = RopeStyle::Interleaved;
    let factors: Vec<f32> = (0..hd / 2)
        .map(|i| {
            if i < hd / 4 {
                1.0
            } else {
                1.0 + i as f32 * 0.75
            }
        })
        .collect();
    for nt in TOKENS {
        let mut b = GraphBuilder::new();
        let x = b.input("x", [hd * nh, nt, 1, 1], DType::F32);
        let pos = b.input("pos", [nt, 1, 1, 1], DType::I32);
        let mut meta = rope_meta(hd, nh, style);
        meta.freq_factors = Some("rope_freqs.weight".into());
        let y = b.rope(x, pos, style, meta);
        b.output(y);
        let positions = (0..nt as u32).map(|t| t * 37 + 5).collect();
        out.push(OpCase {
            name: format!("rope {style:?} freq_factors hd={hd} nh={nh} nt={nt}"),
            op: "rope",
            graph: b.build(),
            inputs: vec![
                f32_input("x", values(31, hd * nh * nt)),
                ids_input("pos", positions),
            ],
            weights: gguf(&[(
                "rope_freqs.weight",
                vec![hd as u64 / 2],
                GgmlType::F32,
                factors.clone(),
            )]),
            bound: 1e-4,
        });
    }
}

/// Attention over a KV arena written in the same graph: store K/V at `cells`, then
/// attend, with GQA (several query heads per KV head). With `seqs > 1` the tokens
/// belong to that many sequences, each in its own rows, bounded by explicit spans. With
/// `ring: Some((rows, pos0))` the layer keeps a KV ring of `rows` rows per sequence
/// and each sequence's tokens start at position `pos0`, so their rows wrap around it
/// (the rows before `pos0` read as the arena's zeros, on every backend alike).
fn attn_case(
    nt_per_seq: usize,
    seqs: usize,
    n_head: usize,
    n_head_kv: usize,
    window: Option<usize>,
    softcap: Option<f32>,
    ring: Option<(usize, usize)>,
) -> OpCase {
    let hd = 64usize;
    // Virtual rows per sequence, and the layer's ring.
    let seq_rows = if ring.is_some() { 16 } else { 10 };
    let pos0 = ring.map_or(0, |r| r.1);
    let ring = ring.map(|(rows, _)| crate::KvRing { rows, seq_rows });
    let n_ctx = ring.map_or(32, |r| r.physical_rows(32));
    let nt = nt_per_seq * seqs;
    let explicit = seqs > 1;
    let mut b = GraphBuilder::new();
    let q = b.input("q", [n_head * hd, nt, 1, 1], DType::F32);
    let k = b.input("k", [n_head_kv * hd, nt, 1, 1], DType::F32);
    let v = b.input("v", [n_head_kv * hd, nt, 1, 1], DType::F32);
    let pos = b.input("pos", [nt, 1, 1, 1], DType::I32);
    let span = explicit.then(|| b.input("span", [2, nt, 1, 1], DType::I32));
    let cells = if explicit {
        b.input("cells", [nt, 1, 1, 1], DType::I32)
    } else {
        pos
    };
    b.kvcache_store(0, k, v, cells, n_ctx, ring);
    let kv = b.kvcache_load(0, n_head_kv * hd, n_ctx, n_head_kv, ring);
    let meta = AttnMeta {
        layer: 0,
        n_head,
        n_head_kv,
        hd,
        scale: 1.0 / (hd as f32).sqrt(),
        n_ctx,
        window,
        softcap,
        ring,
        sinks: None,
        causal: true,
    };
    let a = b.attn(q, kv, pos, span, AttnMode::Gqa, meta);
    b.output(a);
    // Sequence s owns virtual rows [s * seq_rows, (s + 1) * seq_rows); token t of it
    // sits at position pos0 + t and attends its own rows 0..=pos0 + t (causal).
    let mut positions = Vec::new();
    let mut cell_rows = Vec::new();
    let mut spans = Vec::new();
    let (sr, p0) = (seq_rows as u32, pos0 as u32);
    for s in 0..seqs as u32 {
        for t in p0..p0 + nt_per_seq as u32 {
            positions.push(t);
            cell_rows.push(s * sr + t);
            spans.extend([s * sr, s * sr + t + 1]);
        }
    }
    // A soft-capped case gets scores past the cap's knee: q scaled so that
    // `scale * q.k` spans several times the cap.
    let q_gain = if softcap.is_some() { 40.0 } else { 1.0 };
    let mut inputs = vec![
        f32_input(
            "q",
            values(51, n_head * hd * nt)
                .into_iter()
                .map(|v| v * q_gain)
                .collect(),
        ),
        f32_input("k", values(52, n_head_kv * hd * nt)),
        f32_input("v", values(53, n_head_kv * hd * nt)),
        ids_input("pos", positions),
    ];
    if explicit {
        inputs.push(ids_input("span", spans));
        inputs.push(ids_input("cells", cell_rows));
    }
    OpCase {
        name: format!(
            "attn gqa {n_head}/{n_head_kv} heads nt={nt_per_seq}x{seqs} seq{}{}{}{}",
            if explicit { " explicit span" } else { "" },
            window.map_or(String::new(), |w| format!(" window {w}")),
            softcap.map_or(String::new(), |c| format!(" softcap {c}")),
            ring.map_or(String::new(), |r| format!(" ring {} from {pos0}", r.rows))
        ),
        op: "attn",
        graph: b.build(),
        inputs,
        weights: gguf(&[]),
        bound: 1e-4,
    }
}

fn kv_cases(out: &mut Vec<OpCase>) {
    for nt in TOKENS {
        out.push(attn_case(nt, 1, 4, 2, None, None, None));
        out.push(attn_case(nt, 1, 2, 2, None, None, None));
    }
    out.push(attn_case(3, 2, 4, 1, None, None, None));
    out.push(attn_case(1, 3, 4, 2, None, None, None));
    // Sliding-window layers: causal over positions, explicit spans of several
    // sequences, and a window of one row (each token reads only its own V).
    out.push(attn_case(7, 1, 4, 2, Some(3), None, None));
    out.push(attn_case(5, 2, 4, 1, Some(2), None, None));
    out.push(attn_case(7, 1, 2, 2, Some(1), None, None));
    // A score soft-cap (Gemma 2 uses 50 on scores of that order; here 5 on these
    // smaller scores, so the cap bends them as much), alone and on a window.
    out.push(attn_case(5, 1, 4, 2, None, Some(5.0), None));
    out.push(attn_case(6, 1, 4, 2, Some(3), Some(5.0), None));
    // A sliding-window layer's KV ring (window 3 plus 5 tokens: 7 rows per sequence),
    // the tokens' rows wrapping around it, alone and in two sequences.
    out.push(attn_case(5, 1, 4, 2, Some(3), None, Some((7, 4))));
    out.push(attn_case(5, 2, 4, 1, Some(3), None, Some((7, 4))));
    // Attention sinks (gpt-oss): per-head logits from a weight, from well below the
    // scores to well above them (that head's weights then sum to far less than one), on
    // causal rows (decode and prefill), several sequences, a window and a ring.
    for c in [
        attn_case(1, 1, 4, 2, None, None, None),
        attn_case(7, 1, 4, 2, None, None, None),
        attn_case(3, 2, 4, 1, None, None, None),
        attn_case(7, 1, 4, 2, Some(3), None, None),
        attn_case(5, 1, 4, 2, Some(3), None, Some((7, 4))),
    ] {
        out.push(with_sinks(c, 4));
    }
    // An encoder's bidirectional attention (BERT): every token reads all of its
    // sequence's rows of the step, over positions and over explicit spans.
    for c in [
        attn_case(7, 1, 4, 2, None, None, None),
        attn_case(20, 1, 2, 2, None, None, None),
        attn_case(3, 2, 4, 1, None, None, None),
    ] {
        out.push(non_causal(c));
    }
    // The store alone, read back through attention: a one-row arena read by one query
    // reproduces that row's V exactly, so a misplaced row shows.
    let mut c = attn_case(1, 1, 2, 2, None, None, None);
    c.name = "kvcache_store then attn over one row".into();
    c.op = "kvcache_store";
    out.push(c);
}

/// `c` with attention sinks of its `n_head` query heads (`-4`, `0.3`, `1.5`, `6`: below,
/// among and above the scores of [`values`]-sized q and k).
fn with_sinks(mut c: OpCase, n_head: usize) -> OpCase {
    let name = "blk.0.attn_sinks.weight";
    for node in &mut c.graph.nodes {
        if let crate::meta::NodeMeta::Attn(m) = &mut node.meta {
            m.sinks = Some(name.into());
        }
    }
    let sinks: Vec<f32> = [-4.0, 0.3, 1.5, 6.0]
        .into_iter()
        .cycle()
        .take(n_head)
        .collect();
    c.weights = gguf(&[(name, vec![n_head as u64], GgmlType::F32, sinks)]);
    c.name.push_str(" sinks");
    c
}

/// `c` with its attention bidirectional (`AttnMeta::causal` off).
fn non_causal(mut c: OpCase) -> OpCase {
    for node in &mut c.graph.nodes {
        if let crate::meta::NodeMeta::Attn(m) = &mut node.meta {
            m.causal = false;
        }
    }
    c.name.push_str(" non-causal");
    c
}

/// The whole table.
pub fn op_cases() -> Vec<OpCase> {
    let mut out = Vec::new();
    matmul_cases(&mut out);
    get_rows_cases(&mut out);
    elementwise_cases(&mut out);
    activation::activation_cases(&mut out);
    norm_cases(&mut out);
    rope_cases(&mut out);
    kv_cases(&mut out);
    moe::moe_cases(&mut out);
    recurrent::recurrent_cases(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::RefBackend;

    #[test]
    fn names_are_unique_and_every_emitted_op_is_covered() {
        let cases = op_cases();
        let mut names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate case names");
        for op in [
            "matmul",
            "get_rows",
            "add",
            "mul",
            "swiglu",
            "geglu",
            "gelu",
            "softcap",
            "scale",
            "rms_norm",
            "layer_norm",
            "qk_norm",
            "rope",
            "attn",
            "kvcache_store",
            "softmax",
            "top_k",
            "mul_mat_id",
            "mul_mat_id_swiglu",
            "moe_sum",
            "mul_sigmoid",
        ] {
            assert!(cases.iter().any(|c| c.op == op), "no case for {op}");
        }
        // gpt-oss's terms: attention sinks, YaRN rope, biased experts with the clamped GLU.
        for (op, word) in [
            ("attn", " sinks"),
            ("attn", " non-causal"),
            ("rope", " yarn "),
            ("mul_mat_id", " bias "),
            ("mul_mat_id_swiglu", " oai bias "),
        ] {
            let hit = cases.iter().any(|c| c.op == op && c.name.contains(word));
            assert!(hit, "no {op} case with{word}");
        }
        for &(ty, _) in MATMUL_TYPES {
            assert!(cases.iter().any(|c| c.name.contains(ty.name())), "{ty:?}");
        }
    }

    #[test]
    fn the_reference_passes_its_own_table_and_a_wrong_kernel_fails_by_name() {
        let cases = op_cases();
        let reference = || -> Vec<Box<dyn BackendImpl>> { vec![Box::new(RefBackend::cpu())] };
        let report = run_cases(&cases, Backend::CPU, &reference, &reference);
        report.check().expect("reference against itself");
        assert!(report.unclaimed.is_empty());
        assert!(report.passed.iter().all(|o| o.error == 0.0));

        // A backend that claims rope but fails it is reported per case, by name.
        let broken = || -> Vec<Box<dyn BackendImpl>> {
            vec![Box::new(RefBackend::cpu().failing_on("rope"))]
        };
        let report = run_cases(&cases, Backend::CPU, &broken, &reference);
        let rope_cases = cases.iter().filter(|c| c.op == "rope").count();
        assert_eq!(report.failures.len(), rope_cases, "{:?}", report.failures);
        assert!(
            report.failures[0].starts_with("rope "),
            "{}",
            report.failures[0]
        );
        assert!(report.check().is_err());

        // A device that does not claim an op is listed as unclaimed, not passed.
        let split = || -> Vec<Box<dyn BackendImpl>> {
            vec![
                Box::new(RefBackend::cpu()),
                Box::new(RefBackend::test_device().claiming(&["add", "input"])),
            ]
        };
        let report = run_cases(&cases, Backend::METAL, &split, &reference);
        report.check().expect("split");
        assert!(report.passed.iter().all(|o| o.name.starts_with("add ")));
        assert!(!report.unclaimed.is_empty());
    }

    fn outcome(name: &str) -> CaseOutcome {
        CaseOutcome {
            name: name.to_string(),
            error: 0.0,
            bound: 1e-5,
        }
    }

    #[test]
    fn a_device_report_passes_only_with_full_coverage_and_names_each_gap() {
        let decoded = [GgmlType::Q8_0, GgmlType::Q4K];
        let good = CaseReport {
            passed: vec![
                outcome("matmul Q8_0 [64x8] nt=1"),
                outcome("matmul Q4_K [256x8] nt=1"),
                outcome("add nt=1"),
            ],
            unclaimed: vec![
                "matmul Q2_K [256x8] nt=1".into(),
                "rope Neox freq_factors hd=64 nh=2 nt=1".into(),
            ],
            failures: vec![],
        };
        check_device_report(&good, 5, "dev", &decoded).expect("full coverage");

        let gap = |edit: &dyn Fn(&mut CaseReport), n: usize| {
            let mut r = good.clone();
            edit(&mut r);
            check_device_report(&r, n, "dev", &decoded).expect_err("a gap")
        };
        let e = gap(&|r| r.unclaimed.push("add nt=3".into()), 6);
        assert_eq!(
            e,
            "'add nt=3' was not run on dev, though the backend implements it"
        );
        // Gemma's terms have device kernels: a device leaving them out has a gap.
        for case in [
            "gelu [67] nt=1",
            "scale [67] nt=1",
            "attn softcap 50 nt=1",
            "mul_sigmoid [67] nt=1",
        ] {
            let e = gap(&|r| r.unclaimed.push(case.into()), 6);
            assert!(e.starts_with(&format!("'{case}' was not run")), "{e}");
        }
        let e = gap(&|r| r.unclaimed.push("matmul Q8_0 [64x8] nt=3".into()), 6);
        assert!(
            e.starts_with("'matmul Q8_0 [64x8] nt=3' was not run"),
            "{e}"
        );
        let e = gap(&|r| r.unclaimed.push("rope Neox hd=64 nh=2 nt=1".into()), 6);
        assert!(
            e.starts_with("'rope Neox hd=64 nh=2 nt=1' was not run"),
            "{e}"
        );
        let e = gap(
            &|r| r.passed.retain(|o| !o.name.starts_with("matmul Q4_K")),
            4,
        );
        assert_eq!(e, "no Q4_K matmul case ran on dev");
        let e = gap(&|r| r.failures.push("add nt=5: error 1e0".into()), 6);
        assert!(
            e.contains("1 of 6 op cases failed") && e.contains("add nt=5"),
            "{e}"
        );
        let e = gap(&|_| {}, 7);
        assert!(e.starts_with("5 of 7 cases accounted for on dev"), "{e}");
    }

    #[test]
    fn the_device_runner_passes_a_device_that_runs_every_case() {
        let device = || -> Vec<Box<dyn BackendImpl>> {
            vec![
                Box::new(RefBackend::cpu()),
                Box::new(RefBackend::test_device()),
            ]
        };
        let types: Vec<GgmlType> = MATMUL_TYPES.iter().map(|&(t, _)| t).collect();
        let report =
            run_device_cases(Backend::METAL, "test", &device, &types).expect("full coverage");
        assert_eq!(report.passed.len(), op_cases().len());
    }
}

//! The scheduler (§3.4): capability-driven assignment, contiguous splits, and
//! split-by-split execution with a two-phase boundary. It never allocates
//! (invariant 4) and never falls back mid-run (invariant 7).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::alloc::GraphAllocator;
use crate::backend::{BackendImpl, SplitSpan};
use crate::error::GraphError;
use crate::ir::*;
use crate::kv_placement::colocate_kv;
use crate::trace::{capture, is_captured, NodeTrace, TraceStaging};

/// Whether `x` claims `node`: `supports_node`, and for attention over explicit spans
/// the span capability.
fn claims(x: &dyn BackendImpl, node: &CNode) -> bool {
    let span = matches!(
        node.op,
        Op::Attn {
            explicit_span: true,
            ..
        }
    );
    x.supports_node(node) && (!span || x.supports_attn_span())
}

/// A maximal run of consecutive live nodes on one backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// Backend executing the run.
    pub backend: Backend,
    /// `[start, end)` in `graph.nodes` (dead nodes inside are skipped).
    pub node_range: (usize, usize),
    /// Values produced on another backend, staged into this one.
    pub inputs: Vec<NodeId>,
    /// Values consumed by another backend.
    pub outputs: Vec<NodeId>,
}

/// Why a node landed on its backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlacementReason {
    /// The node arrived with a backend and kept it.
    Explicit,
    /// The highest-priority backend claiming the op; `declined` ranked higher but refused.
    Capability {
        /// Higher-priority backends that refused the node.
        declined: Vec<Backend>,
    },
    /// No registered backend claimed the node; it falls back to the CPU.
    Fallback {
        /// Every backend that refused it.
        declined: Vec<Backend>,
    },
}

/// One node's assignment and its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The node.
    pub node: NodeId,
    /// Where it runs.
    pub backend: Backend,
    /// Why.
    pub reason: PlacementReason,
    /// Backends ranked above `backend` that claim the op but cannot hold the node's
    /// output or an input (their [`BackendImpl::max_buffer_elems`]), each with the
    /// sizes in words; empty when none.
    pub too_large: Vec<(Backend, String)>,
}

/// Why backend `b` cannot hold `node`'s buffers, or `None` when they fit: the
/// largest of its output and its inputs (`elems` per node id) against the limit.
fn size_refusal(b: &dyn BackendImpl, node: &CNode, elems: &[usize]) -> Option<String> {
    let max = b.max_buffer_elems();
    let (what, n) = std::iter::once(("output", node.n_elements()))
        .chain(
            node.src
                .iter()
                .map(|&s| ("input", elems.get(s).copied().unwrap_or(0))),
        )
        .max_by_key(|&(_, n)| n)?;
    crate::backend::check_buffer_size(b.name(), n, max)
        .err()
        .map(|why| format!("its {what}: {why}"))
}

/// Assigns, splits and executes graphs; remembers the last assignment for traces.
///
/// A reused graph executes without heap allocation: the split list is kept per graph uid
/// and the per-node input list is a reused buffer.
#[derive(Debug, Default)]
pub struct BackendScheduler {
    placements: Vec<Placement>,
    splits: RefCell<Option<(u64, Vec<Split>)>>,
    in_bufs: RefCell<Vec<BufRef>>,
    /// What it reports besides executing.
    options: SchedulerOptions,
    /// Per-op wall time and count while profiling (see [`Self::take_profile`]).
    profile: RefCell<BTreeMap<&'static str, (std::time::Duration, usize)>>,
    /// The per-node capture while a trace is on (see [`Self::set_trace`]); `None` costs
    /// one branch per node and nothing else.
    trace: RefCell<Option<TraceCapture>>,
}

/// The nodes captured since the last [`BackendScheduler::take_trace`], and the staging
/// of each device backend the trace reads through [`BackendImpl::trace_stage`].
#[derive(Debug)]
struct TraceCapture {
    max_values: usize,
    nodes: Vec<NodeTrace>,
    staging: Vec<(Backend, TraceStaging)>,
    /// Whether the current split staged an output (it then ends in `trace_collect`).
    staged: bool,
}

/// What a scheduler reports besides executing, chosen by its owner (the command line maps
/// `MINFER_PROFILE` and `MINFER_GRAPH_TRACE` onto it). The default reports nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerOptions {
    /// Accumulates per-op wall time for [`BackendScheduler::take_profile`].
    pub profile: bool,
    /// Prints a graph's split report to stderr the first time it is split.
    pub graph_trace: bool,
}

fn names(bs: &[Backend]) -> String {
    bs.iter().map(|b| b.name()).collect::<Vec<_>>().join(", ")
}

impl BackendScheduler {
    /// A scheduler with no recorded assignment.
    pub fn new() -> Self {
        Self::default()
    }

    /// A scheduler reporting what `options` asks for.
    pub fn with_options(options: SchedulerOptions) -> Self {
        BackendScheduler {
            options,
            ..Self::default()
        }
    }

    /// Per-op (name, total wall time, executions) accumulated since the last call while
    /// profiling ([`SchedulerOptions::profile`]), slowest first; empty otherwise.
    pub fn take_profile(&self) -> Vec<(&'static str, std::time::Duration, usize)> {
        let mut v: Vec<_> = std::mem::take(&mut *self.profile.borrow_mut())
            .into_iter()
            .map(|(k, (d, n))| (k, d, n))
            .collect();
        v.sort_by_key(|x| std::cmp::Reverse(x.1));
        v
    }

    /// Turns the per-node capture on (`Some(max values sampled per node)`) or off.
    pub fn set_trace(&mut self, max_values: Option<usize>) {
        *self.trace.get_mut() = max_values.map(|max_values| TraceCapture {
            max_values,
            nodes: Vec::new(),
            staging: Vec::new(),
            staged: false,
        });
    }

    /// The nodes captured by the executions since the last call, in execution order;
    /// empty while the capture is off.
    pub fn take_trace(&self) -> Vec<NodeTrace> {
        self.trace
            .borrow_mut()
            .as_mut()
            .map(|t| std::mem::take(&mut t.nodes))
            .unwrap_or_default()
    }

    /// The placements recorded by the last `assign_backends`.
    pub fn placements(&self) -> &[Placement] {
        &self.placements
    }

    /// Gives every unassigned node the highest-priority backend that claims it
    /// (`supports_node`: op, dtype and weight types; and the explicit-span capability
    /// for such attention nodes);
    /// CPU when none does; then keeps each layer's KV nodes on one backend
    /// ([`crate::kv_placement`]). Deterministic: priority order comes from the registry.
    pub fn assign_backends(&mut self, graph: &mut ComputeGraph, alloc: &GraphAllocator) {
        let order = alloc.priority_order();
        self.placements.clear();
        let elems: Vec<usize> = graph.nodes.iter().map(CNode::n_elements).collect();
        for node in &mut graph.nodes {
            let mut too_large = Vec::new();
            let (backend, reason) = match node.backend {
                Some(b) => (b, PlacementReason::Explicit),
                None => {
                    let mut declined = Vec::new();
                    let mut chosen = None;
                    for &b in &order {
                        let ok = alloc.backend(b).is_some_and(|x| {
                            let claims = claims(x, node);
                            // A node whose buffers exceed the device's limits is
                            // declined here, at placement, not failed at read-back.
                            let refusal = claims.then(|| size_refusal(x, node, &elems)).flatten();
                            if let Some(why) = &refusal {
                                too_large.push((b, why.clone()));
                            }
                            claims && refusal.is_none()
                        });
                        if ok {
                            chosen = Some(b);
                            break;
                        }
                        declined.push(b);
                    }
                    match chosen {
                        Some(b) => (b, PlacementReason::Capability { declined }),
                        None => (Backend::CPU, PlacementReason::Fallback { declined }),
                    }
                }
            };
            node.backend = Some(backend);
            self.placements.push(Placement {
                node: node.id,
                backend,
                reason,
                too_large,
            });
        }
        // A layer's KV nodes run where its regions live: one backend per layer.
        let placements = &self.placements;
        let fixed = |i: NodeId| placements[i].reason == PlacementReason::Explicit;
        let nodes = &graph.nodes;
        let takes = |b: Backend, i: NodeId| {
            alloc.backend(b).is_some_and(|x| {
                claims(x, &nodes[i]) && size_refusal(x, &nodes[i], &elems).is_none()
            })
        };
        for mv in colocate_kv(graph, &order, &fixed, &takes) {
            for &i in &mv.nodes {
                graph.nodes[i].backend = Some(mv.backend);
                self.placements[i] = Placement {
                    node: i,
                    backend: mv.backend,
                    reason: PlacementReason::Capability {
                        declined: mv.declined.clone(),
                    },
                    too_large: Vec::new(),
                };
            }
        }
    }

    /// Cuts the live nodes into contiguous per-backend runs and derives the
    /// cross-backend edges. KV views are not staged: kernels reach KV via `kv_pair`.
    pub fn split_graph(&self, graph: &ComputeGraph) -> Vec<Split> {
        let mut splits: Vec<Split> = Vec::new();
        let mut split_of = vec![usize::MAX; graph.nodes.len()];
        for node in graph.nodes.iter().filter(|n| !graph.is_dead(n.id)) {
            let b = node.backend.unwrap_or(Backend::CPU);
            match splits.last_mut() {
                Some(s) if s.backend == b => s.node_range.1 = node.id + 1,
                _ => splits.push(Split {
                    backend: b,
                    node_range: (node.id, node.id + 1),
                    inputs: Vec::new(),
                    outputs: Vec::new(),
                }),
            }
            split_of[node.id] = splits.len() - 1;
        }
        for node in graph.nodes.iter().filter(|n| !graph.is_dead(n.id)) {
            let s = split_of[node.id];
            for &x in &node.src {
                let p = split_of.get(x).copied().unwrap_or(usize::MAX);
                if p == usize::MAX
                    || matches!(graph.nodes[x].op, Op::KvcacheLoad { .. })
                    || splits[p].backend == splits[s].backend
                {
                    continue;
                }
                if !splits[s].inputs.contains(&x) {
                    splits[s].inputs.push(x);
                }
                if !splits[p].outputs.contains(&x) {
                    splits[p].outputs.push(x);
                }
            }
        }
        splits
    }

    /// Runs `graph` split by split in build order. At each boundary the staging
    /// copies are enqueued first and each is awaited at its first read. A split opens
    /// with its backend's `begin_split` and closes with `end_split` (or, traced through
    /// staging, `trace_collect`); a node's error gets the node's context here, once.
    /// Any node whose buffer or KV region is on another backend than its split is an
    /// error.
    pub fn execute(
        &self,
        graph: &ComputeGraph,
        alloc: &mut GraphAllocator,
    ) -> Result<(), GraphError> {
        // Graphs installed by a cache have a unique non-zero uid; others are split afresh.
        let mut cached = self.splits.borrow_mut();
        if graph.uid == 0 || cached.as_ref().is_none_or(|(uid, _)| *uid != graph.uid) {
            let splits = self.split_graph(graph);
            if self.options.graph_trace {
                eprintln!("{}", self.trace_report(graph, &splits));
            }
            *cached = Some((graph.uid, splits));
        }
        let splits = match cached.as_ref() {
            Some((_, s)) => s,
            None => return Ok(()),
        };
        let mut in_bufs = self.in_bufs.borrow_mut();
        let mut trace = self.trace.borrow_mut();
        if let Some(t) = trace.as_mut().filter(|t| t.staged) {
            // The last execution failed inside a staged split: what it staged is not
            // this graph's, so the staging starts afresh.
            t.staging.clear();
            t.staged = false;
        }
        alloc.begin_pass();
        for (index, split) in splits.iter().enumerate() {
            let bk = split.backend;
            for &x in &split.inputs {
                alloc.enqueue_cross(x, bk)?;
            }
            let span = SplitSpan {
                graph: graph.uid,
                index,
                nodes: split.node_range,
            };
            split_call(alloc, bk, span, |b| b.begin_split(span))?;
            for node in &graph.nodes[split.node_range.0..split.node_range.1] {
                if graph.is_dead(node.id) {
                    continue;
                }
                let mismatch =
                    |what, other: Backend, alloc: &GraphAllocator| GraphError::SplitMismatch {
                        id: node.id,
                        name: node.name.clone(),
                        what,
                        buffer_backend: alloc.backend_name(other),
                        split_backend: alloc.backend_name(bk),
                    };
                let out = alloc
                    .node_buffer(node.id)
                    .ok_or_else(|| GraphError::NoBuffer {
                        id: node.id,
                        name: node.name.clone(),
                    })?;
                if out.backend != bk {
                    return Err(mismatch("buffer", out.backend, alloc));
                }
                if matches!(node.op, Op::Input | Op::KvcacheLoad { .. }) {
                    if let Some(t) = trace.as_mut() {
                        t.record(graph, node, out, alloc)?;
                    }
                    continue; // host-filled leaf or KV view: nothing to execute
                }
                in_bufs.clear();
                for &s in &node.src {
                    let buf = if split.inputs.contains(&s) {
                        alloc.await_cross(s, bk)?;
                        alloc.cross_input(s, bk)?
                    } else {
                        alloc.node_buffer(s)
                    };
                    let buf = buf.ok_or_else(|| GraphError::NoBuffer {
                        id: s,
                        name: graph.nodes[s].name.clone(),
                    })?;
                    let is_view = matches!(graph.nodes[s].op, Op::KvcacheLoad { .. });
                    if buf.backend != bk && !is_view {
                        return Err(mismatch("input buffer", buf.backend, alloc));
                    }
                    in_bufs.push(buf);
                }
                let kv = match node.kv_layer() {
                    None => None,
                    Some(layer) => {
                        let r = alloc.kv_region(layer).ok_or_else(|| GraphError::Kv {
                            layer,
                            problem: format!("node {} '{}' needs a region", node.id, node.name),
                        })?;
                        if r.backend != bk {
                            return Err(mismatch("KV region", r.backend, alloc));
                        }
                        Some((r.k, r.v))
                    }
                };
                let b = alloc
                    .backend_mut(bk)
                    .ok_or(GraphError::BackendMissing(bk))?;
                let t0 = self.options.profile.then(std::time::Instant::now);
                b.execute_node(node, &in_bufs[..], out, kv)
                    .map_err(|message| GraphError::Backend {
                        backend: b.name().to_string(),
                        context: format!("node {} '{}' ({})", node.id, node.name, node.op.name()),
                        message: Box::new(message),
                    })?;
                if let Some(t0) = t0 {
                    let mut p = self.profile.borrow_mut();
                    let e = p.entry(node.op.name()).or_default();
                    e.0 += t0.elapsed();
                    e.1 += 1;
                }
                // Right after the node: a later node of the split may reuse its buffer.
                if let Some(t) = trace.as_mut() {
                    t.record(graph, node, out, alloc)?;
                }
            }
            match trace.as_mut() {
                Some(t) if t.staged => t.collect(graph, bk, alloc)?,
                _ => split_call(alloc, bk, span, |b| b.end_split())?,
            }
        }
        alloc.drain_cross()
    }
}

/// `call` on the backend of split `span`, its error naming the split.
fn split_call(
    alloc: &mut GraphAllocator,
    bk: Backend,
    span: SplitSpan,
    call: impl FnOnce(&mut dyn BackendImpl) -> Result<(), crate::BackendError>,
) -> Result<(), GraphError> {
    let b = alloc
        .backend_mut(bk)
        .ok_or(GraphError::BackendMissing(bk))?;
    call(b).map_err(|message| GraphError::Backend {
        backend: b.name().to_string(),
        context: format!(
            "split {} (nodes {}..{})",
            span.index, span.nodes.0, span.nodes.1
        ),
        message: Box::new(message),
    })
}

impl TraceCapture {
    /// Captures `node`'s output buffer `out`, skipping KV views and stores: read in
    /// place where the backend shows its buffers to the host, else staged by the
    /// backend (collected at the end of the split, so one wait per split, not per node).
    fn record(
        &mut self,
        graph: &ComputeGraph,
        node: &CNode,
        out: BufRef,
        alloc: &mut GraphAllocator,
    ) -> Result<(), GraphError> {
        if !is_captured(node) {
            return Ok(());
        }
        let b = alloc
            .backend(out.backend)
            .ok_or(GraphError::BackendMissing(out.backend))?;
        if let Some(data) = b.trace_view(out.id) {
            self.nodes.push(capture(node, data, self.max_values));
            return Ok(());
        }
        let b = alloc
            .backend_mut(out.backend)
            .ok_or(GraphError::BackendMissing(out.backend))?;
        let Self {
            max_values,
            nodes,
            staging,
            staged,
        } = self;
        let st = staging_of(staging, out.backend);
        let mut read = reader(graph, nodes, *max_values);
        b.trace_stage(st, node.id, out.id, node.n_elements(), &mut read)
            .map_err(|message| GraphError::Backend {
                backend: b.name().to_string(),
                context: format!("tracing node {} '{}' (MINFER_TRACE)", node.id, node.name),
                message: Box::new(message),
            })?;
        *staged = true;
        Ok(())
    }

    /// Ends a split on `bk` that staged outputs: the backend's one wait, then the
    /// staged outputs captured in execution order.
    fn collect(
        &mut self,
        graph: &ComputeGraph,
        bk: Backend,
        alloc: &mut GraphAllocator,
    ) -> Result<(), GraphError> {
        let b = alloc
            .backend_mut(bk)
            .ok_or(GraphError::BackendMissing(bk))?;
        let Self {
            max_values,
            nodes,
            staging,
            staged,
        } = self;
        *staged = false;
        let st = staging_of(staging, bk);
        let mut read = reader(graph, nodes, *max_values);
        b.trace_collect(st, &mut read)
            .map_err(|message| GraphError::Backend {
                backend: b.name().to_string(),
                context: "collecting the split's traced outputs (MINFER_TRACE)".into(),
                message: Box::new(message),
            })
    }
}

/// The staging of backend `b`, created on its first staged output.
fn staging_of(staging: &mut Vec<(Backend, TraceStaging)>, b: Backend) -> &mut TraceStaging {
    let i = match staging.iter().position(|(x, _)| *x == b) {
        Some(i) => i,
        None => {
            staging.push((b, TraceStaging::default()));
            staging.len() - 1
        }
    };
    &mut staging[i].1
}

/// The callback a backend hands staged outputs to: each becomes its node's capture.
/// An id outside the graph (which no backend stages) is ignored.
fn reader<'a>(
    graph: &'a ComputeGraph,
    nodes: &'a mut Vec<NodeTrace>,
    max_values: usize,
) -> impl FnMut(NodeId, &[f32]) + 'a {
    move |id, data| {
        if let Some(node) = graph.nodes.get(id) {
            nodes.push(capture(node, data, max_values));
        }
    }
}

impl BackendScheduler {
    /// The `MINFER_GRAPH_TRACE=1` text: splits, per-op and per-backend counts, and
    /// why each node landed where it did.
    pub fn trace_report(&self, graph: &ComputeGraph, splits: &[Split]) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "graph uid {}: {} nodes ({} live), {} splits",
            graph.uid,
            graph.nodes.len(),
            graph.live_count(),
            splits.len()
        );
        for (i, sp) in splits.iter().enumerate() {
            let _ = writeln!(
                s,
                "  split {i}: {} nodes [{}, {}) inputs {:?} outputs {:?}",
                sp.backend, sp.node_range.0, sp.node_range.1, sp.inputs, sp.outputs
            );
        }
        let mut per_op: BTreeMap<&str, usize> = BTreeMap::new();
        let mut per_backend: BTreeMap<Backend, usize> = BTreeMap::new();
        for n in graph.nodes.iter().filter(|n| !graph.is_dead(n.id)) {
            *per_op.entry(n.op.name()).or_default() += 1;
            *per_backend
                .entry(n.backend.unwrap_or(Backend::CPU))
                .or_default() += 1;
        }
        let ops: Vec<String> = per_op.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(s, "  per-op: {}", ops.join(" "));
        let bks: Vec<String> = per_backend
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(s, "  per-backend: {}", bks.join(" "));
        let _ = writeln!(s, "  placement:");
        for p in &self.placements {
            let Some(n) = graph.nodes.get(p.node) else {
                continue;
            };
            let why = match &p.reason {
                PlacementReason::Explicit => "explicit".to_string(),
                PlacementReason::Capability { declined } if declined.is_empty() => {
                    "capability (highest priority)".to_string()
                }
                PlacementReason::Capability { declined } => {
                    format!("capability (declined by {})", names(declined))
                }
                PlacementReason::Fallback { declined } => {
                    format!("fallback to cpu (declined by {})", names(declined))
                }
            };
            let mut why = why;
            for (b, size) in &p.too_large {
                let _ = write!(why, "; {b} cannot hold {size}");
            }
            let dead = if graph.is_dead(p.node) { " [dead]" } else { "" };
            let _ = writeln!(
                s,
                "    #{} {} ({}) -> {}: {why}{dead}",
                n.id,
                n.name,
                n.op.name(),
                p.backend
            );
        }
        s
    }
}

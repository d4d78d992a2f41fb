//! Per-node data capture (§8.3) and the `minfer-trace` file (§8.2).
//!
//! While a trace is on, the scheduler hands each executed node's output to
//! [`capture`] right after the node runs (a pool buffer is reused by later nodes, so
//! the read cannot wait for the end of the graph). A capture keeps statistics over the
//! whole tensor and a strided sample of at most `max_values` values, so the memory one
//! step costs is bounded by the node count, not by the tensor sizes. KV views and KV
//! stores are not captured: a region per layer would dominate the trace, and the page
//! shows them as "no data".
//!
//! The file is `{format:"minfer-trace", version:1, model, prompt, phases:[{kind, graph,
//! steps:[{token, text, logits_top, nodes:[{id, dtype, stats, values, stride, n}]}]}]}`,
//! where `graph` is the `minfer-graph` export of the graph the phase ran, so node ids
//! match. [`check_trace`] validates a document against that schema.

use serde_json::{json, Map, Value};

use crate::ir::{CNode, DType, NodeId, Op};

/// The `format` field of a trace file.
pub const TRACE_FORMAT: &str = "minfer-trace";
/// The schema version this code writes and reads.
pub const TRACE_VERSION: u64 = 1;
/// Values sampled per node when the caller does not choose.
pub const DEFAULT_MAX_VALUES: usize = 256;

/// Statistics over every element of one node's output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceStats {
    /// Smallest finite value (0 when there is none).
    pub min: f32,
    /// Largest finite value (0 when there is none).
    pub max: f32,
    /// Mean of the finite values.
    pub mean: f64,
    /// Root mean square of the finite values.
    pub rms: f64,
    /// Count of NaN values.
    pub nan: usize,
    /// Count of infinite values.
    pub inf: usize,
}

/// One node's captured output in one step.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeTrace {
    /// The node.
    pub id: NodeId,
    /// Its output element type.
    pub dtype: DType,
    /// Statistics over the whole output.
    pub stats: TraceStats,
    /// Every `stride`-th value from the first, at most the capture's bound.
    pub values: Vec<f32>,
    /// Distance between sampled elements.
    pub stride: usize,
    /// Elements in the whole output.
    pub n: usize,
}

/// A device backend's staging for the per-node trace, owned by the scheduler's trace
/// state for as long as the trace is on (dropped with it, so tracing off holds none).
///
/// The backend alone knows what it keeps here (its staging buffers and the outputs
/// staged in them since the last collection, see [`crate::BackendImpl::trace_stage`]).
#[derive(Default)]
pub struct TraceStaging {
    state: Option<Box<dyn std::any::Any + Send>>,
}

impl std::fmt::Debug for TraceStaging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceStaging")
            .field("used", &self.state.is_some())
            .finish()
    }
}

impl TraceStaging {
    /// The backend's state of type `T`, created empty on first use (a slot holding
    /// another type, which one backend never stores, is replaced).
    pub fn state_mut<T: std::any::Any + Send + Default>(&mut self) -> &mut T {
        if !self.state.as_ref().is_some_and(|s| s.is::<T>()) {
            self.state = Some(Box::new(T::default()));
        }
        match self.state.as_mut().and_then(|s| s.downcast_mut::<T>()) {
            Some(t) => t,
            None => unreachable!("the slot was just filled with a T"),
        }
    }
}

/// Whether `node`'s output is captured: executed nodes only, and no KV region.
pub fn is_captured(node: &CNode) -> bool {
    !matches!(node.op, Op::KvcacheLoad { .. } | Op::KvcacheStore { .. })
}

/// Statistics and a strided sample of `node`'s output `data` (the node's buffer; only
/// its first `node.n_elements()` values are the output). I32 outputs are bit patterns in
/// f32 storage and are read as integers.
pub fn capture(node: &CNode, data: &[f32], max_values: usize) -> NodeTrace {
    let n = node.n_elements().min(data.len());
    let data = &data[..n];
    let int = node.out_dtype == DType::I32;
    let value = |x: f32| {
        if int {
            x.to_bits() as i32 as f32
        } else {
            x
        }
    };
    let (mut min, mut max) = (f32::INFINITY, f32::NEG_INFINITY);
    let (mut sum, mut sq, mut finite) = (0f64, 0f64, 0usize);
    let (mut nan, mut inf) = (0usize, 0usize);
    for &raw in data {
        let x = value(raw);
        if x.is_nan() {
            nan += 1;
        } else if x.is_infinite() {
            inf += 1;
        } else {
            min = min.min(x);
            max = max.max(x);
            sum += f64::from(x);
            sq += f64::from(x) * f64::from(x);
            finite += 1;
        }
    }
    let (mean, rms) = if finite > 0 {
        (sum / finite as f64, (sq / finite as f64).sqrt())
    } else {
        (min, max) = (0.0, 0.0);
        (0.0, 0.0)
    };
    let max_values = max_values.max(1);
    let stride = n.div_ceil(max_values).max(1);
    let values = data.iter().step_by(stride).map(|&x| value(x)).collect();
    NodeTrace {
        id: node.id,
        dtype: node.out_dtype,
        stats: TraceStats {
            min,
            max,
            mean,
            rms,
            nan,
            inf,
        },
        values,
        stride,
        n,
    }
}

/// A float as JSON: non-finite values (which JSON cannot hold) become `null`.
fn num(x: f64) -> Value {
    serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
}

/// An `f32` as JSON with the shortest decimal that reads back as the same `f32` (its
/// widening to `f64` would print up to 17 digits, most of them noise).
fn num32(x: f32) -> Value {
    num(x.to_string().parse::<f64>().unwrap_or(f64::NAN))
}

impl NodeTrace {
    /// The node's entry of a trace step: `{id, dtype, stats, values, stride, n}`.
    pub fn to_json(&self) -> Value {
        let s = &self.stats;
        json!({
            "id": self.id,
            "dtype": self.dtype.name(),
            "stats": {
                "min": num32(s.min),
                "max": num32(s.max),
                "mean": num(s.mean),
                "rms": num(s.rms),
                "nan": s.nan,
                "inf": s.inf,
            },
            "values": self.values.iter().map(|&v| num32(v)).collect::<Vec<_>>(),
            "stride": self.stride,
            "n": self.n,
        })
    }
}

/// A step's `logits_top` entries, `[{id, logit}]`, highest first: the `k` largest of
/// `logits` (one row of the vocabulary).
pub fn logits_top(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() || (top.len() == k && top.last().is_some_and(|&(_, m)| l <= m)) {
            continue;
        }
        let at = top.partition_point(|&(_, m)| m >= l);
        top.insert(at, (i as u32, l));
        top.truncate(k);
    }
    top
}

/// Checks that `doc` is a `minfer-trace` document of this version: every field of the
/// schema present with its type, each phase's graph a `minfer-graph` export, and each
/// node entry naming a node of that graph with as many values as its stride implies.
/// `Err` names the first problem and where it is.
pub fn check_trace(doc: &Value) -> Result<(), String> {
    let top = obj(doc, "the document")?;
    if top.get("format").and_then(Value::as_str) != Some(TRACE_FORMAT) {
        return Err(format!("not a {TRACE_FORMAT} file (field 'format')"));
    }
    if top.get("version").and_then(Value::as_u64) != Some(TRACE_VERSION) {
        return Err(format!(
            "unsupported trace version {} (this build reads {TRACE_VERSION})",
            top.get("version").unwrap_or(&Value::Null)
        ));
    }
    str_field(top, "model", "the document")?;
    str_field(top, "prompt", "the document")?;
    let phases = arr_field(top, "phases", "the document")?;
    for (p, phase) in phases.iter().enumerate() {
        let at = format!("phase {p}");
        let ph = obj(phase, &at)?;
        let kind = str_field(ph, "kind", &at)?;
        if kind != "prefill" && kind != "decode" {
            return Err(format!("{at}: kind '{kind}' is neither prefill nor decode"));
        }
        let graph = obj(
            ph.get("graph").unwrap_or(&Value::Null),
            &format!("{at} graph"),
        )?;
        if graph.get("format").and_then(Value::as_str) != Some("minfer-graph") {
            return Err(format!("{at}: graph is not a minfer-graph export"));
        }
        let n_nodes = arr_field(graph, "nodes", &format!("{at} graph"))?.len();
        for (s, step) in arr_field(ph, "steps", &at)?.iter().enumerate() {
            let at = format!("phase {p} step {s}");
            let st = obj(step, &at)?;
            match st.get("token") {
                Some(Value::Null) => {}
                Some(t) if t.as_u64().is_some() => {}
                _ => return Err(format!("{at}: 'token' is neither a token id nor null")),
            }
            str_field(st, "text", &at)?;
            for (i, e) in arr_field(st, "logits_top", &at)?.iter().enumerate() {
                let e = obj(e, &format!("{at} logits_top {i}"))?;
                if e.get("id").and_then(Value::as_u64).is_none() || !e.contains_key("logit") {
                    return Err(format!("{at}: logits_top {i} lacks id or logit"));
                }
            }
            for (i, node) in arr_field(st, "nodes", &at)?.iter().enumerate() {
                check_node(node, n_nodes).map_err(|e| format!("{at} node entry {i}: {e}"))?;
            }
        }
    }
    Ok(())
}

fn check_node(node: &Value, n_nodes: usize) -> Result<(), String> {
    let o = obj(node, "entry")?;
    let id = uint(o, "id")?;
    if id >= n_nodes {
        return Err(format!(
            "id {id} is not a node of the phase's graph ({n_nodes} nodes)"
        ));
    }
    str_field(o, "dtype", "entry")?;
    let stats = obj(o.get("stats").unwrap_or(&Value::Null), "stats")?;
    for k in ["min", "max", "mean", "rms"] {
        match stats.get(k) {
            Some(v) if v.is_number() || v.is_null() => {}
            _ => return Err(format!("stats.{k} is missing or not a number")),
        }
    }
    uint(stats, "nan")?;
    uint(stats, "inf")?;
    let (stride, n) = (uint(o, "stride")?, uint(o, "n")?);
    let values = arr_field(o, "values", "entry")?;
    if stride == 0 || values.len() != n.div_ceil(stride) {
        return Err(format!(
            "{} values do not sample {n} elements at stride {stride}",
            values.len()
        ));
    }
    Ok(())
}

fn obj<'a>(v: &'a Value, what: &str) -> Result<&'a Map<String, Value>, String> {
    v.as_object()
        .ok_or_else(|| format!("{what} is not a JSON object"))
}

fn str_field<'a>(o: &'a Map<String, Value>, k: &str, what: &str) -> Result<&'a str, String> {
    o.get(k)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{what}: field '{k}' is missing or not a string"))
}

fn arr_field<'a>(o: &'a Map<String, Value>, k: &str, what: &str) -> Result<&'a Vec<Value>, String> {
    o.get(k)
        .and_then(Value::as_array)
        .ok_or_else(|| format!("{what}: field '{k}' is missing or not an array"))
}

fn uint(o: &Map<String, Value>, k: &str) -> Result<usize, String> {
    o.get(k)
        .and_then(Value::as_u64)
        .and_then(|x| usize::try_from(x).ok())
        .ok_or_else(|| format!("field '{k}' is missing or not a non-negative integer"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::NodeMeta;

    fn node(n: usize, dtype: DType) -> CNode {
        CNode {
            id: 3,
            name: "x".into(),
            op: Op::Add,
            src: vec![],
            out_shape: [n, 1, 1, 1],
            out_dtype: dtype,
            backend: None,
            meta: NodeMeta::None,
        }
    }

    #[test]
    fn stats_cover_the_whole_tensor_and_the_sample_is_bounded() {
        let data: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        // The buffer is longer than the node's output: the tail is not the node's.
        let mut buf = data.clone();
        buf.extend([1e9; 24]);
        let t = capture(&node(1000, DType::F32), &buf, 64);
        assert_eq!((t.n, t.stride, t.values.len()), (1000, 16, 63));
        assert_eq!((t.stats.min, t.stats.max), (0.0, 999.0));
        assert!((t.stats.mean - 499.5).abs() < 1e-9);
        let rms = (data.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>() / 1000.0).sqrt();
        assert!((t.stats.rms - rms).abs() < 1e-6);
        assert_eq!(t.values[1], 16.0);
    }

    #[test]
    fn nan_and_inf_are_counted_not_averaged() {
        let data = [1.0, f32::NAN, f32::INFINITY, -3.0, f32::NEG_INFINITY];
        let t = capture(&node(5, DType::F32), &data, 8);
        assert_eq!((t.stats.nan, t.stats.inf), (1, 2));
        assert_eq!((t.stats.min, t.stats.max, t.stats.mean), (-3.0, 1.0, -1.0));
        let j = t.to_json();
        assert!(j["values"][1].is_null(), "NaN is written as null: {j}");
        let all_nan = capture(&node(2, DType::F32), &[f32::NAN; 2], 8);
        assert_eq!(all_nan.to_json()["stats"]["min"], 0.0);
    }

    #[test]
    fn integer_outputs_are_read_as_integers() {
        let data: Vec<f32> = [7i32, -2, 40]
            .iter()
            .map(|&i| f32::from_bits(i as u32))
            .collect();
        let t = capture(&node(3, DType::I32), &data, 8);
        assert_eq!(t.values, vec![7.0, -2.0, 40.0]);
        assert_eq!((t.stats.min, t.stats.max), (-2.0, 40.0));
    }

    #[test]
    fn logits_top_is_sorted_and_skips_nan() {
        let l = [0.5, 3.0, f32::NAN, -1.0, 3.5, 2.0];
        assert_eq!(logits_top(&l, 3), vec![(4, 3.5), (1, 3.0), (5, 2.0)]);
        assert_eq!(logits_top(&l[..2], 5), vec![(1, 3.0), (0, 0.5)]);
    }

    fn doc() -> Value {
        let t = capture(&node(10, DType::F32), &[1.0; 10], 4);
        json!({
            "format": "minfer-trace", "version": 1, "model": "m", "prompt": "p",
            "phases": [{"kind": "decode",
                "graph": {"format": "minfer-graph", "nodes": [0, 1, 2, 3]},
                "steps": [{"token": 5, "text": "a", "logits_top": [{"id": 5, "logit": 1.0}],
                           "nodes": [t.to_json()]}]}]
        })
    }

    #[test]
    fn check_trace_accepts_the_schema_and_names_each_problem() {
        check_trace(&doc()).unwrap();
        type Break = fn(&mut Value);
        let cases: [(&str, Break); 5] = [
            ("not a minfer-trace file", |d| d["format"] = json!("x")),
            ("unsupported trace version 2", |d| d["version"] = json!(2)),
            ("kind 'warp'", |d| d["phases"][0]["kind"] = json!("warp")),
            ("id 9 is not a node", |d| {
                d["phases"][0]["steps"][0]["nodes"][0]["id"] = json!(9)
            }),
            ("do not sample 10 elements", |d| {
                d["phases"][0]["steps"][0]["nodes"][0]["stride"] = json!(1)
            }),
        ];
        for (want, break_it) in cases {
            let mut d = doc();
            break_it(&mut d);
            let e = check_trace(&d).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
        assert!(check_trace(&json!([1]))
            .unwrap_err()
            .contains("not a JSON object"));
    }
}

//! JSON export for the visualizer (§8.2) and its inverse.
//!
//! Schema: `{format:"minfer-graph", version:1, model, kind, inputs, outputs,
//! nodes:[{id,name,op,detail,args,shape,dtype,backend,src,meta,dead}]}`. `detail` is
//! a human-readable payload summary; `args` carries the exact op payload so the
//! document parses back into the same graph (`import_json`).

use serde_json::{json, Map, Value};

use crate::error::GraphError;
use crate::ir::*;

/// Human-readable payload of `op` ("" for payload-free ops).
pub fn op_detail(op: &Op) -> String {
    match op {
        Op::Scale(s) => format!("s={s}"),
        Op::SoftCap(c) => format!("c={c}"),
        Op::Softmax { dim } => format!("dim={dim}"),
        Op::RmsNorm { eps } | Op::LayerNorm { eps } => format!("eps={eps}"),
        Op::QkNorm { hd, nh, eps } => format!("hd={hd} nh={nh} eps={eps}"),
        Op::MatMul { transpose_b } => format!("transpose_b={transpose_b}"),
        Op::RoPE {
            style,
            freq_factors,
        } => format!("style={style:?} freq_factors={freq_factors}"),
        Op::Attn {
            mode,
            explicit_span,
        } => format!("mode={mode:?} explicit_span={explicit_span}"),
        Op::KvcacheStore { layer }
        | Op::KvcacheLoad { layer }
        | Op::FusedQKV { layer }
        | Op::QkvBiasRopeStore { layer }
        | Op::FusedQkvNorm { layer } => format!("layer={layer}"),
        Op::View { offset, shape } => format!("offset={offset} shape={shape:?}"),
        Op::Reshape { shape } => format!("shape={shape:?}"),
        Op::Permute { dims } => format!("dims={dims:?}"),
        Op::TopK { k } => format!("k={k}"),
        Op::Slice { period, start, len } => format!("period={period} start={start} len={len}"),
        Op::SsmConv { layer } | Op::DeltaNet { layer } => format!("layer={layer}"),
        Op::MoeSum { norm } => format!("norm={norm}"),
        _ => String::new(),
    }
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// The exact payload of `op` as a JSON object.
pub fn op_args(op: &Op) -> Value {
    match op {
        Op::Scale(s) => json!({ "s": s }),
        Op::SoftCap(c) => json!({ "c": c }),
        Op::Softmax { dim } => json!({ "dim": dim }),
        Op::RmsNorm { eps } | Op::LayerNorm { eps } => json!({ "eps": eps }),
        Op::QkNorm { hd, nh, eps } => json!({ "hd": hd, "nh": nh, "eps": eps }),
        Op::MatMul { transpose_b } => json!({ "transpose_b": transpose_b }),
        Op::RoPE {
            style,
            freq_factors,
        } => json!({ "style": to_value(style), "freq_factors": freq_factors }),
        Op::Attn {
            mode,
            explicit_span,
        } => json!({ "mode": to_value(mode), "explicit_span": explicit_span }),
        Op::KvcacheStore { layer }
        | Op::KvcacheLoad { layer }
        | Op::FusedQKV { layer }
        | Op::QkvBiasRopeStore { layer }
        | Op::FusedQkvNorm { layer } => json!({ "layer": layer }),
        Op::View { offset, shape } => json!({ "offset": offset, "shape": shape }),
        Op::Reshape { shape } => json!({ "shape": shape }),
        Op::Permute { dims } => json!({ "dims": dims }),
        Op::TopK { k } => json!({ "k": k }),
        Op::Slice { period, start, len } => {
            json!({ "period": period, "start": start, "len": len })
        }
        Op::SsmConv { layer } | Op::DeltaNet { layer } => json!({ "layer": layer }),
        Op::MoeSum { norm } => json!({ "norm": norm }),
        _ => json!({}),
    }
}

/// `meta` as a JSON object tagged by `kind` (`null` for `NodeMeta::None`).
pub fn meta_json(meta: &NodeMeta) -> Value {
    match meta {
        NodeMeta::None => Value::Null,
        m => to_value(m),
    }
}

/// The whole graph as a JSON document.
pub fn export_graph_json(graph: &ComputeGraph, model: &str, kind: &str) -> Value {
    let nodes: Vec<Value> = graph
        .nodes
        .iter()
        .map(|n| {
            json!({
                "id": n.id,
                "name": n.name,
                "op": n.op.name(),
                "detail": op_detail(&n.op),
                "args": op_args(&n.op),
                "shape": n.out_shape,
                "dtype": n.out_dtype.name(),
                "backend": n.backend.map(|b| b.name()),
                "src": n.src,
                "meta": meta_json(&n.meta),
                "dead": graph.is_dead(n.id),
            })
        })
        .collect();
    json!({
        "format": "minfer-graph",
        "version": 1,
        "model": model,
        "kind": kind,
        "inputs": graph.inputs,
        "outputs": graph.outputs,
        "nodes": nodes,
    })
}

impl ComputeGraph {
    /// `export_graph_json` rendered as a pretty string.
    pub fn export_json(&self, model: &str, kind: &str) -> String {
        serde_json::to_string_pretty(&export_graph_json(self, model, kind)).unwrap_or_default()
    }
}

fn bad(what: impl Into<String>) -> GraphError {
    GraphError::Import(what.into())
}

fn field<'a>(o: &'a Map<String, Value>, k: &str) -> Result<&'a Value, GraphError> {
    o.get(k).ok_or_else(|| bad(format!("missing field '{k}'")))
}

fn usize_of(v: &Value, k: &str) -> Result<usize, GraphError> {
    v.as_u64()
        .and_then(|x| usize::try_from(x).ok())
        .ok_or_else(|| bad(format!("'{k}' is not an unsigned integer")))
}

fn arg_usize(a: &Map<String, Value>, k: &str) -> Result<usize, GraphError> {
    usize_of(field(a, k)?, k)
}

fn arg_f32(a: &Map<String, Value>, k: &str) -> Result<f32, GraphError> {
    field(a, k)?
        .as_f64()
        .map(|x| x as f32)
        .ok_or_else(|| bad(format!("'{k}' is not a number")))
}

fn arg_bool(a: &Map<String, Value>, k: &str) -> Result<bool, GraphError> {
    field(a, k)?
        .as_bool()
        .ok_or_else(|| bad(format!("'{k}' is not a boolean")))
}

fn arg_serde<T: serde::de::DeserializeOwned>(
    a: &Map<String, Value>,
    k: &str,
) -> Result<T, GraphError> {
    serde_json::from_value(field(a, k)?.clone()).map_err(|e| bad(format!("'{k}': {e}")))
}

fn ids(v: &Value, k: &str) -> Result<Vec<usize>, GraphError> {
    v.as_array()
        .ok_or_else(|| bad(format!("'{k}' is not an array")))?
        .iter()
        .map(|x| usize_of(x, k))
        .collect()
}

fn shape4(v: &Value, k: &str) -> Result<[usize; 4], GraphError> {
    ids(v, k)?
        .try_into()
        .map_err(|_| bad(format!("'{k}' does not have four dimensions")))
}

/// Rebuilds an `Op` from its exported name and `args`.
pub fn op_from_json(name: &str, args: &Value) -> Result<Op, GraphError> {
    let empty = Map::new();
    let a = args.as_object().unwrap_or(&empty);
    Ok(match name {
        "input" => Op::Input,
        "add" => Op::Add,
        "mul" => Op::Mul,
        "scale" => Op::Scale(arg_f32(a, "s")?),
        "silu" => Op::Silu,
        "gelu" => Op::Gelu,
        "softcap" => Op::SoftCap(arg_f32(a, "c")?),
        "softmax" => Op::Softmax {
            dim: arg_usize(a, "dim")?,
        },
        "rms_norm" => Op::RmsNorm {
            eps: arg_f32(a, "eps")?,
        },
        "layer_norm" => Op::LayerNorm {
            eps: arg_f32(a, "eps")?,
        },
        "qk_norm" => Op::QkNorm {
            hd: arg_usize(a, "hd")?,
            nh: arg_usize(a, "nh")?,
            eps: arg_f32(a, "eps")?,
        },
        "matmul" => Op::MatMul {
            transpose_b: arg_bool(a, "transpose_b")?,
        },
        "get_rows" => Op::GetRows,
        "rope" => Op::RoPE {
            style: arg_serde(a, "style")?,
            // Documents written before the field existed hold plain rope.
            freq_factors: match a.get("freq_factors") {
                None => false,
                Some(_) => arg_bool(a, "freq_factors")?,
            },
        },
        "attn" => Op::Attn {
            mode: arg_serde(a, "mode")?,
            explicit_span: arg_bool(a, "explicit_span")?,
        },
        "kvcache_store" => Op::KvcacheStore {
            layer: arg_usize(a, "layer")?,
        },
        "kvcache_load" => Op::KvcacheLoad {
            layer: arg_usize(a, "layer")?,
        },
        "view" => Op::View {
            offset: arg_usize(a, "offset")?,
            shape: shape4(field(a, "shape")?, "shape")?,
        },
        "reshape" => Op::Reshape {
            shape: shape4(field(a, "shape")?, "shape")?,
        },
        "permute" => Op::Permute {
            dims: shape4(field(a, "dims")?, "dims")?,
        },
        "swiglu" => Op::SwiGLU,
        "geglu" => Op::GeGLU,
        "batch_matmul" => Op::BatchMatMul,
        "fused_qkv" => Op::FusedQKV {
            layer: arg_usize(a, "layer")?,
        },
        "qkv_bias_rope_store" => Op::QkvBiasRopeStore {
            layer: arg_usize(a, "layer")?,
        },
        "fused_ffn" => Op::FusedFFN,
        "top_k" => Op::TopK {
            k: arg_usize(a, "k")?,
        },
        "mul_mat_id" => Op::MulMatId,
        "mul_mat_id_swiglu" => Op::MulMatIdSwiGLU,
        "moe_sum" => Op::MoeSum {
            norm: arg_bool(a, "norm")?,
        },
        "mul_sigmoid" => Op::MulSigmoid,
        "sigmoid_gate" => Op::SigmoidGate,
        "slice" => Op::Slice {
            period: arg_usize(a, "period")?,
            start: arg_usize(a, "start")?,
            len: arg_usize(a, "len")?,
        },
        "ssm_conv" => Op::SsmConv {
            layer: arg_usize(a, "layer")?,
        },
        "delta_net" => Op::DeltaNet {
            layer: arg_usize(a, "layer")?,
        },
        "fused_qkv_norm" => Op::FusedQkvNorm {
            layer: arg_usize(a, "layer")?,
        },
        other => return Err(bad(format!("unknown op '{other}'"))),
    })
}

fn backend_from(name: &str) -> Result<Backend, GraphError> {
    if let Some(e) = crate::registry::KNOWN_BACKENDS
        .iter()
        .find(|e| e.name == name)
    {
        return Ok(e.id);
    }
    name.strip_prefix("backend#")
        .and_then(|n| n.parse().ok())
        .map(Backend)
        .ok_or_else(|| bad(format!("unknown backend '{name}'")))
}

/// Parses an exported document back into a graph (uid 0) and validates it.
pub fn import_json(doc: &Value) -> Result<ComputeGraph, GraphError> {
    let o = doc
        .as_object()
        .ok_or_else(|| bad("document is not an object"))?;
    if field(o, "format")?.as_str() != Some("minfer-graph") {
        return Err(bad("format is not 'minfer-graph'"));
    }
    if field(o, "version")?.as_u64() != Some(1) {
        return Err(bad("unsupported version"));
    }
    let mut g = ComputeGraph {
        inputs: ids(field(o, "inputs")?, "inputs")?,
        outputs: ids(field(o, "outputs")?, "outputs")?,
        ..Default::default()
    };
    let nodes = field(o, "nodes")?
        .as_array()
        .ok_or_else(|| bad("'nodes' is not an array"))?;
    for (i, v) in nodes.iter().enumerate() {
        let n = v
            .as_object()
            .ok_or_else(|| bad(format!("node {i} is not an object")))?;
        let op_name = field(n, "op")?
            .as_str()
            .ok_or_else(|| bad(format!("node {i}: 'op' is not a string")))?;
        let dtype = field(n, "dtype")?
            .as_str()
            .and_then(DType::from_name)
            .ok_or_else(|| bad(format!("node {i}: bad dtype")))?;
        let backend = match field(n, "backend")? {
            Value::Null => None,
            Value::String(s) => Some(backend_from(s)?),
            _ => return Err(bad(format!("node {i}: bad backend"))),
        };
        let meta = match field(n, "meta")? {
            Value::Null => NodeMeta::None,
            m => serde_json::from_value(m.clone())
                .map_err(|e| bad(format!("node {i}: meta: {e}")))?,
        };
        g.nodes.push(CNode {
            id: usize_of(field(n, "id")?, "id")?,
            name: field(n, "name")?.as_str().unwrap_or_default().to_string(),
            op: op_from_json(op_name, n.get("args").unwrap_or(&Value::Null))?,
            src: ids(field(n, "src")?, "src")?,
            out_shape: shape4(field(n, "shape")?, "shape")?,
            out_dtype: dtype,
            backend,
            meta,
        });
        g.dead
            .push(n.get("dead").and_then(Value::as_bool).unwrap_or(false));
    }
    g.validate()?;
    Ok(g)
}

/// `import_json` from text.
pub fn import_json_str(text: &str) -> Result<ComputeGraph, GraphError> {
    let v: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    import_json(&v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_documents_are_typed_errors() {
        assert!(matches!(import_json_str("[1]"), Err(GraphError::Import(_))));
        let doc = r#"{"format":"minfer-graph","version":1,"inputs":[],"outputs":[],
            "nodes":[{"id":0,"name":"x","op":"warp","shape":[1,1,1,1],"dtype":"f32",
            "backend":null,"src":[],"meta":null}]}"#;
        let e = import_json_str(doc).unwrap_err();
        assert!(e.to_string().contains("unknown op 'warp'"), "{e}");
        let doc = doc.replace("\"warp\"", "\"rms_norm\"");
        let e = import_json_str(&doc).unwrap_err();
        assert!(e.to_string().contains("missing field 'eps'"), "{e}");
    }
}

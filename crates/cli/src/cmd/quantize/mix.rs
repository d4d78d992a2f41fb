//! llama-quantize's file types ("mixes") and its rule for the type of each tensor: a mix
//! such as `Q4_K_M` names a default type and raises the tensors that suffer most from
//! quantization (the value projections, the first and last `ffn_down` layers, the output
//! matrix) to a wider one. Following the rule tensor by tensor means `minfer quantize` and
//! llama-quantize give the same file the same types, so the two can be compared file for
//! file. A few branches depend on whether an importance matrix is given ([`Mix::imatrix`]).

use anyhow::{bail, Result};
use minfer_gguf::{GgmlType, GgufFile, MetaValue, TensorInfo, QK_K};

/// One of llama-quantize's file types: its name, its `general.file_type` id and the type
/// its tensors take unless the rule raises them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ftype {
    /// llama-quantize's name for the mix (`Q4_K_M`).
    pub name: &'static str,
    /// llama.cpp's `llama_ftype` id, written as `general.file_type`.
    pub id: u32,
    /// The type of every quantized tensor the rule does not raise.
    pub default: GgmlType,
}

const fn ft(name: &'static str, id: u32, default: GgmlType) -> Ftype {
    Ftype { name, id, default }
}

/// The mixes minfer can write, with llama-quantize's names and ids. `Q3_K`, `Q4_K` and
/// `Q5_K` are llama-quantize's aliases of the `_M` mixes; `IQ2_S` is the mix whose default
/// type is IQ2_XS and `IQ2_M` the one whose default type is IQ2_S, as there.
pub const FTYPES: &[Ftype] = &[
    ft("F32", 0, GgmlType::F32),
    ft("F16", 1, GgmlType::F16),
    ft("BF16", 32, GgmlType::BF16),
    ft("Q4_0", 2, GgmlType::Q4_0),
    ft("Q4_1", 3, GgmlType::Q4_1),
    ft("Q5_0", 8, GgmlType::Q5_0),
    ft("Q5_1", 9, GgmlType::Q5_1),
    ft("Q8_0", 7, GgmlType::Q8_0),
    ft("Q2_K", 10, GgmlType::Q2K),
    ft("Q2_K_S", 21, GgmlType::Q2K),
    ft("Q3_K_S", 11, GgmlType::Q3K),
    ft("Q3_K_M", 12, GgmlType::Q3K),
    ft("Q3_K_L", 13, GgmlType::Q3K),
    ft("Q4_K_S", 14, GgmlType::Q4K),
    ft("Q4_K_M", 15, GgmlType::Q4K),
    ft("Q5_K_S", 16, GgmlType::Q5K),
    ft("Q5_K_M", 17, GgmlType::Q5K),
    ft("Q6_K", 18, GgmlType::Q6K),
    ft("IQ2_XXS", 19, GgmlType::Iq2Xxs),
    ft("IQ2_XS", 20, GgmlType::Iq2Xs),
    ft("IQ2_S", 28, GgmlType::Iq2Xs),
    ft("IQ2_M", 29, GgmlType::Iq2S),
    ft("IQ3_XXS", 23, GgmlType::Iq3Xxs),
    ft("IQ3_XS", 22, GgmlType::Iq3S),
    ft("IQ3_S", 26, GgmlType::Iq3S),
    ft("IQ3_M", 27, GgmlType::Iq3S),
    ft("IQ1_S", 24, GgmlType::Iq1S),
    ft("IQ1_M", 31, GgmlType::Iq1M),
    ft("IQ4_NL", 25, GgmlType::Iq4Nl),
    ft("IQ4_XS", 30, GgmlType::Iq4Xs),
    ft("TQ1_0", 36, GgmlType::Tq1_0),
    ft("TQ2_0", 37, GgmlType::Tq2_0),
    ft("MXFP4_MOE", 38, GgmlType::Mxfp4),
];

/// llama-quantize's aliases: the bare k-quant names are the `_M` mixes.
const ALIASES: [(&str, &str); 3] = [("Q3_K", "Q3_K_M"), ("Q4_K", "Q4_K_M"), ("Q5_K", "Q5_K_M")];

/// Reads a mix by llama-quantize's name (case-insensitive), or refuses it with the list.
pub fn parse_ftype(s: &str) -> Result<Ftype> {
    let name = ALIASES
        .iter()
        .find(|(a, _)| a.eq_ignore_ascii_case(s))
        .map_or(s, |(_, m)| m);
    if let Some(f) = FTYPES.iter().find(|f| f.name.eq_ignore_ascii_case(name)) {
        return Ok(*f);
    }
    let list = FTYPES.iter().map(|f| f.name).collect::<Vec<_>>().join(", ");
    if s.eq_ignore_ascii_case("Q8_K") {
        bail!("type Q8_K holds activations, not model files; minfer can write: {list}");
    }
    bail!("unknown type `{s}`; minfer can write: {list} (and Q3_K, Q4_K, Q5_K for the _M mixes)")
}

/// The tensor families the rule tells apart, by name as llama-quantize reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    TokenEmbd,
    AttnQ,
    AttnK,
    AttnV,
    AttnQkv,
    AttnKvB,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

fn category(name: &str) -> Category {
    use Category::*;
    let order = [
        ("attn_qkv.weight", AttnQkv),
        ("attn_kv_b.weight", AttnKvB),
        ("attn_v.weight", AttnV),
        ("attn_k.weight", AttnK),
        ("attn_q.weight", AttnQ),
        ("attn_output.weight", AttnOutput),
        ("ffn_up", FfnUp),
        ("ffn_gate", FfnGate),
        ("ffn_down", FfnDown),
    ];
    if name == "output.weight" {
        return Output;
    }
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        return TokenEmbd;
    }
    order
        .iter()
        .find(|(k, _)| name.contains(k))
        .map_or(Other, |(_, c)| *c)
}

/// Value-like projections, which the rule treats as the most sensitive.
fn is_attn_v(c: Category) -> bool {
    matches!(c, Category::AttnV | Category::AttnQkv | Category::AttnKvB)
}

/// Whether llama-quantize quantizes the tensor at all: 2-D and 3-D weight matrices only,
/// never norms, the MoE router, position/type embeddings or the small recurrent and
/// relative-position weights.
pub fn is_quantizable(t: &TensorInfo) -> bool {
    const KEEP: [&str; 13] = [
        "_norm.weight",
        "ffn_gate_inp.weight",
        "pos_embd.weight",
        "token_types.weight",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "attn_rel_b.weight",
        "time_mix_first.weight",
        "time_mix_w1.weight",
        "time_mix_w2.weight",
        "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight",
    ];
    // ggml's dimension count: trailing sizes of 1 do not count.
    let n_dims = t.dims.iter().rposition(|d| *d > 1).map_or(1, |i| i + 1);
    t.name.ends_with("weight") && n_dims >= 2 && !KEEP.iter().any(|k| t.name.contains(k))
}

/// The layer of a `blk.N.` tensor, as llama.cpp's loader parses it.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// What the rule reads of the model: head grouping, expert count, depth, whether the
/// embedding doubles as the output, and whether it is one of llama.cpp's 70B shapes.
#[derive(Clone, Debug, Default)]
pub struct ModelFacts {
    /// Query heads per KV head of layer 0.
    pub n_gqa: u32,
    /// Routed experts (0 for a dense model).
    pub n_expert: u32,
    /// Transformer blocks.
    pub n_layer: u32,
    /// The file has no `output.weight`: the token embedding serves as it.
    pub tied: bool,
    /// llama.cpp's 70B model type (80 grouped-query layers of Llama or Qwen2), for which
    /// the rule widens the value projection.
    pub is_70b: bool,
    /// Falcon, which the rule treats apart.
    pub falcon: bool,
}

/// The first element of a per-layer array, or the value itself.
fn first_u64(v: Option<&MetaValue>) -> Option<u64> {
    let v = v?;
    v.as_array()
        .map_or_else(|| v.as_u64(), |a| a.first()?.as_u64())
}

impl ModelFacts {
    /// Reads the facts from `file`'s metadata; absent keys leave the neutral values.
    pub fn of(file: &GgufFile) -> ModelFacts {
        let arch = file.architecture().unwrap_or("").to_string();
        let key = |k: &str| file.get(&format!("{arch}.{k}"));
        let n_head = first_u64(key("attention.head_count")).unwrap_or(1);
        let n_head_kv = first_u64(key("attention.head_count_kv"))
            .unwrap_or(n_head)
            .max(1);
        let n_layer = first_u64(key("block_count")).unwrap_or(0) as u32;
        let n_gqa = (n_head / n_head_kv) as u32;
        ModelFacts {
            n_gqa,
            n_expert: first_u64(key("expert_count")).unwrap_or(0) as u32,
            n_layer,
            tied: file.tensor("output.weight").is_none(),
            is_70b: matches!(arch.as_str(), "llama" | "qwen2") && n_layer == 80 && n_gqa > 1,
            falcon: arch == "falcon",
        }
    }
}

/// The type of each tensor of a file under one mix, decided in llama.cpp's order (the
/// per-category counters the rule keeps depend on it).
pub struct Mix {
    ftype: Ftype,
    pure: bool,
    has_imatrix: bool,
    facts: ModelFacts,
    n_attention_wv: usize,
    i_attention_wv: usize,
    i_ffn_down: usize,
    i_ffn_gate: usize,
    i_ffn_up: usize,
}

/// llama-quantize's choice of layers that get more bits: the first and last eighth and
/// every third layer between.
fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i as isize - (n / 8) as isize).rem_euclid(3) == 2
}

impl Mix {
    /// The rule for `ftype` over `tensors` (the file's, in any order). With `pure`, every
    /// quantizable tensor takes the default type (llama-quantize's `--pure`).
    pub fn new(ftype: Ftype, pure: bool, facts: ModelFacts, tensors: &[TensorInfo]) -> Mix {
        let n_attention_wv = tensors
            .iter()
            .filter(|t| is_attn_v(category(&t.name)))
            .count();
        Mix {
            ftype,
            pure,
            has_imatrix: false,
            facts,
            n_attention_wv,
            i_attention_wv: 0,
            i_ffn_down: 0,
            i_ffn_gate: 0,
            i_ffn_up: 0,
        }
    }

    /// The rule as llama-quantize applies it with an importance matrix (`has`): IQ3_XXS
    /// keeps its value projections and `ffn_down` at IQ3_XXS, IQ4_NL and IQ4_XS no longer
    /// raise the first `ffn_down` layers, and Q4_0 and Q5_0 raise them to Q4_1 and Q5_1.
    pub fn imatrix(mut self, has: bool) -> Mix {
        self.has_imatrix = has;
        self
    }

    /// The type of every tensor of `tensors`, index for index: unquantizable ones keep
    /// their type; the others are decided in llama.cpp's order (non-block tensors, then
    /// blocks by number, names sorted within each).
    pub fn types(mut self, tensors: &[TensorInfo]) -> Vec<GgmlType> {
        let mut order: Vec<usize> = (0..tensors.len()).collect();
        let key = |i: &usize| {
            let n = &tensors[*i].name;
            (layer_of(n).map_or(-1, |l| l as i64), n.clone())
        };
        order.sort_by_key(key);
        let mut out: Vec<GgmlType> = tensors.iter().map(|t| t.ggml_type).collect();
        for i in order {
            let t = &tensors[i];
            if is_quantizable(t) {
                out[i] = self.tensor_type(t);
            }
        }
        out
    }

    fn tensor_type(&mut self, t: &TensorInfo) -> GgmlType {
        let mut ty = self.ftype.default;
        if !ty.is_quantized() {
            return ty;
        }
        if !self.pure {
            ty = self.raise(t, ty);
        }
        fallback(ty, t.dims.first().copied().unwrap_or(1))
    }

    /// llama-quantize's per-category rule.
    fn raise(&mut self, t: &TensorInfo, default: GgmlType) -> GgmlType {
        use Category as C;
        use GgmlType::*;
        let name = t.name.as_str();
        let cat = category(name);
        let f = self.ftype.name;
        let facts = self.facts.clone();
        let is = |names: &[&str]| names.contains(&f);
        let low_iq = is(&["IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"]);
        let row = t.dims.first().copied().unwrap_or(1);
        let mut ty = default;
        let n_layer = facts.n_layer as usize;
        // The layer the FFN counters stand for: MoE expert tensors are numbered by name.
        let layer = |counter: usize| {
            if facts.n_expert > 1 {
                layer_of(name).unwrap_or(counter)
            } else {
                counter
            }
        };
        if cat == C::Output || (facts.tied && cat == C::TokenEmbd) {
            ty = if f == "MXFP4_MOE" || facts.falcon || !row.is_multiple_of(ty.block_size() as u64)
            {
                Q8_0
            } else if is(&[
                "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M",
            ]) {
                Q5K
            } else if ty != Q8_0 {
                Q6K
            } else {
                ty
            };
        } else if f == "MXFP4_MOE" {
            // Expert tensors (3-D) MXFP4, everything else Q8_0.
            ty = if t.dims.get(2).copied().unwrap_or(1) > 1 {
                Mxfp4
            } else {
                Q8_0
            };
        } else if cat == C::TokenEmbd {
            if is(&["IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"]) {
                ty = Q2K;
            } else if is(&["IQ2_S", "IQ2_M", "IQ3_XXS"]) {
                ty = Iq3S;
            } else if is(&["TQ1_0", "TQ2_0"]) {
                ty = Q4K;
            }
        } else if low_iq {
            if is_attn_v(cat) {
                ty = if facts.n_gqa >= 4 || facts.n_expert >= 4 {
                    Q4K
                } else if is(&["IQ2_S", "IQ2_M"]) {
                    Iq3S
                } else {
                    Q2K
                };
                self.i_attention_wv += 1;
            } else if facts.n_expert == 8 && cat == C::AttnK {
                ty = Q4K;
            } else if cat == C::FfnDown {
                if self.i_ffn_down < n_layer / 8 {
                    ty = if is(&["IQ2_S", "IQ2_M"]) { Iq3S } else { Q2K };
                }
                self.i_ffn_down += 1;
            } else if cat == C::AttnOutput {
                if facts.n_expert == 8 {
                    ty = Q5K;
                } else if is(&["IQ1_S", "IQ1_M"]) {
                    ty = Iq2Xxs;
                } else if is(&["IQ2_S", "IQ2_M"]) {
                    ty = Iq3S;
                }
            }
        } else if is_attn_v(cat) {
            let gqa4 = facts.n_gqa >= 4;
            let (i, n) = (self.i_attention_wv, self.n_attention_wv);
            match f {
                "Q2_K" => ty = if gqa4 { Q4K } else { Q3K },
                "Q2_K_S" if gqa4 => ty = Q4K,
                // Without an importance matrix IQ3_XXS raises the value projection to IQ3_S.
                "IQ3_XXS" if gqa4 => ty = Q4K,
                "IQ3_XXS" if !self.has_imatrix => ty = Iq3S,
                "IQ3_XXS" => {}
                "IQ3_XS" | "IQ3_S" if gqa4 => ty = Q4K,
                "IQ3_M" => ty = Q4K,
                "Q3_K_M" => ty = if i < 2 { Q5K } else { Q4K },
                "Q3_K_L" => ty = Q5K,
                "IQ4_NL" | "IQ4_XS" if gqa4 => ty = Q5K,
                "Q4_K_M" | "Q5_K_M" if use_more_bits(i, n) => ty = Q6K,
                "Q4_K_S" if i < 4 => ty = Q5K,
                _ => {}
            }
            if facts.is_70b && matches!(ty, Q3K | Q4K) {
                ty = Q5K;
            }
            if facts.n_expert == 8 {
                ty = Q8_0;
            }
            self.i_attention_wv += 1;
        } else if cat == C::AttnK {
            if facts.n_expert == 8 {
                ty = Q8_0;
            } else if f == "IQ3_XS" {
                ty = Iq3Xxs;
            } else if f == "IQ3_XXS" {
                ty = Iq2S;
            }
        } else if cat == C::AttnQ {
            if f == "IQ3_XS" {
                ty = Iq3Xxs;
            } else if f == "IQ3_XXS" {
                ty = Iq2S;
            }
        } else if cat == C::FfnDown {
            let i = layer(self.i_ffn_down);
            let n = n_layer;
            match f {
                "Q2_K" => ty = Q3K,
                "Q2_K_S" if i < n / 8 => ty = Q4K,
                "IQ3_XXS" if !self.has_imatrix => ty = if i < n / 8 { Q4K } else { Q3K },
                "Q3_K_M" => {
                    ty = if i < n / 16 {
                        Q5K
                    } else if !facts.falcon || use_more_bits(i, n) {
                        Q4K
                    } else {
                        Q3K
                    }
                }
                "IQ3_M" if i < n / 8 || (facts.n_expert == 8 && use_more_bits(i, n)) => ty = Q4K,
                "Q3_K_L" => ty = if facts.falcon { Q4K } else { Q5K },
                "Q4_K_M" => {
                    if facts.falcon {
                        ty = if i < n / 16 {
                            Q6K
                        } else if use_more_bits(i, n) {
                            Q5K
                        } else {
                            Q4K
                        };
                    } else if use_more_bits(i, n) {
                        ty = Q6K;
                    }
                }
                "IQ4_NL" | "IQ4_XS" if i < n / 8 && !self.has_imatrix => ty = Q5K,
                "Q5_K_M" if use_more_bits(i, n) => ty = Q6K,
                "Q4_K_S" if !facts.falcon && i < n / 8 => ty = Q5K,
                // With an importance matrix the first eighth of Q4_0 and Q5_0 `ffn_down`
                // takes the type with a minimum.
                "Q4_0" if self.has_imatrix && i < n / 8 => ty = Q4_1,
                "Q5_0" if self.has_imatrix && i < n / 8 => ty = Q5_1,
                _ => {}
            }
            self.i_ffn_down += 1;
        } else if cat == C::AttnOutput {
            if !facts.falcon {
                if facts.n_expert == 8 {
                    if is(&[
                        "Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S",
                        "Q4_K_M", "IQ3_S", "IQ3_M", "IQ4_XS",
                    ]) {
                        ty = Q5K;
                    }
                } else {
                    match f {
                        "Q2_K" => ty = Q3K,
                        "IQ3_XXS" => ty = Iq3S,
                        "Q3_K_M" | "IQ3_M" => ty = Q4K,
                        "Q3_K_L" => ty = Q5K,
                        _ => {}
                    }
                }
            } else if f == "Q3_K_L" {
                ty = Q4K;
            }
        } else if cat == C::AttnQkv {
            match f {
                "Q3_K_M" | "Q3_K_L" | "IQ3_M" => ty = Q4K,
                "Q4_K_M" => ty = Q5K,
                "Q5_K_M" => ty = Q6K,
                _ => {}
            }
        } else if cat == C::FfnGate || cat == C::FfnUp {
            let counter = if cat == C::FfnGate {
                &mut self.i_ffn_gate
            } else {
                &mut self.i_ffn_up
            };
            let i = layer(*counter);
            if f == "IQ3_XS" && i >= n_layer / 8 && i < 7 * n_layer / 8 {
                ty = Iq3Xxs;
            }
            *counter += 1;
        }
        ty
    }
}

/// Whether llama-quantize refuses to write tensor `name` as `ty` in mix `ftype` without
/// importance weights: the 1- to 3-bit lattice types, and Q2_K in the Q2_K_S mix, except
/// on the token embedding and the output matrix.
pub fn requires_imatrix(name: &str, ty: GgmlType, ftype: &Ftype) -> bool {
    use GgmlType::*;
    if category(name) == Category::TokenEmbd || name == "output.weight" {
        return false;
    }
    match ty {
        Iq3Xxs | Iq2Xxs | Iq2Xs | Iq2S | Iq1M | Iq1S => true,
        Q2K => ftype.name == "Q2_K_S",
        _ => false,
    }
}

/// llama-quantize's replacement for a type whose blocks do not divide the row length:
/// the 256-blocks go to a 32-block type of similar size, and F16 where even that fails.
pub fn fallback(ty: GgmlType, row: u64) -> GgmlType {
    use GgmlType::*;
    if row.is_multiple_of(ty.block_size() as u64) {
        return ty;
    }
    let ty = if ty.block_size() == QK_K {
        match ty {
            Q2K | Q3K | Tq1_0 | Tq2_0 => Q4_0,
            Q4K => Q5_0,
            Q5K => Q5_1,
            Q6K => Q8_0,
            _ => Iq4Nl,
        }
    } else {
        ty
    };
    if row.is_multiple_of(ty.block_size() as u64) {
        ty
    } else {
        F16
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use GgmlType::*;

    fn info(name: &str, dims: &[u64]) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            dims: dims.to_vec(),
            ggml_type: F32,
            offset: 0,
            n_bytes: 0,
        }
    }

    /// A dense model of `n_layer` blocks with rows of `row` values.
    fn dense(n_layer: usize, row: u64, tied: bool) -> Vec<TensorInfo> {
        let mut v = vec![info("token_embd.weight", &[row, 512])];
        if !tied {
            v.push(info("output.weight", &[row, 512]));
        }
        v.push(info("output_norm.weight", &[row]));
        for l in 0..n_layer {
            for m in [
                "attn_q",
                "attn_k",
                "attn_v",
                "attn_output",
                "ffn_up",
                "ffn_gate",
            ] {
                v.push(info(&format!("blk.{l}.{m}.weight"), &[row, row]));
            }
            v.push(info(&format!("blk.{l}.ffn_down.weight"), &[row * 2, row]));
            v.push(info(&format!("blk.{l}.attn_norm.weight"), &[row]));
        }
        v
    }

    fn facts(n_layer: u32, n_gqa: u32, tied: bool) -> ModelFacts {
        ModelFacts {
            n_gqa,
            n_layer,
            tied,
            ..ModelFacts::default()
        }
    }

    fn types_of(
        ftype: &str,
        t: &[TensorInfo],
        f: ModelFacts,
        pure: bool,
    ) -> Vec<(String, GgmlType)> {
        let ft = parse_ftype(ftype).unwrap();
        let ty = Mix::new(ft, pure, f, t).types(t);
        t.iter().map(|t| t.name.clone()).zip(ty).collect()
    }

    fn of(v: &[(String, GgmlType)], name: &str) -> GgmlType {
        v.iter().find(|(n, _)| n == name).map(|(_, t)| *t).unwrap()
    }

    #[test]
    fn names_follow_llama_quantize() {
        assert_eq!(parse_ftype("q4_k").unwrap().name, "Q4_K_M");
        assert_eq!(parse_ftype("Q4_K_M").unwrap().id, 15);
        assert_eq!(parse_ftype("iq4_xs").unwrap().id, 30);
        assert_eq!(parse_ftype("IQ2_S").unwrap().default, Iq2Xs);
        assert_eq!(parse_ftype("IQ2_M").unwrap().default, Iq2S);
        assert_eq!(parse_ftype("MXFP4_MOE").unwrap().default, Mxfp4);
        let e = parse_ftype("Q4_K_X").unwrap_err().to_string();
        assert!(
            e.contains("unknown type `Q4_K_X`") && e.contains("IQ4_NL"),
            "{e}"
        );
        let e = parse_ftype("q8_k").unwrap_err().to_string();
        assert!(e.contains("Q8_K holds activations"), "{e}");
    }

    #[test]
    fn matrices_are_quantized_and_the_rest_kept() {
        assert!(is_quantizable(&info("blk.0.attn_q.weight", &[256, 256])));
        assert!(is_quantizable(&info("token_embd.weight", &[256, 512])));
        assert!(!is_quantizable(&info("blk.0.attn_norm.weight", &[256])));
        assert!(!is_quantizable(&info("blk.0.attn_q.bias", &[256])));
        assert!(!is_quantizable(&info(
            "blk.0.ffn_gate_inp.weight",
            &[256, 8]
        )));
        assert!(!is_quantizable(&info("blk.0.ssm_conv1d.weight", &[4, 256])));
        assert!(!is_quantizable(&info("rope_freqs.weight", &[64])));
        assert!(!is_quantizable(&info("blk.0.x.weight", &[256, 1])));
    }

    /// Q4_K_M: Q6_K head, Q6_K on the value projections and `ffn_down` of the layers
    /// `use_more_bits` picks (first and last eighth, every third between), Q4_K elsewhere.
    #[test]
    fn q4_k_m_raises_the_sensitive_layers() {
        let t = dense(16, 256, false);
        let v = types_of("Q4_K_M", &t, facts(16, 2, false), false);
        assert_eq!(of(&v, "output.weight"), Q6K);
        assert_eq!(of(&v, "token_embd.weight"), Q4K);
        assert_eq!(of(&v, "output_norm.weight"), F32);
        let more = [0, 1, 4, 7, 10, 13, 14, 15];
        for l in 0..16 {
            let want = if more.contains(&l) { Q6K } else { Q4K };
            assert_eq!(of(&v, &format!("blk.{l}.attn_v.weight")), want, "layer {l}");
            assert_eq!(
                of(&v, &format!("blk.{l}.ffn_down.weight")),
                want,
                "layer {l}"
            );
            assert_eq!(of(&v, &format!("blk.{l}.attn_q.weight")), Q4K);
        }
        // --pure: the default type everywhere, the head included.
        let v = types_of("Q4_K_M", &t, facts(16, 2, false), true);
        assert_eq!(of(&v, "output.weight"), Q4K);
        assert_eq!(of(&v, "blk.0.attn_v.weight"), Q4K);
    }

    /// IQ4_XS without an importance matrix: the first eighth of `ffn_down` Q5_K, the value
    /// projections Q5_K from 4 query heads per KV head; rows of 896 fall back to IQ4_NL
    /// (Q5_K to Q5_1, the head to Q8_0) -- the default model's file.
    #[test]
    fn iq4_xs_mix_and_fallbacks() {
        let t = dense(24, 896, false);
        let v = types_of("IQ4_XS", &t, facts(24, 7, false), false);
        assert_eq!(of(&v, "output.weight"), Q8_0);
        assert_eq!(of(&v, "token_embd.weight"), Iq4Nl);
        assert_eq!(of(&v, "blk.0.attn_q.weight"), Iq4Nl);
        assert_eq!(of(&v, "blk.5.attn_v.weight"), Q5_1);
        for l in 0..24 {
            let want = if l < 3 { Q5K } else { Iq4Xs };
            assert_eq!(
                of(&v, &format!("blk.{l}.ffn_down.weight")),
                want,
                "layer {l}"
            );
        }
        // Fewer query heads per KV head leave the value projection alone.
        let v = types_of("IQ4_XS", &t, facts(24, 2, false), false);
        assert_eq!(of(&v, "blk.5.attn_v.weight"), Iq4Nl);
    }

    /// The low-bit i-quant mixes: Q5_K head (the tied embedding is the head), Q2_K or
    /// IQ3_S embedding and value projections, the first eighth of `ffn_down` raised.
    #[test]
    fn low_bit_i_quant_mixes() {
        let t = dense(8, 256, true);
        let v = types_of("IQ2_XXS", &t, facts(8, 2, true), false);
        assert_eq!(of(&v, "token_embd.weight"), Q5K);
        assert_eq!(of(&v, "blk.0.attn_v.weight"), Q2K);
        assert_eq!(of(&v, "blk.0.ffn_down.weight"), Q2K);
        assert_eq!(of(&v, "blk.1.ffn_down.weight"), Iq2Xxs);
        assert_eq!(of(&v, "blk.1.attn_q.weight"), Iq2Xxs);
        let t = dense(8, 256, false);
        let v = types_of("IQ2_M", &t, facts(8, 2, false), false);
        assert_eq!(of(&v, "token_embd.weight"), Iq3S);
        assert_eq!(of(&v, "blk.3.attn_v.weight"), Iq3S);
        assert_eq!(of(&v, "blk.3.attn_output.weight"), Iq3S);
        assert_eq!(of(&v, "blk.3.attn_q.weight"), Iq2S);
        let v = types_of("TQ2_0", &t, facts(8, 2, false), false);
        assert_eq!(of(&v, "token_embd.weight"), Q4K);
        assert_eq!(of(&v, "blk.3.attn_q.weight"), Tq2_0);
    }

    /// MXFP4_MOE: expert tensors MXFP4, every other matrix Q8_0.
    #[test]
    fn mxfp4_moe_mix() {
        let t = vec![
            info("blk.0.ffn_up_exps.weight", &[256, 512, 8]),
            info("blk.0.attn_q.weight", &[256, 256]),
            info("output.weight", &[256, 512]),
        ];
        let f = ModelFacts {
            n_expert: 8,
            ..facts(1, 2, false)
        };
        let v = types_of("MXFP4_MOE", &t, f, false);
        assert_eq!(of(&v, "blk.0.ffn_up_exps.weight"), Mxfp4);
        assert_eq!(of(&v, "blk.0.attn_q.weight"), Q8_0);
        assert_eq!(of(&v, "output.weight"), Q8_0);
    }

    #[test]
    fn fallbacks_follow_llama_quantize() {
        assert_eq!(fallback(Q4K, 128), Q5_0);
        assert_eq!(fallback(Q6K, 128), Q8_0);
        assert_eq!(fallback(Q2K, 128), Q4_0);
        assert_eq!(fallback(Iq4Xs, 128), Iq4Nl);
        assert_eq!(fallback(Q8_0, 40), F16);
        assert_eq!(fallback(Q4K, 256), Q4K);
    }
}

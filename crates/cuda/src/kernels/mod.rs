//! The kernel table: every CUDA entry point the backend launches, the `.cu` sources that
//! define them, and the one NVRTC program they form.
//!
//! The sources are compiled together at run time (NVRTC, once per process, for the
//! device's compute capability): `common.cu` first, then each kernel file.

use minfer_gguf::GgmlType;

/// The kernel sources in program order (`common.cu` defines what the others use).
pub const SOURCES: [(&str, &str); 11] = [
    ("common.cu", include_str!("common.cu")),
    ("elementwise.cu", include_str!("elementwise.cu")),
    ("tanh_act.cu", include_str!("tanh_act.cu")),
    ("norm.cu", include_str!("norm.cu")),
    ("embed.cu", include_str!("embed.cu")),
    ("matvec.cu", include_str!("matvec.cu")),
    ("quant.cu", include_str!("quant.cu")),
    ("mmq.cu", include_str!("mmq.cu")),
    ("rope.cu", include_str!("rope.cu")),
    ("kv.cu", include_str!("kv.cu")),
    ("attn.cu", include_str!("attn.cu")),
];

/// The whole program NVRTC compiles: every source, in order.
pub fn program() -> String {
    let mut s = String::new();
    for (name, src) in SOURCES {
        s.push_str(&format!("// ---- {name}\n"));
        s.push_str(src);
        s.push('\n');
    }
    s
}

/// The weight types the kernels decode (embedding and mat-vec).
pub const WEIGHT_TYPES: [GgmlType; 8] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4K,
    GgmlType::Q6K,
    GgmlType::Iq4Nl,
    GgmlType::Iq4Xs,
];

/// The weight types the int8 (dp4a) prefill matmul decodes.
pub const MMQ_TYPES: [GgmlType; 6] = [
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4K,
    GgmlType::Q6K,
    GgmlType::Iq4Nl,
    GgmlType::Iq4Xs,
];

/// How the activation of an int8 matmul is quantized, as the CPU does for that weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActQuant {
    /// Q8_0: groups of 32 (for Q8_0, Q5_0 and IQ4_NL weights).
    Q8_0,
    /// Q8_K: groups of 256 (for the K-quants and IQ4_XS).
    Q8K,
}

impl ActQuant {
    /// Values per scale.
    pub fn group(self) -> usize {
        match self {
            ActQuant::Q8_0 => 32,
            ActQuant::Q8K => 256,
        }
    }

    /// The activation format the CPU pairs with weights of type `ty`.
    pub fn for_weight(ty: GgmlType) -> Option<ActQuant> {
        match ty {
            GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Iq4Nl => Some(ActQuant::Q8_0),
            GgmlType::Q4K | GgmlType::Q6K | GgmlType::Iq4Xs => Some(ActQuant::Q8K),
            _ => None,
        }
    }
}

/// One CUDA entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `y = a + b` (b broadcast over tokens).
    Add,
    /// `y = a * b` (b broadcast over tokens).
    Mul,
    /// `y = a * s`.
    Scale,
    /// `y = silu(a)`.
    Silu,
    /// `y = silu(g) * u`.
    SwiGlu,
    /// `y = x * sigmoid(g)`, one gate per row.
    MulSigmoid,
    /// `y = gelu(a)` (tanh form).
    Gelu,
    /// `y = gelu(g) * u`.
    GeGlu,
    /// `y = c * tanh(a / c)`.
    SoftCap,
    /// The fused FFN's in-place SwiGLU over `[gate | up]` rows.
    SwiGluRows,
    /// Row gather by index.
    Gather,
    /// RMS norm over rows (also the per-head q/k norm).
    RmsNorm,
    /// Embedding lookup from a table of this type.
    Embed(GgmlType),
    /// Mat-vec (decode) against a weight of this type, f32 activations.
    MatVec(GgmlType),
    /// Int8 dp4a matmul (prefill) against a weight of this type.
    Mmq(GgmlType),
    /// Activation quantizer.
    Quant(ActQuant),
    /// Rotary embedding, both styles.
    Rope,
    /// KV row store.
    KvStore,
    /// Flash-style GQA attention.
    Attn,
}

fn type_suffix(ty: GgmlType) -> Option<&'static str> {
    Some(match ty {
        GgmlType::F32 => "f32",
        GgmlType::F16 => "f16",
        GgmlType::Q8_0 => "q8_0",
        GgmlType::Q5_0 => "q5_0",
        GgmlType::Q4K => "q4_k",
        GgmlType::Q6K => "q6_k",
        GgmlType::Iq4Nl => "iq4_nl",
        GgmlType::Iq4Xs => "iq4_xs",
        _ => return None,
    })
}

impl Kernel {
    /// The entry point's name in the program, or why this kernel does not exist.
    pub fn name(self) -> Result<String, String> {
        let typed = |prefix: &str, ty: GgmlType, set: &[GgmlType]| match type_suffix(ty) {
            Some(s) if set.contains(&ty) => Ok(format!("{prefix}_{s}")),
            _ => Err(format!("no {prefix} kernel decodes {ty}")),
        };
        Ok(match self {
            Kernel::Add => "add_f32".into(),
            Kernel::Mul => "mul_f32".into(),
            Kernel::Scale => "scale_f32".into(),
            Kernel::Silu => "silu_f32".into(),
            Kernel::SwiGlu => "swiglu_f32".into(),
            Kernel::MulSigmoid => "mul_sigmoid_f32".into(),
            Kernel::Gelu => "gelu_f32".into(),
            Kernel::GeGlu => "geglu_f32".into(),
            Kernel::SoftCap => "softcap_f32".into(),
            Kernel::SwiGluRows => "swiglu_rows_f32".into(),
            Kernel::Gather => "gather_f32".into(),
            Kernel::RmsNorm => "rms_norm_f32".into(),
            Kernel::Embed(ty) => typed("embed", ty, &WEIGHT_TYPES)?,
            Kernel::MatVec(ty) => typed("matvec", ty, &WEIGHT_TYPES)?,
            Kernel::Mmq(ty) => typed("mmq", ty, &MMQ_TYPES)?,
            Kernel::Quant(ActQuant::Q8_0) => "quant_q8_0_f32".into(),
            Kernel::Quant(ActQuant::Q8K) => "quant_q8_k_f32".into(),
            Kernel::Rope => "rope_f32".into(),
            Kernel::KvStore => "kv_store_f32".into(),
            Kernel::Attn => "attn_f32".into(),
        })
    }

    /// Every kernel the backend can launch (what backend creation loads).
    pub fn all() -> Vec<Kernel> {
        let mut v = vec![
            Kernel::Add,
            Kernel::Mul,
            Kernel::Scale,
            Kernel::Silu,
            Kernel::SwiGlu,
            Kernel::MulSigmoid,
            Kernel::Gelu,
            Kernel::GeGlu,
            Kernel::SoftCap,
            Kernel::SwiGluRows,
            Kernel::Gather,
            Kernel::RmsNorm,
            Kernel::Quant(ActQuant::Q8_0),
            Kernel::Quant(ActQuant::Q8K),
            Kernel::Rope,
            Kernel::KvStore,
            Kernel::Attn,
        ];
        v.extend(WEIGHT_TYPES.iter().map(|&t| Kernel::Embed(t)));
        v.extend(WEIGHT_TYPES.iter().map(|&t| Kernel::MatVec(t)));
        v.extend(MMQ_TYPES.iter().map(|&t| Kernel::Mmq(t)));
        v
    }
}

/// The kind of one kernel parameter: what the launch passes for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// A device address (any pointer type).
    Ptr,
    /// A 32-bit unsigned value.
    U32,
    /// A 32-bit float.
    F32,
}

impl Kernel {
    /// The kernel's parameter list, in order, as its `.cu` signature declares it
    /// (checked against the sources by this module's tests, and against every recorded
    /// launch by the backend).
    pub fn params(self) -> &'static [Param] {
        use Param::{Ptr as P, F32 as F, U32 as U};
        match self {
            Kernel::Add | Kernel::Mul | Kernel::Gather | Kernel::MulSigmoid => &[P, P, P, U, U],
            Kernel::Silu | Kernel::Gelu => &[P, P, U],
            Kernel::Scale => &[P, P, U, F],
            Kernel::SoftCap => &[P, P, U, F, F],
            Kernel::SwiGlu | Kernel::GeGlu => &[P, P, P, U],
            Kernel::SwiGluRows => &[P, U, U],
            Kernel::RmsNorm => &[P, P, P, U, F, U],
            Kernel::Embed(_) => &[P, P, P, U, U],
            Kernel::MatVec(_) => &[P, P, P, P, U, U, U, U, U, U, U, U],
            Kernel::Quant(_) => &[P, P, P, U, U],
            Kernel::Mmq(_) => &[P, P, P, P, P, U, U, U, U, U, U, U, U],
            Kernel::Rope => &[P, P, U, U, U, U, U, U, F, F],
            Kernel::KvStore => &[P, P, P, P, P, U, U],
            Kernel::Attn => &[P, P, P, P, P, P, U, U, U, U, U, F, U, F, F],
        }
    }
}

/// The parameter kinds of every kernel defined in `src`, by name: from the signature of
/// each `__global__` function, the per-type macros' signatures applied to each of their
/// uses.
pub fn parse_params(src: &str) -> Vec<(String, Vec<Param>)> {
    fn kinds(list: &str) -> Vec<Param> {
        list.split(',')
            .map(|p| p.replace('\\', " "))
            .filter(|p| !p.trim().is_empty())
            .map(|p| {
                if p.contains('*') {
                    Param::Ptr
                } else if p.contains("float") {
                    Param::F32
                } else {
                    Param::U32
                }
            })
            .collect()
    }
    // The parameter list after `void NAME(` up to the matching `)`.
    fn list_after(s: &str) -> Option<(&str, &str)> {
        let open = s.find('(')?;
        let close = s[open..].find(')')? + open;
        Some((s[..open].trim(), &s[open + 1..close]))
    }
    let mut out = Vec::new();
    let mut macros: Vec<(String, Vec<Param>)> = Vec::new();
    for chunk in src.split("__global__ void ").skip(1) {
        if let Some((name, list)) = list_after(chunk) {
            if name == "NAME" {
                continue;
            }
            out.push((name.to_string(), kinds(list)));
        }
    }
    for def in src.split("#define ").skip(1) {
        let Some(open) = def.find('(') else { continue };
        let mac = def[..open].trim().to_string();
        if let Some(sig) = def.split("__global__ void NAME").nth(1) {
            if let Some((_, list)) = list_after(sig) {
                macros.push((mac, kinds(list)));
            }
        }
    }
    for line in src.lines() {
        for (mac, params) in &macros {
            if let Some(rest) = line.strip_prefix(&format!("{mac}(")) {
                let name = rest.split(',').next().unwrap_or("").trim().to_string();
                out.push((name, params.clone()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `name` is defined as a kernel in `src`: directly (`void name(`) or through
    /// one of the per-type macros (`MACRO(name, decoder)`).
    fn defined(src: &str, name: &str) -> bool {
        src.contains(&format!("__global__ void {name}("))
            || ["EMBED", "MATVEC", "MMQ"]
                .iter()
                .any(|m| src.contains(&format!("\n{m}({name}, ")))
    }

    #[test]
    fn every_kernel_the_dispatcher_names_is_defined_in_the_sources() {
        let src = program();
        for k in Kernel::all() {
            let name = k.name().expect("listed kernels exist");
            assert!(
                defined(&src, &name),
                "{k:?}: no kernel '{name}' in the .cu sources"
            );
        }
        assert!(!defined(&src, "matvec_q4_0"));
    }

    #[test]
    fn the_sources_define_no_kernel_the_dispatcher_does_not_know() {
        let known: Vec<String> = Kernel::all().iter().map(|k| k.name().unwrap()).collect();
        let src = program();
        let mut found = Vec::new();
        for line in src.lines() {
            if let Some(rest) = line.split("__global__ void ").nth(1) {
                found.push(rest.split('(').next().unwrap_or("").to_string());
            }
            for m in ["EMBED(", "MATVEC(", "MMQ("] {
                if let Some(rest) = line.strip_prefix(m) {
                    found.push(rest.split(',').next().unwrap_or("").to_string());
                }
            }
        }
        // The macro bodies define `NAME` itself.
        found.retain(|n| n != "NAME");
        assert!(found.len() >= known.len(), "{found:?}");
        for f in &found {
            assert!(
                known.contains(f),
                "kernel '{f}' in the sources is never dispatched"
            );
        }
    }

    #[test]
    fn every_kernels_parameter_list_matches_its_cu_signature() {
        let parsed = parse_params(&program());
        for k in Kernel::all() {
            let name = k.name().unwrap();
            let found: Vec<_> = parsed.iter().filter(|(n, _)| *n == name).collect();
            assert_eq!(found.len(), 1, "{name}: {} signatures", found.len());
            assert_eq!(
                found[0].1,
                k.params(),
                "{name}: the dispatcher's parameter kinds"
            );
        }
    }

    #[test]
    fn the_signature_parser_reads_pointers_values_and_macros() {
        let src = "extern \"C\" __global__ void f(const float* a, u32 n, float s) {}\n\
                   #define M(NAME, D) \\\n extern \"C\" __global__ void NAME(u8* w, \\\n u32 k) {}\n\
                   M(g_q8, d)\n";
        let p = parse_params(src);
        assert_eq!(
            p[0],
            ("f".to_string(), vec![Param::Ptr, Param::U32, Param::F32])
        );
        assert_eq!(p[1], ("g_q8".to_string(), vec![Param::Ptr, Param::U32]));
    }

    #[test]
    fn types_without_a_decoder_are_named_errors() {
        let e = Kernel::MatVec(GgmlType::Q4_0).name().unwrap_err();
        assert!(e.contains("matvec") && e.contains("Q4_0"), "{e}");
        assert!(Kernel::Mmq(GgmlType::F16).name().is_err());
        assert_eq!(ActQuant::for_weight(GgmlType::Q4K), Some(ActQuant::Q8K));
        assert_eq!(ActQuant::for_weight(GgmlType::Q5_0), Some(ActQuant::Q8_0));
        assert_eq!(ActQuant::for_weight(GgmlType::F16), None);
        assert_eq!(ActQuant::for_weight(GgmlType::Iq4Nl), Some(ActQuant::Q8_0));
        assert_eq!(ActQuant::for_weight(GgmlType::Iq4Xs), Some(ActQuant::Q8K));
    }

    #[test]
    fn the_iq4_levels_are_the_cpu_table() {
        let src = program();
        let list = src
            .split("__constant__ i8 IQ4_LEVELS[16] = {")
            .nth(1)
            .and_then(|s| s.split('}').next())
            .expect("the IQ4 table in common.cu");
        let levels: Vec<i8> = list
            .split(',')
            .map(|v| v.trim().parse().expect("a level"))
            .collect();
        assert_eq!(levels, minfer_gguf::quant::KVALUES_IQ4NL);
    }
}

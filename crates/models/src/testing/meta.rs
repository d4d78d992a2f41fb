//! The tiny models' metadata and their byte-level BPE vocabulary.

use minfer_gguf::{GgufError, GgufWriter, MetaType, MetaValue};

use super::{
    TinySpec, CONTROL_TOKENS, TINY_GEMMA2_ATTN_CAP, TINY_GEMMA2_FINAL_CAP, TINY_GEMMA3_ROPE_BASE,
    TINY_GEMMA3_ROPE_FACTOR, TINY_GPT_OSS_ROPE_BASE, TINY_GPT_OSS_YARN, TINY_RMS_EPS,
    TINY_ROPE_FREQ_BASE,
};

/// The `general.*` and `{arch}.*` keys of the model `spec` describes.
pub(super) fn metadata(w: &mut GgufWriter, spec: &TinySpec) -> Result<(), GgufError> {
    let a = spec.arch;
    let u32_of = |key: &str, v: usize| {
        u32::try_from(v)
            .map(MetaValue::U32)
            .map_err(|_| GgufError::InvalidMeta {
                key: key.to_string(),
                reason: format!("{v} does not fit in u32"),
            })
    };
    w.add_meta("general.architecture", MetaValue::String(a.into()))
        .add_meta(
            "general.name",
            MetaValue::String(format!("minfer tiny {a} {}", spec.wtype)),
        );
    for (name, v) in [
        ("context_length", spec.n_ctx),
        ("embedding_length", spec.n_embd),
        ("block_count", spec.n_layer),
        ("feed_forward_length", spec.n_ff),
        ("attention.head_count", spec.n_head),
        ("attention.head_count_kv", spec.n_head_kv),
    ] {
        let key = format!("{a}.{name}");
        let v = u32_of(&key, v)?;
        w.add_meta(&key, v);
    }
    if a == "llama" {
        let key = format!("{a}.rope.dimension_count");
        let v = u32_of(&key, spec.head_dim)?;
        w.add_meta(&key, v);
    }
    if let Some(m) = &spec.moe {
        let mut keys = vec![
            ("expert_count", m.n_expert),
            ("expert_used_count", m.n_expert_used),
            ("expert_feed_forward_length", m.n_ff_exp),
        ];
        if matches!(a, "qwen2moe" | "qwen35moe" | "qwen3next") {
            keys.push(("expert_shared_feed_forward_length", m.n_ff_shexp));
        }
        for (name, v) in keys {
            let key = format!("{a}.{name}");
            let v = u32_of(&key, v)?;
            w.add_meta(&key, v);
        }
    }
    if let Some(ssm) = &spec.ssm {
        for (name, v) in [
            ("ssm.conv_kernel", ssm.d_conv),
            ("ssm.state_size", ssm.s),
            ("ssm.group_count", ssm.h_k),
            ("ssm.time_step_rank", ssm.h_v),
            ("ssm.inner_size", ssm.h_v * ssm.s),
            ("full_attention_interval", ssm.interval),
            ("rope.dimension_count", ssm.n_rot),
        ] {
            let key = format!("{a}.{name}");
            let v = u32_of(&key, v)?;
            w.add_meta(&key, v);
        }
        if a != "qwen3next" {
            w.add_meta(
                &format!("{a}.rope.dimension_sections"),
                MetaValue::Array(
                    MetaType::I32,
                    ssm.sections.iter().map(|&x| MetaValue::I32(x)).collect(),
                ),
            );
        }
    }
    if matches!(
        a,
        "qwen3" | "qwen3moe" | "qwen35" | "qwen35moe" | "qwen3next" | "gpt-oss"
    ) || a.starts_with("gemma")
    {
        for name in ["attention.key_length", "attention.value_length"] {
            let key = format!("{a}.{name}");
            let v = u32_of(&key, spec.head_dim)?;
            w.add_meta(&key, v);
        }
    }
    if let Some(win) = spec.sliding_window {
        let key = format!("{a}.attention.sliding_window");
        let v = u32_of(&key, win)?;
        w.add_meta(&key, v);
    }
    let rope_base = if a == "gemma3" {
        // Global layers: their own theta and a linear scaling the local ones ignore.
        w.add_meta(
            &format!("{a}.rope.scaling.type"),
            MetaValue::String("linear".into()),
        )
        .add_meta(
            &format!("{a}.rope.scaling.factor"),
            MetaValue::F32(TINY_GEMMA3_ROPE_FACTOR),
        );
        TINY_GEMMA3_ROPE_BASE
    } else if a == "gpt-oss" {
        let (factor, orig) = TINY_GPT_OSS_YARN;
        w.add_meta(
            &format!("{a}.rope.scaling.type"),
            MetaValue::String("yarn".into()),
        )
        .add_meta(&format!("{a}.rope.scaling.factor"), MetaValue::F32(factor))
        .add_meta(
            &format!("{a}.rope.scaling.original_context_length"),
            MetaValue::U32(orig),
        );
        TINY_GPT_OSS_ROPE_BASE
    } else {
        TINY_ROPE_FREQ_BASE
    };
    if a == "gemma2" {
        w.add_meta(
            &format!("{a}.attn_logit_softcapping"),
            MetaValue::F32(TINY_GEMMA2_ATTN_CAP),
        )
        .add_meta(
            &format!("{a}.final_logit_softcapping"),
            MetaValue::F32(TINY_GEMMA2_FINAL_CAP),
        );
    }
    w.add_meta(
        &format!("{a}.attention.layer_norm_rms_epsilon"),
        MetaValue::F32(TINY_RMS_EPS),
    )
    .add_meta(&format!("{a}.rope.freq_base"), MetaValue::F32(rope_base));
    Ok(())
}

/// GPT-2's byte-to-symbol map: printable bytes stand for themselves, the others are
/// shifted to code points 256.. in byte order.
fn byte_symbol(b: u8) -> char {
    let printable = |c: u8| (b'!'..=b'~').contains(&c) || (0xA1..=0xAC).contains(&c) || c >= 0xAE;
    if printable(b) {
        return char::from(b);
    }
    let shifted = (0..b).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + shifted).unwrap_or('?')
}

/// The byte-level BPE vocabulary of `n_vocab` tokens (see the module `testing`).
pub(super) fn tokenizer(w: &mut GgufWriter, n_vocab: usize, pre: &str) -> Result<(), GgufError> {
    let n_fill = n_vocab
        .checked_sub(256 + CONTROL_TOKENS.len())
        .ok_or_else(|| GgufError::InvalidMeta {
            key: "tokenizer.ggml.tokens".into(),
            reason: format!("n_vocab {n_vocab} is below the 259 byte and control tokens"),
        })?;
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_symbol(b).to_string()).collect();
    let mut merges = Vec::new();
    let letters: Vec<char> = ('a'..='z').collect();
    for i in 0..n_fill {
        // Two-letter tokens reachable through their merge; past 26*26 the fillers are
        // unreachable but still valid vocabulary entries.
        if i < letters.len() * letters.len() {
            let (x, y) = (letters[i / letters.len()], letters[i % letters.len()]);
            tokens.push(format!("{x}{y}"));
            merges.push(format!("{x} {y}"));
        } else {
            tokens.push(format!("[fill{i}]"));
        }
    }
    let mut types = vec![1i32; tokens.len()];
    tokens.extend(CONTROL_TOKENS.iter().map(|s| s.to_string()));
    types.extend([3i32; CONTROL_TOKENS.len()]);
    let id = |k: usize| (n_vocab - CONTROL_TOKENS.len() + k) as u32;
    let strings = |v: Vec<String>| {
        MetaValue::Array(
            MetaType::String,
            v.into_iter().map(MetaValue::String).collect(),
        )
    };
    w.add_meta("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
        .add_meta("tokenizer.ggml.pre", MetaValue::String(pre.into()))
        .add_meta("tokenizer.ggml.tokens", strings(tokens))
        .add_meta(
            "tokenizer.ggml.token_type",
            MetaValue::Array(
                MetaType::I32,
                types.into_iter().map(MetaValue::I32).collect(),
            ),
        )
        .add_meta("tokenizer.ggml.merges", strings(merges))
        .add_meta("tokenizer.ggml.bos_token_id", MetaValue::U32(id(0)))
        .add_meta("tokenizer.ggml.eos_token_id", MetaValue::U32(id(2)))
        .add_meta("tokenizer.ggml.padding_token_id", MetaValue::U32(id(0)))
        .add_meta("tokenizer.ggml.add_bos_token", MetaValue::Bool(false));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_symbols_are_the_gpt2_map() {
        assert_eq!(byte_symbol(b'a'), 'a');
        assert_eq!(byte_symbol(b' '), 'Ġ');
        assert_eq!(byte_symbol(b'\n'), 'Ċ');
        assert_eq!(byte_symbol(0), 'Ā');
        assert_eq!(byte_symbol(0xAD), 'Ń');
        let distinct: std::collections::BTreeSet<char> = (0..=255u8).map(byte_symbol).collect();
        assert_eq!(distinct.len(), 256);
    }
}

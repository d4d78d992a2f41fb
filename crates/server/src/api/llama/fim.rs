//! Fill-in-the-middle: the model's FIM tokens (`Fim`), and the layout of an `/infill`
//! prompt from its prefix, suffix and extra context chunks.

use minfer_gguf::GgufFile;
use minfer_tokenizer::Tokenizer;

/// The batch llama-server sizes its FIM window by: the prefix gets up to three quarters
/// of it, the suffix the rest (bounded by the slot's context here).
pub const FIM_BATCH: usize = 2048;

/// llama-server's repo name in the repo-level FIM pattern.
pub(super) const FIM_REPO_NAME: &str = "myproject\n";

/// llama-server's separator of extra chunks when the model has no file-separator token.
pub(super) const FIM_CHUNK_SEPARATOR: &str = "\n\n--- snippet ---\n\n";

/// The model's fill-in-the-middle tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fim {
    /// Starts the code before the hole (`<|fim_prefix|>`).
    pub pre: u32,
    /// Starts the code after the hole (`<|fim_suffix|>`).
    pub suf: u32,
    /// Asks for the middle (`<|fim_middle|>`).
    pub mid: u32,
    /// Starts the repository name of the repo-level pattern (`<|repo_name|>`).
    pub rep: Option<u32>,
    /// Starts each file of the repo-level pattern (`<|file_sep|>`).
    pub sep: Option<u32>,
}

/// Texts llama.cpp recognises for each FIM token when the GGUF names none.
pub(super) const FIM_TEXTS: [(&str, &[&str]); 5] = [
    (
        "pre",
        &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<PRE>",
            "▁<PRE>",
            "<|code_prefix|>",
        ],
    ),
    (
        "suf",
        &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<SUF>",
            "▁<SUF>",
            "<|code_suffix|>",
        ],
    ),
    (
        "mid",
        &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<MID>",
            "▁<MID>",
            "<|code_middle|>",
        ],
    ),
    (
        "rep",
        &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ],
    ),
    ("sep", &["<|file_sep|>", "<file_sep>"]),
];

impl Fim {
    /// The FIM tokens from `tokenizer.ggml.fim_*_token_id`, else found by their texts
    /// as llama.cpp does; why not, when the model lacks one of prefix, suffix, middle.
    pub fn find(gguf: &GgufFile, tok: &Tokenizer) -> Result<Fim, String> {
        let n_vocab = tok.n_vocab();
        let id = |name: &str, texts: &[&str]| -> Option<u32> {
            let key = format!("tokenizer.ggml.fim_{name}_token_id");
            let meta = gguf
                .get(&key)
                .and_then(|v| v.as_u64())
                .and_then(|v| u32::try_from(v).ok())
                .filter(|&v| (v as usize) < n_vocab);
            meta.or_else(|| texts.iter().find_map(|t| tok.token_id(t)))
        };
        let [pre, suf, mid, rep, sep] = FIM_TEXTS.map(|(name, texts)| id(name, texts));
        match (pre, suf, mid) {
            (Some(pre), Some(suf), Some(mid)) => Ok(Fim {
                pre,
                suf,
                mid,
                rep,
                sep,
            }),
            _ => {
                let missing: Vec<&str> = [("prefix", pre), ("suffix", suf), ("middle", mid)]
                    .iter()
                    .filter(|(_, t)| t.is_none())
                    .map(|(n, _)| *n)
                    .collect();
                Err(format!(
                    "the model has no fill-in-the-middle {} token (neither \
                     tokenizer.ggml.fim_*_token_id nor a known FIM token text); /infill needs \
                     a code model with FIM tokens, such as Qwen2.5-Coder",
                    missing.join(", ")
                ))
            }
        }
    }
}

/// One `input_extra` chunk: a file name and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraChunk {
    /// The file's name (llama-server's default is `tmp`).
    pub filename: String,
    /// The file's text.
    pub text: String,
}

/// The token layout of a fill-in-the-middle request, as llama-server's
/// `format_prompt_infill` builds it: with repo and file-separator tokens,
///
/// ```text
/// <REPO>myproject\n<SEP>{file 0}\n{text 0}...<SEP>filename\n
/// <PRE>{prefix}{prompt}<SUF>{suffix}<MID>
/// ```
///
/// (without them the extra chunks are joined by a snippet separator). The prefix keeps
/// its last `3/4 * batch` tokens, the suffix its first `batch/4 - (2 + prompt)`, and
/// the extra context keeps its last `extra_room` tokens; BOS, when the model asks for
/// it, goes between the extra context and `<PRE>`, where llama-server puts it.
#[allow(clippy::too_many_arguments)]
pub fn infill_layout(
    fim: &Fim,
    encode: impl Fn(&str) -> Vec<u32>,
    bos: Option<u32>,
    mut prefix: Vec<u32>,
    mut suffix: Vec<u32>,
    extra: &[ExtraChunk],
    prompt: &[u32],
    batch: usize,
    extra_room: usize,
) -> Vec<u32> {
    let mut extra_tokens = Vec::new();
    if let Some(rep) = fim.rep {
        extra_tokens.push(rep);
        extra_tokens.extend(encode(FIM_REPO_NAME));
    }
    for chunk in extra {
        match fim.sep {
            Some(sep) => {
                extra_tokens.push(sep);
                extra_tokens.extend(encode(&format!("{}\n", chunk.filename)));
            }
            None => extra_tokens.extend(encode(FIM_CHUNK_SEPARATOR)),
        }
        extra_tokens.extend(encode(&chunk.text));
    }
    if let Some(sep) = fim.sep {
        extra_tokens.push(sep);
        extra_tokens.extend(encode("filename\n"));
    }
    let prefix_take = prefix.len().min(3 * (batch / 4));
    let suffix_take = suffix
        .len()
        .min((batch / 4).saturating_sub(2 + prompt.len()));
    prefix.drain(..prefix.len() - prefix_take);
    suffix.truncate(suffix_take);
    let extra_take = extra_tokens.len().min(extra_room);
    let mut out = Vec::with_capacity(extra_take + prefix.len() + suffix.len() + prompt.len() + 4);
    out.extend_from_slice(&extra_tokens[extra_tokens.len() - extra_take..]);
    out.extend(bos);
    out.push(fim.pre);
    out.extend(prefix);
    out.extend_from_slice(prompt);
    out.push(fim.suf);
    out.extend(suffix);
    out.push(fim.mid);
    out
}

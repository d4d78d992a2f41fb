//! `minfer tokenize`: print the token ids (or id/piece pairs) of a text.

use anyhow::Context;
use minfer_gguf::GgufFile;
use minfer_tokenizer::Tokenizer;
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `minfer tokenize`.
#[derive(clap::Args)]
pub struct Args {
    /// Model: a GGUF path, a catalog name or an http(s) URL (default: the catalog default).
    #[arg(short = 'm', long = "model")]
    pub model: Option<String>,
    /// Parse special-token text such as `<|im_start|>` as single tokens.
    #[arg(long)]
    pub special: bool,
    /// Print one `ID 'PIECE'` pair per line instead of the ids on one line.
    #[arg(long)]
    pub pieces: bool,
    /// Read the text from this file (UTF-8) instead of the command line.
    #[arg(long, value_name = "FILE", conflicts_with = "text")]
    pub file: Option<PathBuf>,
    /// The text to tokenize.
    #[arg(required_unless_present = "file")]
    pub text: Option<String>,
}

/// Runs the subcommand. BOS/EOS are added where the model asks for them.
pub fn run(args: Args) -> anyhow::Result<()> {
    let text = match (&args.file, args.text) {
        (Some(path), _) => read_utf8(path)?,
        (None, Some(text)) => text,
        (None, None) => anyhow::bail!("give a TEXT or --file FILE"),
    };
    let path = minfer_hub::resolve_model(
        args.model.as_deref(),
        &super::common::EnvOptions::get().hub,
        true,
    )?;
    let file = GgufFile::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let tok = Tokenizer::from_gguf(&file)
        .with_context(|| format!("loading the tokenizer of {}", path.display()))?;
    let ids = tok.encode(&text, true, args.special);

    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if args.pieces {
        for &id in &ids {
            let piece = tok.token_bytes(id, true)?;
            writeln!(out, "{id} '{}'", escape_piece(piece))?;
        }
    } else {
        let line: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(out, "{}", line.join(" "))?;
    }
    out.flush()?;
    Ok(())
}

fn read_utf8(path: &PathBuf) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{} is not valid UTF-8: invalid byte at offset {}",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

/// A piece as a quotable one-line string: control characters, quotes and backslashes
/// escaped, bytes that are not (yet) UTF-8 as `\xNN`.
fn escape_piece(bytes: &[u8]) -> String {
    let mut s = String::new();
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\'' => s.push_str("\\'"),
                '\\' => s.push_str("\\\\"),
                c if c.is_control() => s.extend(c.escape_debug()),
                c => s.push(c),
            }
        }
        for b in chunk.invalid() {
            s.push_str(&format!("\\x{b:02x}"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::escape_piece;

    #[test]
    fn pieces_are_escaped_on_one_line() {
        assert_eq!(escape_piece(b"<|im_start|>"), "<|im_start|>");
        assert_eq!(escape_piece(b" it's\n"), " it\\'s\\n");
        assert_eq!(escape_piece(b"a\\b\t"), "a\\\\b\\t");
        assert_eq!(escape_piece(&[0xe4, 0xbd]), "\\xe4\\xbd");
        assert_eq!(escape_piece("日本".as_bytes()), "日本");
    }
}

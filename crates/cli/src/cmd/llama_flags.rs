//! llama-server's command-line spellings for `minfer serve`, so that a llama-server
//! command line starts minfer as it is: its single-dash long options (`-np 4`, `-ctk
//! q8_0`, `-fa on`) rewritten to their long forms before parsing, and the flags whose
//! behaviour minfer always has, or has no counterpart for, taken and reported.

use std::ffi::{OsStr, OsString};

/// llama-server's single-dash long options and the long option each stands for.
const SINGLE_DASH: [(&str, &str); 9] = [
    ("-np", "--parallel"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-fa", "--flash-attn"),
    ("-ngl", "--n-gpu-layers"),
    ("-md", "--model-draft"),
    ("-ub", "--ubatch-size"),
    ("-cb", "--cont-batching"),
    ("-to", "--timeout"),
];

/// `args` (the program's, the program name first) with llama-server's single-dash long
/// options after a `serve` subcommand written as their long forms (`-np` as
/// `--parallel`, `-ctk=q8_0` as `--cache-type-k=q8_0`), and llama-server's bare
/// `--slots` switch (the `/slots` route, which minfer serves unless `--no-slots`)
/// dropped, since minfer's `--slots` takes the slot count; everything else as it was.
pub fn rewrite(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut serving = false;
    let mut args = args.into_iter().peekable();
    while let Some(a) = args.next() {
        if !serving {
            serving = out.len() == 1 && a == "serve";
            out.push(a);
            continue;
        }
        let bare_switch = a == "--slots"
            && args
                .peek()
                .is_none_or(|next| next.to_str().is_some_and(|n| n.starts_with('-')));
        if !bare_switch {
            out.push(long_form(&a).unwrap_or(a));
        }
    }
    out
}

fn long_form(a: &OsStr) -> Option<OsString> {
    let s = a.to_str()?;
    let (flag, value) = match s.split_once('=') {
        Some((f, v)) => (f, Some(v)),
        None => (s, None),
    };
    let (_, long) = SINGLE_DASH.iter().find(|(short, _)| *short == flag)?;
    Some(match value {
        Some(v) => format!("{long}={v}").into(),
        None => OsString::from(long),
    })
}

/// llama-server flags `serve` takes for its command lines: each is what minfer always
/// does, or tunes something minfer sizes itself.
#[derive(clap::Args, Debug, Default)]
pub struct LlamaServerFlags {
    /// llama-server's switch for the embedding routes, which minfer always serves.
    #[arg(long = "embedding", visible_alias = "embeddings")]
    pub embedding: bool,
    /// llama-server's switch for `/metrics`, which minfer serves unless `--no-metrics`.
    #[arg(long = "metrics")]
    pub metrics: bool,
    /// llama-server's switch for Jinja chat templates, which minfer always renders.
    #[arg(long = "jinja")]
    pub jinja: bool,
    /// llama-server's continuous batching (`-cb`), which minfer always does.
    #[arg(long = "cont-batching")]
    pub cont_batching: bool,
    /// llama-server's switch for its web page; minfer has none.
    #[arg(long = "no-webui", visible_alias = "no-ui")]
    pub no_webui: bool,
    /// llama-server's flash attention (`-fa on|off|auto`); minfer's attention is always
    /// its tiled one, so any value runs the same.
    #[arg(long = "flash-attn", num_args = 0..=1, default_missing_value = "on", value_parser = ["on", "off", "auto"])]
    pub flash_attn: Option<String>,
    /// Layers on the GPU (`-ngl`): 0 runs on the CPU backend, as llama-server does; any
    /// other count leaves the choice of backend to `--backend` (minfer puts a model
    /// whole on one backend).
    #[arg(long = "n-gpu-layers", visible_alias = "gpu-layers")]
    pub n_gpu_layers: Option<String>,
    /// llama-server's logical and physical batch sizes (`-b`, `-ub`): minfer sizes its
    /// prefill chunks itself, so the values are taken and have no effect.
    #[arg(short = 'b', long = "batch-size")]
    pub batch_size: Option<u32>,
    /// See `--batch-size`.
    #[arg(long = "ubatch-size")]
    pub ubatch_size: Option<u32>,
}

impl LlamaServerFlags {
    /// The backend `-ngl` asks for: `cpu` for 0 layers, else none.
    pub fn backend(&self) -> Option<&'static str> {
        (self.n_gpu_layers.as_deref().map(str::trim) == Some("0")).then_some("cpu")
    }

    /// A note for each flag given that changes nothing here, for stderr.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        let mut taken = |given: bool, what: &str| {
            if given {
                notes.push(format!("note: {what}"));
            }
        };
        taken(
            self.batch_size.is_some() || self.ubatch_size.is_some(),
            "--batch-size and --ubatch-size have no effect: minfer sizes its prefill chunks itself",
        );
        taken(
            self.flash_attn.as_deref() == Some("off"),
            "--flash-attn off has no effect: minfer's attention is always its tiled one",
        );
        taken(
            self.n_gpu_layers.is_some() && self.backend().is_none(),
            "--n-gpu-layers only chooses the CPU backend (with 0); minfer runs a model whole on the backend --backend allows",
        );
        notes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(v: &[OsString]) -> Vec<&str> {
        v.iter().map(|a| a.to_str().unwrap()).collect()
    }

    #[test]
    fn single_dash_long_options_after_serve_become_long_ones() {
        let args = [
            "minfer",
            "serve",
            "-m",
            "x.gguf",
            "-np",
            "4",
            "-ctk=q8_0",
            "-fa",
            "on",
            "-n",
            "8",
            "-ngl",
            "0",
        ];
        let out = rewrite(args.iter().map(OsString::from));
        assert_eq!(
            strs(&out),
            [
                "minfer",
                "serve",
                "-m",
                "x.gguf",
                "--parallel",
                "4",
                "--cache-type-k=q8_0",
                "--flash-attn",
                "on",
                "-n",
                "8",
                "--n-gpu-layers",
                "0"
            ]
        );
        // llama-server's bare `--slots` switch goes; minfer's `--slots N` stays.
        let slots = [
            "minfer", "serve", "--slots", "--no-ui", "--slots", "3", "--slots",
        ];
        let out = rewrite(slots.iter().map(OsString::from));
        assert_eq!(strs(&out), ["minfer", "serve", "--no-ui", "--slots", "3"]);
        // Other subcommands keep their own short options.
        let bench = ["minfer", "bench", "-np", "1"];
        let out = rewrite(bench.iter().map(OsString::from));
        assert_eq!(strs(&out), bench);
    }

    #[test]
    fn zero_gpu_layers_is_the_cpu_backend() {
        let f = |n: &str| LlamaServerFlags {
            n_gpu_layers: Some(n.into()),
            ..LlamaServerFlags::default()
        };
        assert_eq!(f("0").backend(), Some("cpu"));
        assert_eq!(f("99").backend(), None);
        assert_eq!(f("all").notes().len(), 1);
        assert!(f("0").notes().is_empty());
    }
}

//! `minfer info`.

/// Arguments of `minfer info`.
#[derive(clap::Args)]
pub struct Args {
    /// Model: a GGUF path, a catalog name or an http(s) URL (default: the catalog default).
    #[arg(short = 'm', long = "model")]
    pub model: Option<String>,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("not implemented yet")
}

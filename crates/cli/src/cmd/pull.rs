//! `minfer pull`.

use minfer_hub::{catalog, presence, Presence};

use super::common::EnvOptions;

/// Arguments of `minfer pull`.
#[derive(clap::Args)]
pub struct Args {
    /// Catalog name or http(s) URL of a GGUF file (default: the catalog's default model).
    pub name: Option<String>,
    /// Print the catalog (name, size, whether present, description) instead of pulling.
    #[arg(long, conflicts_with = "name")]
    pub list: bool,
}

/// Runs the subcommand: pulls (or verifies) the model and prints its path on stdout.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.list {
        print_catalog();
        return Ok(());
    }
    let path = minfer_hub::pull(args.name.as_deref(), &EnvOptions::get().hub, true)?;
    println!("{}", path.display());
    Ok(())
}

fn print_catalog() {
    let store = &EnvOptions::get().hub.store;
    println!(
        "{:<20} {:>9}  {:<10}  DESCRIPTION",
        "NAME", "SIZE", "STATUS"
    );
    for entry in catalog() {
        let status = match presence(entry, store) {
            Presence::Verified => "present",
            // Right size but not yet hashed: the next use verifies it.
            Presence::Unverified => "unverified",
            Presence::Absent => "absent",
        };
        let size = format!("{:.1} MB", entry.size as f64 / 1e6);
        println!(
            "{:<20} {size:>9}  {status:<10}  {}",
            entry.name, entry.description
        );
    }
    println!("store: {}", store.dir().display());
}

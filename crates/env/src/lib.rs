//! Every `MINFER_*` environment variable minfer reads, in one table, read through one rule.
//!
//! The rule: an unset or empty variable (after trimming surrounding whitespace) means the
//! default. Otherwise a [`Flag`] must be `0` or `1`, a [`Choice`] one of its listed values
//! (ASCII case-insensitive), and a [`Path`] or [`List`] any non-empty value. Anything else
//! is an [`EnvError`] naming the variable, the value and what is accepted, so a typo never
//! silently selects the default. [`check_all`] validates the whole table at once, which the
//! command line does at startup, before it resolves the variables into the libraries'
//! options.
//!
//! This crate has no dependencies, so every crate that reads a variable can depend on it.

use std::ffi::OsString;
use std::fmt;

/// A variable set to a value outside what it accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvError {
    /// The variable, e.g. `MINFER_ISA`.
    pub name: &'static str,
    /// The value found (lossily decoded when it is not UTF-8).
    pub value: String,
    /// What the variable accepts, in words.
    pub accepted: String,
}

impl fmt::Display for EnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid environment variable {}={:?}: accepted values are {} (or unset it)",
            self.name, self.value, self.accepted
        )
    }
}

impl std::error::Error for EnvError {}

/// The raw value of `name`: `None` when unset, empty or only whitespace.
fn raw(name: &str) -> Option<OsString> {
    std::env::var_os(name).filter(|v| !v.to_string_lossy().trim().is_empty())
}

/// The value as trimmed UTF-8, or an error naming `name` when it is not UTF-8.
fn text_of(
    name: &'static str,
    v: Option<OsString>,
    accepted: &str,
) -> Result<Option<String>, EnvError> {
    match v {
        None => Ok(None),
        Some(v) => match v.into_string() {
            Ok(s) => Ok(Some(s.trim().to_string())),
            Err(v) => Err(EnvError {
                name,
                value: v.to_string_lossy().into_owned(),
                accepted: accepted.to_string(),
            }),
        },
    }
}

/// An on/off switch: `0` or `1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flag {
    /// The variable's name.
    pub name: &'static str,
    /// What setting it to 1 does, for the documentation table.
    pub effect: &'static str,
}

impl Flag {
    /// `Some(true)` for `1`, `Some(false)` for `0`, `None` when unset or empty.
    pub fn get(&self) -> Result<Option<bool>, EnvError> {
        self.parse(raw(self.name))
    }

    /// The flag's value, `default` when unset or empty.
    pub fn get_or(&self, default: bool) -> Result<bool, EnvError> {
        Ok(self.get()?.unwrap_or(default))
    }

    /// [`Self::get`] over a given raw value (`None`: unset), without the environment.
    pub fn parse(&self, v: Option<OsString>) -> Result<Option<bool>, EnvError> {
        let v = v.filter(|v| !v.to_string_lossy().trim().is_empty());
        match text_of(self.name, v, "0 and 1")?.as_deref() {
            None => Ok(None),
            Some("0") => Ok(Some(false)),
            Some("1") => Ok(Some(true)),
            Some(other) => Err(EnvError {
                name: self.name,
                value: other.to_string(),
                accepted: "0 and 1".into(),
            }),
        }
    }
}

/// One value out of a fixed list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// The variable's name.
    pub name: &'static str,
    /// The accepted values, lowercase.
    pub values: &'static [&'static str],
    /// What each value does, for the documentation table.
    pub effect: &'static str,
}

impl Choice {
    /// The listed value the variable names (case-insensitive), `None` when unset or empty.
    pub fn get(&self) -> Result<Option<&'static str>, EnvError> {
        self.parse(raw(self.name))
    }

    /// [`Self::get`] over a given raw value (`None`: unset), without the environment.
    pub fn parse(&self, v: Option<OsString>) -> Result<Option<&'static str>, EnvError> {
        let v = v.filter(|v| !v.to_string_lossy().trim().is_empty());
        let accepted = self.values.join(", ");
        let Some(s) = text_of(self.name, v, &accepted)? else {
            return Ok(None);
        };
        match self.values.iter().find(|c| c.eq_ignore_ascii_case(&s)) {
            Some(c) => Ok(Some(c)),
            None => Err(EnvError {
                name: self.name,
                value: s,
                accepted,
            }),
        }
    }
}

/// A file-system path or program name: any non-empty value, not necessarily UTF-8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path {
    /// The variable's name.
    pub name: &'static str,
    /// What it points at, for the documentation table.
    pub effect: &'static str,
}

impl Path {
    /// The value as given (not trimmed: a path may end in a space), `None` when unset or
    /// empty.
    pub fn get(&self) -> Option<OsString> {
        raw(self.name)
    }
}

/// Free text whose syntax another crate checks (e.g. a comma-separated list of names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct List {
    /// The variable's name.
    pub name: &'static str,
    /// What the accepted items are, in words.
    pub accepted: &'static str,
    /// What it does, for the documentation table.
    pub effect: &'static str,
}

impl List {
    /// The trimmed UTF-8 value, `None` when unset or empty.
    pub fn get(&self) -> Result<Option<String>, EnvError> {
        text_of(self.name, raw(self.name), self.accepted)
    }
}

/// `MINFER_HOME`: the store root.
pub const HOME: Path = Path {
    name: "MINFER_HOME",
    effect: "where models are stored (`$MINFER_HOME/models`); default `~/.cache/minfer`",
};

/// `MINFER_PYTHON`: the interpreter that runs pip for catalog pulls.
pub const PYTHON: Path = Path {
    name: "MINFER_PYTHON",
    effect: "the Python interpreter that fetches catalog models with pip; default `python3`",
};

/// `MINFER_BACKENDS`: the backend fence when `--backend` is not given.
pub const BACKENDS: List = List {
    name: "MINFER_BACKENDS",
    accepted: "a comma-separated list of backend names (cpu, metal, cuda, wgpu)",
    effect: "restricts execution to these backends, as `--backend` does",
};

/// `MINFER_ISA`: caps the CPU kernels chosen at run time.
pub const ISA: Choice = Choice {
    name: "MINFER_ISA",
    values: &["avx2", "scalar"],
    effect: "caps the CPU kernels chosen at run time (same results, only the speed changes)",
};

/// `MINFER_BATCH`: forces batched decoding of concurrent sequences on or off.
pub const BATCH: Flag = Flag {
    name: "MINFER_BATCH",
    effect: "forces batched decoding of concurrent sequences on (1) or off (0); default on",
};

/// `MINFER_REPACK`: the repacked matmul weight layout.
pub const REPACK: Flag = Flag {
    name: "MINFER_REPACK",
    effect: "0 keeps weights in their file layout instead of the repacked one; default 1",
};

/// `MINFER_FUSE`: the CPU decode fusions.
pub const FUSE: Choice = Choice {
    name: "MINFER_FUSE",
    values: &["0", "1", "qkv", "ffn"],
    effect: "the CPU decode fusions: 0 none (default), 1 both, qkv or ffn only that one (same results, only the speed changes)",
};

/// `MINFER_PROFILE`: per-op wall time.
pub const PROFILE: Flag = Flag {
    name: "MINFER_PROFILE",
    effect: "1 accumulates per-op wall time (`minfer bench` prints it)",
};

/// `MINFER_GRAPH_TRACE`: graph placement traces.
pub const GRAPH_TRACE: Flag = Flag {
    name: "MINFER_GRAPH_TRACE",
    effect: "1 prints each new graph's splits and why each node landed where it did",
};

/// `MINFER_TRACE`: the per-node trace file `minfer run` writes.
pub const TRACE: Path = Path {
    name: "MINFER_TRACE",
    effect: "`minfer run` records every node's output statistics and a sample of its values per step, and writes them to this file (the `minfer-trace` JSON `minfer viz --trace` opens)",
};

/// `MINFER_REGEN_CORPUS`: rewrites the GGUF reader's committed test corpus.
pub const REGEN_CORPUS: Flag = Flag {
    name: "MINFER_REGEN_CORPUS",
    effect: "1 makes the GGUF corpus test rewrite its committed files (development only)",
};

/// `MINFER_WGPU_API`: the graphics API the wgpu backend asks for an adapter.
pub const WGPU_API: Choice = Choice {
    name: "MINFER_WGPU_API",
    values: &["vulkan", "metal", "dx12"],
    effect: "the graphics API the wgpu backend looks for adapters on; default every native one",
};

/// `MINFER_WGPU_TESTS`: the explicit opt-out of the wgpu tests on a machine without an
/// adapter (without it they fail there, never skip silently).
pub const WGPU_TESTS: Choice = Choice {
    name: "MINFER_WGPU_TESTS",
    values: &["skip"],
    effect: "`skip` skips the wgpu backend's tests, saying so, where no adapter is found",
};

/// `MINFER_CUDA_GRAPHS`: CUDA Graph capture and replay of the CUDA backend's splits.
pub const CUDA_GRAPHS: Flag = Flag {
    name: "MINFER_CUDA_GRAPHS",
    effect: "0 makes the CUDA backend launch every kernel directly instead of replaying captured CUDA Graphs; default 1",
};

/// `MINFER_CUDA_TESTS`: makes the CUDA backend's device tests fail where no device is
/// found (without it they skip there, saying so).
pub const CUDA_TESTS: Choice = Choice {
    name: "MINFER_CUDA_TESTS",
    values: &["require"],
    effect: "`require` makes the CUDA device tests fail instead of skipping where no CUDA device is usable",
};

/// One entry of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Var {
    /// An on/off switch.
    Flag(Flag),
    /// One value out of a list.
    Choice(Choice),
    /// A path or program name.
    Path(Path),
    /// Free text checked by its reader.
    List(List),
}

impl Var {
    /// The variable's name.
    pub fn name(&self) -> &'static str {
        match self {
            Var::Flag(v) => v.name,
            Var::Choice(v) => v.name,
            Var::Path(v) => v.name,
            Var::List(v) => v.name,
        }
    }
}

/// Every variable minfer reads.
pub const ALL: &[Var] = &[
    Var::Path(HOME),
    Var::Path(PYTHON),
    Var::List(BACKENDS),
    Var::Choice(ISA),
    Var::Flag(BATCH),
    Var::Flag(REPACK),
    Var::Choice(FUSE),
    Var::Flag(PROFILE),
    Var::Flag(GRAPH_TRACE),
    Var::Path(TRACE),
    Var::Flag(REGEN_CORPUS),
    Var::Choice(WGPU_API),
    Var::Choice(WGPU_TESTS),
    Var::Flag(CUDA_GRAPHS),
    Var::Choice(CUDA_TESTS),
];

/// Validates every variable of [`ALL`]; the first bad one is the error.
pub fn check_all() -> Result<(), EnvError> {
    for v in ALL {
        match v {
            Var::Flag(f) => f.get().map(drop)?,
            Var::Choice(c) => c.get().map(drop)?,
            Var::Path(_) => {}
            Var::List(l) => l.get().map(drop)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn some(s: &str) -> Option<OsString> {
        Some(s.into())
    }

    #[test]
    fn flags_accept_zero_and_one_and_name_anything_else() {
        assert_eq!(BATCH.parse(None), Ok(None));
        assert_eq!(BATCH.parse(some("  ")), Ok(None));
        assert_eq!(BATCH.parse(some("1")), Ok(Some(true)));
        assert_eq!(BATCH.parse(some(" 0 ")), Ok(Some(false)));
        for bad in ["yes", "true", "2", "on", "01"] {
            let e = PROFILE.parse(some(bad)).unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains("MINFER_PROFILE") && msg.contains(bad) && msg.contains("0 and 1"),
                "{msg}"
            );
        }
    }

    #[test]
    fn choices_accept_only_their_values() {
        assert_eq!(ISA.parse(None), Ok(None));
        assert_eq!(ISA.parse(some("avx2")), Ok(Some("avx2")));
        assert_eq!(ISA.parse(some(" SCALAR")), Ok(Some("scalar")));
        let e = ISA.parse(some("bogus")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid environment variable MINFER_ISA=\"bogus\": accepted values are avx2, scalar (or unset it)"
        );
    }

    #[cfg(unix)]
    #[test]
    fn non_utf8_values_are_refused_by_name() {
        use std::os::unix::ffi::OsStringExt;
        let v = OsString::from_vec(vec![b'a', 0xff]);
        let e = ISA.parse(Some(v.clone())).unwrap_err();
        assert_eq!(e.name, "MINFER_ISA");
        assert!(REPACK.parse(Some(v)).is_err());
    }

    #[test]
    fn the_table_names_each_variable_once() {
        let mut names: Vec<&str> = ALL.iter().map(Var::name).collect();
        assert!(names.iter().all(|n| n.starts_with("MINFER_")));
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n);
    }

    #[test]
    fn the_readme_lists_every_variable() {
        let readme = include_str!("../../../README.md");
        for v in ALL {
            let row = format!("| `{}` |", v.name());
            assert!(
                readme.contains(&row),
                "README.md has no table row for {}",
                v.name()
            );
        }
    }
}

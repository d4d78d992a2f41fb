//! Importance matrices as llama.cpp's `llama-imatrix` writes them and llama-quantize reads
//! them: per weight matrix, the mean square of each input column over a calibration text,
//! which the encoders take as per-column importance weights.
//!
//! Two formats are read:
//! - GGUF (llama-imatrix's default): per matrix `NAME.in_sum2` (F32, the column sums of
//!   squared activations, one row per expert) and `NAME.counts` (F32, the activation rows
//!   seen, one per expert), plus the keys `imatrix.datasets`, `imatrix.chunk_count` and
//!   `imatrix.chunk_size`, all three required. A weight is `in_sum2 / round(count)`, and 1
//!   for an expert that saw no token.
//! - the legacy `.dat` file (`--output-format dat`): an `i32` entry count, then per entry an
//!   `i32`-prefixed name, the `i32` call count `ncall`, an `i32` value count and the values
//!   (already means, times `ncall`), then optionally the `i32` chunk count and an
//!   `i32`-prefixed dataset name. A weight is `value / ncall` (the value when `ncall` is 0).
//!
//! A file that does not begin with the GGUF magic is read as legacy, as llama-quantize does.

use anyhow::{bail, Context, Result};
use minfer_gguf::{GgmlType, GgufFile, MetaValue, TensorInfo};
use std::collections::BTreeMap;
use std::path::Path;

/// The per-column weights of each matrix the calibration run saw, with its provenance.
#[derive(Debug, Default)]
pub struct Imatrix {
    /// Weights by tensor name: `n_per_row * n_expert` values, expert by expert.
    pub entries: BTreeMap<String, Vec<f32>>,
    /// The calibration texts (the first is recorded in the quantized file).
    pub datasets: Vec<String>,
    /// Chunks of text the matrix was computed on (0 when the file does not say).
    pub chunk_count: u32,
}

impl Imatrix {
    /// Reads `path` in either format; bad files are refused naming the problem and entry.
    pub fn load(path: &Path) -> Result<Imatrix> {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let m = if bytes.starts_with(b"GGUF") {
            let f = GgufFile::from_bytes(bytes)
                .with_context(|| format!("{} is not a readable GGUF file", path.display()))?;
            from_gguf(&f)
        } else {
            from_legacy(&bytes)
        }
        .with_context(|| format!("bad importance matrix {}", path.display()))?;
        Ok(m)
    }

    /// Keeps the entries whose names contain one of `include` (all when empty), then drops
    /// those containing one of `exclude` (llama-quantize's `--include-weights` and
    /// `--exclude-weights`; as there, exclusion applies first, which gives the same set).
    pub fn filter(&mut self, include: &[String], exclude: &[String]) {
        self.entries.retain(|name, _| {
            !exclude.iter().any(|e| name.contains(e.as_str()))
                && (include.is_empty() || include.iter().any(|i| name.contains(i.as_str())))
        });
    }

    /// The weights for `t`, or `None` when the matrix has no entry. An entry whose length is
    /// not `ne0 * ne2` is refused (llama-quantize's rule: it would weight the wrong
    /// columns), except for the token embedding, which is quantized without (`Ok(None)`).
    pub fn weights_for(&self, t: &TensorInfo) -> Result<Option<&[f32]>> {
        let Some(w) = self.entries.get(&t.name) else {
            return Ok(None);
        };
        let ne0 = t.dims.first().copied().unwrap_or(1);
        let ne2 = t.dims.get(2).copied().unwrap_or(1);
        let want = ne0.saturating_mul(ne2);
        if w.len() as u64 == want {
            return Ok(Some(w));
        }
        if t.name == "token_embd.weight" || t.name == "per_layer_token_embd.weight" {
            return Ok(None);
        }
        bail!(
            "the importance matrix has {} values for {}, which needs {want} ({ne0} columns x {ne2} experts)",
            w.len(),
            t.name
        )
    }
}

/// Refuses NaN and infinite weights, naming the entry.
fn check_finite(name: &str, w: &[f32]) -> Result<()> {
    if let Some((i, v)) = w.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        bail!("entry {name}: weight {i} is {v} (not finite)");
    }
    Ok(())
}

fn f32_values(f: &GgufFile, t: &TensorInfo) -> Result<Vec<f32>> {
    if t.ggml_type != GgmlType::F32 {
        bail!("tensor {} is {}, not F32", t.name, t.ggml_type);
    }
    Ok(f.tensor_data(t)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

fn from_gguf(f: &GgufFile) -> Result<Imatrix> {
    if f.tensors().is_empty() {
        bail!("no tensors");
    }
    let keys = [
        "imatrix.datasets",
        "imatrix.chunk_count",
        "imatrix.chunk_size",
    ];
    if let Some(k) = keys.iter().find(|k| f.get(k).is_none()) {
        bail!("missing metadata key {k} (not an importance matrix written by llama-imatrix?)");
    }
    let mut m = Imatrix::default();
    if let Some(a) = f.get("imatrix.datasets").and_then(MetaValue::as_array) {
        m.datasets = a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
    }
    m.chunk_count = match f.get("imatrix.chunk_count") {
        Some(MetaValue::U32(n)) => *n,
        _ => bail!("imatrix.chunk_count is not a u32"),
    };
    let mut pairs: BTreeMap<&str, (Option<&TensorInfo>, Option<&TensorInfo>)> = BTreeMap::new();
    for t in f.tensors() {
        if let Some(n) = t.name.strip_suffix(".in_sum2") {
            pairs.entry(n).or_default().0 = Some(t);
        } else if let Some(n) = t.name.strip_suffix(".counts") {
            pairs.entry(n).or_default().1 = Some(t);
        }
    }
    for (name, pair) in pairs {
        let (Some(sums), Some(counts)) = pair else {
            bail!("entry {name} has in_sum2 without counts or counts without in_sum2");
        };
        let sums = f32_values(f, sums)?;
        let counts = f32_values(f, counts)?;
        if counts.is_empty() || !sums.len().is_multiple_of(counts.len()) {
            bail!(
                "entry {name}: {} sums do not split into {} experts",
                sums.len(),
                counts.len()
            );
        }
        check_finite(&format!("{name}.in_sum2"), &sums)?;
        check_finite(&format!("{name}.counts"), &counts)?;
        let ne0 = sums.len() / counts.len();
        let mut w = Vec::with_capacity(sums.len());
        for (row, &c) in sums.chunks_exact(ne0).zip(&counts) {
            // llama.cpp stores counts as floats, reads them back rounded to integers and
            // divides by that integer as a float.
            let count = c.round() as i64 as f32;
            if count > 0.0 {
                w.extend(row.iter().map(|s| s / count));
            } else {
                w.extend(std::iter::repeat_n(1.0, ne0));
            }
        }
        check_finite(name, &w)?;
        m.entries.insert(name.to_string(), w);
    }
    if m.entries.is_empty() {
        bail!("no NAME.in_sum2 / NAME.counts tensor pairs");
    }
    Ok(m)
}

/// A little-endian reader over the legacy file that names what it was reading when the
/// bytes ran out.
struct Cursor<'a> {
    b: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if self.b.len() < n {
            bail!("file ends inside {} (truncated?)", what());
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }

    fn i32(&mut self, what: &dyn Fn() -> String) -> Result<i32> {
        let b = self.take(4, what)?;
        Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let len = self.i32(what)?;
        let len = usize::try_from(len).map_err(|_| anyhow::anyhow!("{}: length {len}", what()))?;
        let b = self.take(len, what)?;
        Ok(String::from_utf8_lossy(b).into_owned())
    }
}

fn from_legacy(bytes: &[u8]) -> Result<Imatrix> {
    let mut c = Cursor { b: bytes };
    let n = c.i32(&|| "the entry count".into())?;
    // An entry takes at least 16 bytes (name length, call count, value count, one value):
    // a count the file cannot hold means it is something else.
    if n < 1 || n as usize > c.b.len() / 16 {
        bail!(
            "neither GGUF nor a legacy importance matrix (it would hold {n} entries in {} bytes)",
            bytes.len()
        );
    }
    let mut m = Imatrix::default();
    for i in 0..n {
        let name = c.string(&|| format!("the name of entry {}", i + 1))?;
        let what = || format!("entry {name}");
        let ncall = c.i32(&what)?;
        let nval = c.i32(&what)?;
        if nval < 1 {
            bail!("entry {name}: {nval} values");
        }
        let raw = c.take(nval as usize * 4, &what)?;
        let div = if ncall > 0 { ncall as f32 } else { 1.0 };
        let w: Vec<f32> = raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .map(|v| if ncall > 0 { v / div } else { v })
            .collect();
        check_finite(&name, &w)?;
        m.entries.insert(name, w);
    }
    if !c.b.is_empty() {
        let chunks = c.i32(&|| "the chunk count".into())?;
        m.chunk_count = chunks.max(0) as u32;
        let ds = c.string(&|| "the dataset name".into())?;
        if !ds.is_empty() {
            m.datasets.push(ds);
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_gguf::GgufWriter;

    fn legacy(entries: &[(&str, i32, &[f32])], trailer: Option<(i32, &str)>) -> Vec<u8> {
        let mut b = (entries.len() as i32).to_le_bytes().to_vec();
        for (name, ncall, v) in entries {
            b.extend((name.len() as i32).to_le_bytes());
            b.extend(name.as_bytes());
            b.extend(ncall.to_le_bytes());
            b.extend((v.len() as i32).to_le_bytes());
            v.iter().for_each(|x| b.extend(x.to_le_bytes()));
        }
        if let Some((n, ds)) = trailer {
            b.extend(n.to_le_bytes());
            b.extend((ds.len() as i32).to_le_bytes());
            b.extend(ds.as_bytes());
        }
        b
    }

    fn gguf(tensors: &[(&str, &[u64], &[f32])], meta: bool) -> GgufFile {
        let mut w = GgufWriter::new();
        if meta {
            let ds = MetaValue::Array(
                minfer_gguf::MetaType::String,
                vec![MetaValue::String("calib.txt".into())],
            );
            w.add_meta("imatrix.datasets", ds);
            w.add_meta("imatrix.chunk_count", MetaValue::U32(3));
            w.add_meta("imatrix.chunk_size", MetaValue::U32(64));
        }
        for (name, dims, v) in tensors {
            let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            w.add_tensor_bytes(name, dims, GgmlType::F32, bytes)
                .unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf");
        w.write_to(&p).unwrap();
        GgufFile::from_bytes(std::fs::read(&p).unwrap()).unwrap()
    }

    #[test]
    fn gguf_sums_are_divided_by_each_experts_count() {
        let f = gguf(
            &[
                (
                    "blk.0.ffn_up_exps.weight.in_sum2",
                    &[2, 3],
                    &[2., 4., 9., 3., 5., 7.],
                ),
                ("blk.0.ffn_up_exps.weight.counts", &[1, 3], &[2., 3., 0.]),
            ],
            true,
        );
        let m = from_gguf(&f).unwrap();
        assert_eq!(
            m.entries["blk.0.ffn_up_exps.weight"],
            [1., 2., 3., 1., 1., 1.]
        );
        assert_eq!(
            (m.datasets.as_slice(), m.chunk_count),
            (&["calib.txt".to_string()][..], 3)
        );
    }

    #[test]
    fn bad_gguf_matrices_are_refused_by_name() {
        let e = |f: &GgufFile| format!("{:#}", from_gguf(f).unwrap_err());
        let f = gguf(
            &[("a.in_sum2", &[2], &[1., 1.]), ("a.counts", &[1], &[1.])],
            false,
        );
        assert!(e(&f).contains("imatrix.datasets"), "{}", e(&f));
        let f = gguf(&[("a.in_sum2", &[2], &[1., 1.])], true);
        assert!(e(&f).contains("entry a"), "{}", e(&f));
        let f = gguf(
            &[
                ("a.in_sum2", &[3], &[1., 1., 1.]),
                ("a.counts", &[2], &[1., 1.]),
            ],
            true,
        );
        assert!(e(&f).contains("do not split"), "{}", e(&f));
        let f = gguf(
            &[
                ("a.in_sum2", &[2], &[1., f32::NAN]),
                ("a.counts", &[1], &[1.]),
            ],
            true,
        );
        assert!(e(&f).contains("a.in_sum2: weight 1 is NaN"), "{}", e(&f));
    }

    #[test]
    fn legacy_values_are_divided_by_the_call_count() {
        let b = legacy(
            &[("x", 4, &[8., 2.]), ("y", 0, &[3.])],
            Some((5, "wiki.txt")),
        );
        let m = from_legacy(&b).unwrap();
        assert_eq!(m.entries["x"], [2., 0.5]);
        assert_eq!(m.entries["y"], [3.]);
        assert_eq!((m.chunk_count, m.datasets[0].as_str()), (5, "wiki.txt"));
        // The trailer is optional.
        let m = from_legacy(&legacy(&[("x", 1, &[1.])], None)).unwrap();
        assert_eq!(m.chunk_count, 0);
    }

    #[test]
    fn bad_legacy_files_are_refused_by_name() {
        let b = legacy(&[("blk.0.attn_q.weight", 4, &[8., 2.])], None);
        let e = format!("{:#}", from_legacy(&b[..b.len() - 1]).unwrap_err());
        assert!(
            e.contains("entry blk.0.attn_q.weight") && e.contains("truncated"),
            "{e}"
        );
        let e = format!("{:#}", from_legacy(b"text").unwrap_err());
        assert!(e.contains("neither GGUF nor"), "{e}");
        let b = legacy(&[("q", 1, &[f32::INFINITY])], None);
        assert!(format!("{:#}", from_legacy(&b).unwrap_err()).contains("entry q"));
    }

    #[test]
    fn weights_match_the_tensor_shape_or_are_refused() {
        let mut m = Imatrix::default();
        m.entries
            .insert("blk.0.ffn_up_exps.weight".into(), vec![1.0; 8 * 4]);
        m.entries.insert("token_embd.weight".into(), vec![1.0; 3]);
        m.entries.insert("blk.0.attn_q.weight".into(), vec![1.0; 3]);
        let t = |name: &str, dims: &[u64]| TensorInfo {
            name: name.into(),
            dims: dims.to_vec(),
            ggml_type: GgmlType::F32,
            offset: 0,
            n_bytes: 0,
        };
        let w = m
            .weights_for(&t("blk.0.ffn_up_exps.weight", &[8, 16, 4]))
            .unwrap();
        assert_eq!(w.map(<[f32]>::len), Some(32));
        assert!(m
            .weights_for(&t("token_embd.weight", &[8, 16]))
            .unwrap()
            .is_none());
        assert!(m
            .weights_for(&t("output.weight", &[8, 16]))
            .unwrap()
            .is_none());
        let e = m
            .weights_for(&t("blk.0.attn_q.weight", &[8, 8]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("3 values for blk.0.attn_q.weight"), "{e}");
        m.filter(&["blk.0".into()], &["attn".into()]);
        assert_eq!(
            m.entries.keys().collect::<Vec<_>>(),
            ["blk.0.ffn_up_exps.weight"]
        );
    }
}

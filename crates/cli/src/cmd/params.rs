//! The parameter summary `minfer info` prints for a model minfer can load: the total,
//! the parameters one token uses, and a mixture of experts' geometry.

use minfer_gguf::GgufFile;
use serde_json::{json, Value};
use std::fmt::Write as _;

/// What a loadable model's graph reads.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSummary {
    /// Elements of every weight the graph references (a tied head counted once).
    pub total: u64,
    /// Elements one token's forward pass uses (routed experts: only the chosen ones).
    pub active: u64,
    /// The routed experts, for a mixture of experts.
    pub moe: Option<minfer_models::MoeParams>,
}

impl ParamSummary {
    /// The summary of `file`, or `None` when minfer cannot load it as a model (the rest
    /// of the report still describes the file).
    pub fn of(file: &GgufFile) -> Option<Self> {
        let model = minfer_models::load_model(file).ok()?;
        let total = model
            .weights()
            .iter()
            .map(|w| (w.shape[0] * w.shape[1]) as u64)
            .sum();
        Some(ParamSummary {
            total,
            active: model.active_params(),
            moe: model.hparams().moe.clone(),
        })
    }

    /// The report's lines.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "\nparameters:");
        let _ = writeln!(
            s,
            "  total             {} ({})",
            self.total,
            count(self.total)
        );
        let pct = 100.0 * self.active as f64 / self.total.max(1) as f64;
        let _ = writeln!(
            s,
            "  active per token  {} ({}, {pct:.1}%)",
            self.active,
            count(self.active)
        );
        if let Some(m) = &self.moe {
            let _ = writeln!(s, "  experts           {}", m.n_expert);
            let _ = writeln!(s, "  experts used      {}", m.n_expert_used);
            let _ = writeln!(s, "  expert FFN        {}", m.n_ff_exp);
        }
        s
    }

    /// The report's `parameters` object.
    pub fn json(&self) -> Value {
        let experts = self.moe.as_ref().map_or(Value::Null, |m| {
            json!({
                "count": m.n_expert,
                "used": m.n_expert_used,
                "feed_forward_length": m.n_ff_exp,
            })
        });
        json!({ "total": self.total, "active_per_token": self.active, "experts": experts })
    }
}

/// A parameter count in thousands, millions or billions.
fn count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2} B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.2} M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1} K", n as f64 / 1e3),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_gguf::GgmlType;
    use minfer_models::testing::{tiny_model_bytes, TinySpec};

    fn summary(spec: &TinySpec) -> ParamSummary {
        let f = GgufFile::from_bytes(tiny_model_bytes(spec).unwrap()).unwrap();
        ParamSummary::of(&f).unwrap()
    }

    /// A dense model uses all its parameters; a mixture of experts its router, its
    /// attention and the chosen experts' share of the stacked ones.
    #[test]
    fn active_parameters_count_only_the_chosen_experts() {
        let dense = summary(&TinySpec::qwen3(GgmlType::F32, 1));
        assert_eq!(dense.active, dense.total);
        assert!(dense.moe.is_none());
        let spec = TinySpec::qwen3moe(GgmlType::F32, 1);
        let m = spec.moe.clone().unwrap();
        let s = summary(&spec);
        let per_expert = (3 * spec.n_embd * m.n_ff_exp) as u64;
        let unused = spec.n_layer as u64 * per_expert * (m.n_expert - m.n_expert_used) as u64;
        assert_eq!(s.total - s.active, unused);
        let text = s.text();
        assert!(text.contains("experts           8\n"), "{text}");
        assert!(text.contains("experts used      2\n"), "{text}");
        assert_eq!(s.json()["experts"]["used"], 2);
        assert_eq!(count(3_300_000_000), "3.30 B");
    }
}

//! Graphviz export (§8.1): nodes filled by backend, inputs and outputs double-circled.

use std::fmt::Write as _;

use crate::ir::{Backend, ComputeGraph};

fn fill(b: Option<Backend>) -> &'static str {
    match b {
        Some(Backend::CPU) => "lightyellow",
        Some(Backend::METAL) => "lightblue",
        Some(Backend::CUDA) => "lightgreen",
        _ => "white",
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

impl ComputeGraph {
    /// The graph as a Graphviz `digraph`.
    pub fn to_dot(&self) -> String {
        let mut s = String::from("digraph minfer {\n  rankdir=TB;\n  node [style=filled];\n");
        for n in &self.nodes {
            let boundary = self.inputs.contains(&n.id) || self.outputs.contains(&n.id);
            let shape = if boundary { "doublecircle" } else { "box" };
            let dead = if self.is_dead(n.id) {
                ", style=\"filled,dashed\""
            } else {
                ""
            };
            let _ = writeln!(
                s,
                "  n{} [label=\"{}\\n{}\", shape={shape}, fillcolor={}{dead}];",
                n.id,
                escape(&n.name),
                n.op.name(),
                fill(n.backend)
            );
        }
        for n in &self.nodes {
            for &src in &n.src {
                let _ = writeln!(s, "  n{src} -> n{};", n.id);
            }
        }
        s.push_str("}\n");
        s
    }

    /// Writes `to_dot` to `w`.
    pub fn dump_dot(&self, w: &mut dyn std::io::Write) -> std::io::Result<()> {
        w.write_all(self.to_dot().as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use crate::builder::GraphBuilder;
    use crate::ir::*;

    #[test]
    fn dot_colors_by_backend_and_marks_boundaries() {
        let mut b = GraphBuilder::new();
        let x = b.input("x", [2, 1, 1, 1], DType::F32);
        let y = b.silu(x);
        let z = b.add(y, x);
        b.set_backend(x, Backend::CPU);
        b.set_backend(y, Backend::METAL);
        b.set_backend(z, Backend::CUDA);
        b.output(z);
        let mut g = b.build();
        g.nodes.push(CNode {
            id: 3,
            name: "q\"uote".into(),
            op: Op::Silu,
            src: vec![2],
            out_shape: [2, 1, 1, 1],
            out_dtype: DType::F32,
            backend: None,
            meta: NodeMeta::None,
        });
        let dot = g.to_dot();
        assert!(dot.contains("n0 [label=\"x\\ninput\", shape=doublecircle, fillcolor=lightyellow]"));
        assert!(dot.contains("shape=box, fillcolor=lightblue"));
        assert!(
            dot.contains("n2 [label=\"add_2\\nadd\", shape=doublecircle, fillcolor=lightgreen]")
        );
        assert!(dot.contains("q\\\"uote\\nsilu\", shape=box, fillcolor=white"));
        assert!(
            dot.contains("n0 -> n1;") && dot.contains("n1 -> n2;") && dot.contains("n0 -> n2;")
        );
    }
}

//! Graph export (§8): Graphviz DOT and the visualizer's JSON (with import).

pub mod dot;
pub mod json;

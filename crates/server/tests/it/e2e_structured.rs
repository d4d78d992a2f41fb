//! Structured output and tool calls through the official `openai` Python client against
//! the server with the real default model (scripts/e2e_structured.py): JSON schemas of
//! increasing difficulty validated with `jsonschema`, streaming and not, greedy
//! determinism, llama-server's `grammar` and `json_schema` fields, a schema that does not
//! compile, and tool calls (required, named, streamed, and a round trip with a `tool`
//! message).

use crate::common;

#[test]
fn openai_python_client_gets_valid_structured_output_and_tool_calls() {
    common::python::run_client_script("e2e_structured.py", "openai, jsonschema", 1);
}

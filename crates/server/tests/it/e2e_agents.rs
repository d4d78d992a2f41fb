//! Anthropic's Messages API through the official `anthropic` Python client and OpenAI's
//! Responses API through the official `openai` client, against the server with the
//! real default model (scripts/e2e_anthropic.py, scripts/e2e_responses.py): text, JSON
//! schemas and tool calls with their results, streamed and not.

use crate::common;

#[test]
fn anthropic_python_client_runs_a_tool_conversation_streamed_and_not() {
    common::python::run_client_script("e2e_anthropic.py", "anthropic, jsonschema", 1);
}

#[test]
fn openai_python_client_drives_the_responses_api() {
    common::python::run_client_script("e2e_responses.py", "openai, jsonschema", 1);
}

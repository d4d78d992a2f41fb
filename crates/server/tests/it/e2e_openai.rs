//! The official `openai` Python client against the server with the real default model
//! (scripts/e2e_openai.py).

use crate::common;

#[test]
fn openai_python_client_chats_and_completes() {
    common::python::run_client_script("e2e_openai.py", "openai", 2);
}

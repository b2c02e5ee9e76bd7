//! The official OpenAI and Anthropic Python SDKs against the server (`tests/sdk/clients.py`):
//! chat (streamed and not, `n`, log-probabilities, a JSON-schema answer, a strict tool call),
//! Responses, completions, models, Anthropic Messages, and the SDKs' typed errors.
//!
//! Needs a Python with `openai` and `anthropic` in `DEEPINFER_SDK_PYTHON` (`.ci/run`
//! installs one and sets `DEEPINFER_REQUIRE_SDK=1`, which makes a missing one a failure).
#![cfg(feature = "server")]

mod http;

use deepinfer_engine::runtime::EngineConfig;
use deepinfer_engine::server::ServerConfig;
use std::process::Command;

#[test]
fn official_python_sdks_talk_to_the_server() {
    let python = match std::env::var("DEEPINFER_SDK_PYTHON") {
        Ok(p) => p,
        Err(_) => {
            assert!(
                std::env::var_os("DEEPINFER_REQUIRE_SDK").is_none(),
                "DEEPINFER_REQUIRE_SDK is set but DEEPINFER_SDK_PYTHON is not"
            );
            eprintln!("skipped: DEEPINFER_SDK_PYTHON is not set (see .ci/setup-python-sdk.sh)");
            return;
        }
    };
    let s = http::start(EngineConfig::default(), 64, ServerConfig::default());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/clients.py");
    let out = Command::new(&python)
        .arg(script)
        .arg(format!("http://{}", s.addr))
        .output()
        .expect("python runs");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the SDK checks failed");
    assert!(text.contains("sdk: all checks passed"));
}

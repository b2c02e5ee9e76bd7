//! Packaging smoke test: the crate links and reports the workspace version.

#[test]
fn version_matches_manifest() {
    assert_eq!(deepinfer_sample::VERSION, env!("CARGO_PKG_VERSION"));
}

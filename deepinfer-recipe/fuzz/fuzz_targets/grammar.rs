//! Any bytes as a JSON schema, regex or EBNF grammar (first byte picks),
//! compiled and walked: a typed error or a matcher, never a panic (the body
//! is shared with the smoke test).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../examples/fuzz_driver/bodies.rs"]
mod bodies;

fuzz_target!(|data: &[u8]| {
    bodies::grammar(data);
});

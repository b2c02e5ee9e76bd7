//! A few hundred inputs through the fuzz bodies (the long run is
//! `examples/fuzz_driver`): random bytes and token streams never panic.

mod common;

#[path = "../examples/fuzz_driver/bodies.rs"]
mod bodies;

#[test]
fn fuzz_bodies_survive_random_inputs() {
    let tokenizer = common::tokenizer();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let golden = common::golden_requests();
    for round in 0..200 {
        let mut body = golden[round % golden.len()]["request"]
            .to_string()
            .into_bytes();
        let cut = (next() as usize) % (body.len() + 1);
        body.truncate(cut);
        if let Some(byte) = body.last_mut() {
            *byte ^= (next() & 0x7F) as u8;
        }
        bodies::request_parsing(&body, &tokenizer);
        let stream: Vec<u8> = (0..(next() % 600)).map(|_| next() as u8).collect();
        bodies::stream_parser(&stream, &tokenizer);
    }
}

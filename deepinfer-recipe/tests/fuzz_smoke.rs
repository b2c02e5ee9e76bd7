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

#[test]
fn grammar_body_survives_mutated_grammars() {
    let seeds = [
        "\u{0}{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\", \"minimum\": -5, \"maximum\": 70}, \"s\": {\"type\": \"string\", \"pattern\": \"^a(b|c)*$\"}}}",
        "\u{0}{\"type\": \"integer\", \"exclusiveMinimum\": 9}",
        "\u{1}[a-z]+@[0-9]{2,}",
        "\u{2}root ::= \"(\" root \")\" | [0-9]+",
        // Recursive grammars (the pushdown path).
        "\u{2}root ::= a\na ::= b \"x\" | \"y\" | \"(\" a \")\"\nb ::= a \"z\" | \"w\"",
        "\u{2}root ::= root \"+\" a | a\na ::= \"x\" | \"[\" root? \"]\"",
        "\u{0}{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"c\":{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}},\"d\":{}},\"required\":[\"v\"]}",
    ];
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for round in 0..120 {
        let mut data = seeds[round % seeds.len()].as_bytes().to_vec();
        if round >= seeds.len() {
            let at = 1 + (next() as usize) % (data.len() - 1);
            let alphabet = b"{}[]()\"\\^$*+?|-09az:,";
            data[at] = alphabet[(next() as usize) % alphabet.len()];
            data.truncate(data.len() - (next() as usize) % 4);
        }
        bodies::grammar(&data);
    }
}

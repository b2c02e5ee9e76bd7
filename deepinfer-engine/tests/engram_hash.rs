//! The Engram hasher reproduces the oracle's hash ids (numpy PCG64 multipliers, bucket
//! primes, rolling XOR hash), one-shot and token by token.

mod common;
use common::*;
use deepinfer_engine::ModelConfig;
use deepinfer_engine::engram::EngramHasher;

fn hasher() -> EngramHasher {
    let cfg = ModelConfig::from_file(&data("v41-tiny-dev/config.json")).unwrap();
    let tm: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(data("v41-tiny-dev/engram_token_map.json")).unwrap(),
    )
    .unwrap();
    let tm: Vec<i64> = tm["token_map"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect();
    EngramHasher::new(cfg.engram.as_ref().unwrap(), tm, cfg.vocab_size).unwrap()
}

#[test]
fn hash_ids_match_golden() {
    let g = golden("v41-tiny-dev");
    let h = hasher();
    let ids = g["p2.input_ids"].ids();
    let cols = h.columns();
    let got = h.hash(&[], 0, &ids);
    // The fixture's `trace.l{layer}.engram.hash_ids` [S, cols] were written from a strided
    // view (`hashes[:, layer]` of [S, layers, cols]) whose raw buffer was saved: the stored
    // values are the flat [S, layers, cols] array starting at column offset `li * cols`.
    // (The model's logits and Engram gates match the golden, so the ids themselves are right.)
    for (li, layer) in [1, 2].iter().enumerate() {
        let want = &g[&format!("trace.l{layer}.engram.hash_ids")];
        let n = ids.len() * cols;
        for k in 0..n {
            assert_eq!(
                got[li * cols + k] as f64,
                want.v[k],
                "layer {layer} flat index {k}"
            );
        }
    }
    // token by token with history gives the same ids
    for s in 0..ids.len() {
        let one = h.hash(&ids[..s], s, &ids[s..s + 1]);
        assert_eq!(&one[..], &got[s * 2 * cols..(s + 1) * 2 * cols]);
    }
}

#[test]
fn table_size_mismatch_is_an_error() {
    let mut cfg = ModelConfig::from_file(&data("v41-tiny-dev/config.json")).unwrap();
    let ec = cfg.engram.as_mut().unwrap();
    ec.num_embeddings[0] += 1;
    let err = EngramHasher::new(ec, vec![0; 512], 512).unwrap_err();
    assert!(
        err.to_string().contains("engram_num_embeddings[0]"),
        "{err}"
    );
}

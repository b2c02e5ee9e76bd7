//! The weight bytes of a batch-1 decode step (`Model::decode_bytes`), checked against the
//! shapes of the f32 fixtures.

mod common;

#[test]
fn decode_bytes_count_the_head_the_chosen_experts_and_one_row() {
    for dir in ["v4-tiny-dev", "v41-tiny-dev"] {
        let m = common::load(dir);
        let c = &m.cfg;
        let b = m.decode_bytes();
        let (d, v) = (c.hidden_size as f64, c.vocab_size as f64);
        assert_eq!(b.head, v * d * 4.0, "{dir}: head");
        let expert = 3.0 * c.moe_intermediate_size as f64 * d * 4.0;
        let moe_layers = c.num_layers as f64;
        assert_eq!(
            b.routed_experts,
            moe_layers * c.num_experts_per_tok as f64 * expert,
            "{dir}: routed experts"
        );
        let engram = c.engram.as_ref().map_or(0.0, |e| {
            let orders = (e.max_ngram_size - 1) * e.n_heads;
            e.layer_ids.len() as f64 * orders as f64 * e.head_dim as f64 * 4.0
        });
        assert_eq!(b.rows, d * 4.0 + engram, "{dir}: rows");
        // Every layer reads its attention and shared expert at least.
        let shared = 3.0 * c.moe_intermediate_size as f64 * d * 4.0;
        assert!(b.dense > moe_layers * shared, "{dir}: dense {}", b.dense);
        assert_eq!(b.total(), b.head + b.dense + b.routed_experts + b.rows);
    }
}

//! Property tests: any chunking of a prompt gives the one-shot logits; any mix of sequences in
//! one batch gives each its solo logits bit for bit; name canonicalisation is idempotent.

mod common;
use common::*;
use deepinfer_engine::names::canonical_name;
use deepinfer_engine::{BatchItem, Logits};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn any_chunking_matches_one_shot(cuts in proptest::collection::vec(1usize..12, 1..8), v41 in any::<bool>()) {
        let dir = if v41 { "v41-tiny-dev" } else { "v4-tiny-dev" };
        let m = load(dir);
        let g = golden(dir);
        let ids = g["p2.input_ids"].ids();
        let mut st = m.new_state();
        let mut got = Vec::new();
        let mut at = 0;
        let mut k = 0;
        while at < ids.len() {
            let n = cuts[k % cuts.len()].min(ids.len() - at);
            let mut it = [BatchItem { state: &mut st, tokens: &ids[at..at + n] }];
            got.extend(m.forward(&mut it, Logits::All, None).unwrap().remove(0));
            at += n;
            k += 1;
        }
        let d = max_diff(&got, &g["p2.logits"].v);
        prop_assert!(d < 1e-4, "{} chunks {:?}: {:.3e}", dir, cuts, d);
    }

    #[test]
    fn batch_mates_never_change_a_row(split in 1usize..32, other in 1usize..20) {
        let m = load("v41-tiny-dev");
        let g = golden("v41-tiny-dev");
        let a = g["p2.input_ids"].ids();
        let b = g["p3.input_ids"].ids();
        // alone
        let mut s1 = m.new_state();
        let mut it = [BatchItem { state: &mut s1, tokens: &a[..split] }];
        m.forward(&mut it, Logits::All, None).unwrap();
        let mut it = [BatchItem { state: &mut s1, tokens: &a[split..] }];
        let alone = m.forward(&mut it, Logits::All, None).unwrap().remove(0);
        // with a batch-mate prefilling `other` tokens at the same time
        let mut s2 = m.new_state();
        let mut it = [BatchItem { state: &mut s2, tokens: &a[..split] }];
        m.forward(&mut it, Logits::All, None).unwrap();
        let mut s3 = m.new_state();
        let mut items = [
            BatchItem { state: &mut s3, tokens: &b[..other] },
            BatchItem { state: &mut s2, tokens: &a[split..] },
        ];
        let both = m.forward(&mut items, Logits::All, None).unwrap();
        prop_assert!(both[1] == alone);
    }

    #[test]
    fn canonical_names_are_idempotent(layer in 0usize..64, which in 0usize..6) {
        let hf = [
            "self_attn.q_a_proj.weight",
            "mlp.gate.e_score_correction_bias",
            "attn_hc.fn",
            "self_attn.compressor.indexer.kv_norm.weight",
            "mlp.shared_experts.down_proj.weight",
            "input_layernorm.weight",
        ][which];
        let c = canonical_name(&format!("model.layers.{layer}.{hf}"));
        let prefix = format!("layers.{layer}.");
        prop_assert!(c.starts_with(&prefix), "{}", c);
        prop_assert_eq!(canonical_name(&c), c);
    }
}

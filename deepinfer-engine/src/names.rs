//! Tensor names: everything is keyed by DeepSeek's upstream checkpoint names
//! (`embed.weight`, `layers.N.attn.wq_a.weight`, `layers.N.ffn.experts.E.w1.weight`, ...).
//! Hugging Face module names (`model.layers.N.self_attn.q_a_proj.weight`, ...) are renamed
//! on load. HF's fused expert tensors keep a marker name and are split by the loader.

/// Canonical name of HF's fused `[E, 2I, D]` gate/up expert tensor of a layer prefix.
pub const FUSED_GATE_UP: &str = "ffn.experts.@gate_up";
/// Canonical name of HF's fused `[E, D, I]` down expert tensor of a layer prefix.
pub const FUSED_DOWN: &str = "ffn.experts.@down";

const GLOBAL: &[(&str, &str)] = &[
    ("model.embed_tokens.weight", "embed.weight"),
    ("lm_head.weight", "head.weight"),
    ("model.norm.weight", "norm.weight"),
    ("model.hc_head.hc_fn", "hc_head_fn"),
    ("model.hc_head.hc_base", "hc_head_base"),
    ("model.hc_head.hc_scale", "hc_head_scale"),
];

// Longer, more specific HF suffixes first: the first match wins.
const LAYER: &[(&str, &str)] = &[
    ("input_layernorm.weight", "attn_norm.weight"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
    ("attn_hc.fn", "hc_attn_fn"),
    ("attn_hc.base", "hc_attn_base"),
    ("attn_hc.scale", "hc_attn_scale"),
    ("ffn_hc.fn", "hc_ffn_fn"),
    ("ffn_hc.base", "hc_ffn_base"),
    ("ffn_hc.scale", "hc_ffn_scale"),
    (
        "self_attn.compressor.indexer.kv_proj.weight",
        "attn.indexer.compressor.wkv.weight",
    ),
    (
        "self_attn.compressor.indexer.gate_proj.weight",
        "attn.indexer.compressor.wgate.weight",
    ),
    (
        "self_attn.compressor.indexer.position_bias",
        "attn.indexer.compressor.ape",
    ),
    (
        "self_attn.compressor.indexer.kv_norm.weight",
        "attn.indexer.compressor.norm.weight",
    ),
    (
        "self_attn.compressor.indexer.q_b_proj.weight",
        "attn.indexer.wq_b.weight",
    ),
    (
        "self_attn.compressor.indexer.scorer.weights_proj.weight",
        "attn.indexer.weights_proj.weight",
    ),
    (
        "self_attn.compressor.kv_proj.weight",
        "attn.compressor.wkv.weight",
    ),
    (
        "self_attn.compressor.gate_proj.weight",
        "attn.compressor.wgate.weight",
    ),
    ("self_attn.compressor.position_bias", "attn.compressor.ape"),
    (
        "self_attn.compressor.kv_norm.weight",
        "attn.compressor.norm.weight",
    ),
    ("self_attn.q_a_proj.weight", "attn.wq_a.weight"),
    ("self_attn.q_a_norm.weight", "attn.q_norm.weight"),
    ("self_attn.q_b_proj.weight", "attn.wq_b.weight"),
    ("self_attn.kv_proj.weight", "attn.wkv.weight"),
    ("self_attn.kv_norm.weight", "attn.kv_norm.weight"),
    // transformers 5.24's save_pretrained keeps upstream module names under `model.` but
    // spells the main attention's KV norm `attn.norm`.
    ("attn.norm.weight", "attn.kv_norm.weight"),
    ("self_attn.o_a_proj.weight", "attn.wo_a.weight"),
    ("self_attn.o_b_proj.weight", "attn.wo_b.weight"),
    ("self_attn.sinks", "attn.attn_sink"),
    ("mlp.gate.weight", "ffn.gate.weight"),
    ("mlp.gate.e_score_correction_bias", "ffn.gate.bias"),
    ("mlp.gate.tid2eid", "ffn.gate.tid2eid"),
    (
        "mlp.shared_experts.gate_proj.weight",
        "ffn.shared_experts.w1.weight",
    ),
    (
        "mlp.shared_experts.up_proj.weight",
        "ffn.shared_experts.w3.weight",
    ),
    (
        "mlp.shared_experts.down_proj.weight",
        "ffn.shared_experts.w2.weight",
    ),
    ("mlp.experts.gate_up_proj", FUSED_GATE_UP),
    ("mlp.experts.down_proj", FUSED_DOWN),
];

/// The upstream name of a stored tensor name; upstream names come back unchanged.
/// A `.weight_scale_inv` suffix (HF's FP8 scale spelling) becomes `.scale`.
pub fn canonical_name(stored: &str) -> String {
    let stored = match stored.strip_suffix(".weight_scale_inv") {
        Some(base) => {
            return format!(
                "{}.scale",
                canonical_name(&format!("{base}.weight")).trim_end_matches(".weight")
            );
        }
        None => stored,
    };
    for (hf, up) in GLOBAL {
        if stored == *hf {
            return (*up).to_string();
        }
    }
    if let Some(rest) = stored.strip_prefix("model.layers.")
        && let Some((idx, suffix)) = rest.split_once('.')
    {
        for (hf, up) in LAYER {
            if suffix == *hf {
                return format!("layers.{idx}.{up}");
            }
        }
        return format!("layers.{idx}.{suffix}");
    }
    stored.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_names_map_to_upstream() {
        assert_eq!(canonical_name("model.embed_tokens.weight"), "embed.weight");
        assert_eq!(canonical_name("lm_head.weight"), "head.weight");
        assert_eq!(
            canonical_name(
                "model.layers.3.self_attn.compressor.indexer.scorer.weights_proj.weight"
            ),
            "layers.3.attn.indexer.weights_proj.weight"
        );
        assert_eq!(
            canonical_name("model.layers.0.attn_hc.fn"),
            "layers.0.hc_attn_fn"
        );
        assert_eq!(
            canonical_name("model.layers.2.mlp.gate.e_score_correction_bias"),
            "layers.2.ffn.gate.bias"
        );
        assert_eq!(
            canonical_name("layers.2.attn.wq_a.weight"),
            "layers.2.attn.wq_a.weight"
        );
        assert_eq!(
            canonical_name("model.layers.4.attn.norm.weight"),
            "layers.4.attn.kv_norm.weight"
        );
        assert_eq!(
            canonical_name("model.layers.4.attn.compressor.norm.weight"),
            "layers.4.attn.compressor.norm.weight"
        );
        assert_eq!(
            canonical_name("model.layers.1.self_attn.q_a_proj.weight_scale_inv"),
            "layers.1.attn.wq_a.scale"
        );
    }
}

//! Config parsing: all three spellings, defaults, and one clear error per bad field.

mod common;
use common::data;
use deepinfer_engine::config::{AttnKind, ConfigError, ModelConfig, ModelKind};
use serde_json::{Value, json};

fn v41() -> Value {
    serde_json::from_str(&std::fs::read_to_string(data("v41-tiny-dev/config.json")).unwrap())
        .unwrap()
}

fn v4() -> Value {
    serde_json::from_str(&std::fs::read_to_string(data("v4-tiny-dev/config.json")).unwrap())
        .unwrap()
}

#[test]
fn v41_hf_and_inference_names_agree() {
    let hf = ModelConfig::from_json(&v41()).unwrap();
    let ds = ModelConfig::from_file(&data("v41-tiny-dev/inference_config.json")).unwrap();
    assert_eq!(hf.kind, ModelKind::V41);
    assert_eq!(hf.num_layers, 8);
    assert_eq!(hf.compress_ratios, vec![0, 0, 2, 2, 1, 1, 1, 1]);
    assert_eq!(hf.attn_kinds[2], AttnKind::Shared);
    assert_eq!(hf.kv_source_layers, vec![2, 4]);
    assert_eq!(hf.candidate_source_layer, Some(4));
    assert_eq!(hf.dspark.as_ref().unwrap().target_layer_ids, vec![5, 6, 7]);
    // The inference config lacks eos ids and HF-only keys; everything the graph uses agrees.
    let mut ds2 = ds.clone();
    ds2.eos_token_id = hf.eos_token_id;
    assert_eq!(ds2, hf);
}

#[test]
fn v4_layer_types_and_legacy_keys_agree() {
    let hf = ModelConfig::from_json(&v4()).unwrap();
    assert_eq!(hf.kind, ModelKind::V4);
    assert_eq!(hf.compress_ratios, vec![0, 4, 16, 4, 0]);
    assert_eq!(hf.hash_moe, vec![true, true, false, false, false]);
    assert_eq!(hf.rope_dim, 16);
    // legacy upstream spelling of the same model
    let mut legacy = v4();
    let o = legacy.as_object_mut().unwrap();
    o.remove("layer_types");
    o.remove("mlp_layer_types");
    o.remove("rope_parameters");
    o.remove("compress_rates");
    o.insert("compress_ratios".into(), json!([0, 4, 128, 4, 0, 0]));
    o.insert("num_hash_layers".into(), json!(2));
    o.insert(
        "rope_scaling".into(),
        json!({"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1}),
    );
    let lg = ModelConfig::from_json(&legacy).unwrap();
    assert_eq!(lg.compress_ratios, vec![0, 4, 128, 4, 0]);
    assert_eq!(lg.hash_moe, hf.hash_moe);
    assert_eq!(lg.yarn, hf.yarn);
    assert_eq!(lg.compress_rope_theta, hf.compress_rope_theta);
}

fn err_of(v: Value) -> ConfigError {
    ModelConfig::from_json(&v).unwrap_err()
}

#[test]
fn missing_and_invalid_fields_are_named() {
    let mut c = v41();
    c["text_config"]
        .as_object_mut()
        .unwrap()
        .remove("hidden_size");
    assert_eq!(err_of(c), ConfigError::Missing("hidden_size".into()));

    let mut c = v41();
    c["text_config"]["compress_ratios"] = json!([0, 0, 4, 2, 1, 1, 1, 1]);
    assert!(matches!(err_of(c), ConfigError::Invalid { field, .. } if field == "compress_ratios"));

    let mut c = v41();
    c["text_config"]["kv_source_layer_ids"] = json!([4]);
    assert!(
        matches!(err_of(c), ConfigError::Invalid { field, .. } if field == "kv_source_layer_ids")
    );

    let mut c = v41();
    c["text_config"]["num_attention_heads"] = json!("four");
    assert!(
        matches!(err_of(c), ConfigError::Invalid { field, .. } if field == "num_attention_heads")
    );

    let mut c = v4();
    c["layer_types"][1] = json!("dense_attention");
    assert!(matches!(err_of(c), ConfigError::Invalid { field, .. } if field == "layer_types"));

    let mut c = v4();
    c["rope_parameters"]["compress"]
        .as_object_mut()
        .unwrap()
        .remove("factor");
    assert_eq!(
        err_of(c),
        ConfigError::Missing("rope_parameters.compress.factor".into())
    );
}

#[test]
fn unknown_model_type_is_rejected() {
    let mut c = v4();
    c["model_type"] = json!("llama");
    assert_eq!(err_of(c), ConfigError::UnknownModelType("llama".into()));
    assert!(matches!(
        ModelConfig::from_json_str("{not json"),
        Err(ConfigError::Json(_))
    ));
}

#[test]
fn model_dir_with_only_deepseek_inference_config_loads() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("inference")).unwrap();
    std::fs::copy(
        data("v41-tiny-dev/inference_config.json"),
        dir.path().join("inference/config.json"),
    )
    .unwrap();
    for f in ["model.safetensors", "engram_token_map.json"] {
        std::fs::copy(data(&format!("v41-tiny-dev/{f}")), dir.path().join(f)).unwrap();
    }
    let m = deepinfer_engine::Model::load(dir.path(), common::backend()).unwrap();
    let g = common::golden("v41-tiny-dev");
    let ids = g["p1.input_ids"].ids();
    let d = common::max_diff(&common::chunked(&m, &ids, ids.len()), &g["p1.logits"].v);
    assert!(d < 1e-4, "{d:.3e}");
}

#[test]
fn weight_block_size_is_read_from_quantization_config() {
    let mut v = v41();
    assert_eq!(ModelConfig::from_json(&v).unwrap().weight_block_size, None);
    v["quantization_config"] = json!({"quant_method": "fp8", "weight_block_size": [32, 32]});
    assert_eq!(
        ModelConfig::from_json(&v).unwrap().weight_block_size,
        Some([32, 32])
    );
    for bad in [
        json!([32]),
        json!([0, 32]),
        json!("32"),
        json!([32, 32, 1]),
        json!([-1, 2]),
    ] {
        v["quantization_config"]["weight_block_size"] = bad.clone();
        let e = ModelConfig::from_json(&v).unwrap_err();
        assert!(
            matches!(&e, ConfigError::Invalid { field, .. } if field == "quantization_config.weight_block_size"),
            "{bad}: {e}"
        );
    }
}

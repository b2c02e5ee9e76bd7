//! Model configuration: one validated [`ModelConfig`] from any of the three spellings a
//! DeepSeek V4 / V4.1 checkpoint ships (HF `deepseek_v41` with a nested `text_config`, HF
//! `deepseek_v4` with `layer_types` or the legacy upstream keys, and DeepSeek's own
//! `inference/config.json` names).

use serde_json::{Map, Value};
use std::path::Path;

/// A configuration problem. Every variant names the field at fault.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {reason}")]
    Io {
        /// The file.
        path: String,
        /// The OS error, as text.
        reason: String,
    },
    /// The text is not JSON.
    #[error("config is not valid JSON: {0}")]
    Json(String),
    /// A field the model needs is absent.
    #[error("config field `{0}` is missing")]
    Missing(String),
    /// A field is present but unusable.
    #[error("config field `{field}` is invalid: {reason}")]
    Invalid {
        /// The field.
        field: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// `model_type` names a model this engine does not implement.
    #[error("unknown model_type `{0}` (supported: deepseek_v41, deepseek_v4)")]
    UnknownModelType(String),
}

fn invalid(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.to_string(),
        reason: reason.into(),
    }
}

/// Which model graph a checkpoint needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// DeepSeek V4.1 (`deepseek_v41`): ratios 1/2, KV sharing, Engram, DSpark.
    V41,
    /// DeepSeek V4 (`deepseek_v4`): CSA (ratio 4) and HCA (ratio 128) layers, hash MoE.
    V4,
}

/// The attention kind of one backbone layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKind {
    /// Sliding window only.
    Sliding,
    /// V4 compressed sparse attention: overlapping compressor plus lightning indexer.
    Csa,
    /// V4 heavily compressed attention: every visible compressed entry, no indexer.
    Hca,
    /// V4.1 compressed attention at ratio 1 or 2 over the entries of a KV source layer.
    Shared,
}

/// YaRN frequency scaling of the compressed-branch RoPE table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    /// Frequency divisor for the slow pairs.
    pub factor: f64,
    /// Context length the base model was trained at.
    pub original_max_position_embeddings: f64,
    /// Pairs rotating faster than this many turns are left alone.
    pub beta_fast: f64,
    /// Pairs rotating slower than this many turns are fully scaled.
    pub beta_slow: f64,
}

/// Engram n-gram memory settings (V4.1).
#[derive(Debug, Clone, PartialEq)]
pub struct EngramConfig {
    /// Layers that inject Engram memory before their attention.
    pub layer_ids: Vec<usize>,
    /// Table rows per Engram layer (must equal the sum of that layer's bucket primes).
    pub num_embeddings: Vec<u64>,
    /// Longest n-gram hashed (n-grams 2..=max are used).
    pub max_ngram_size: usize,
    /// Hash heads per n-gram size.
    pub n_heads: usize,
    /// Width of one table row.
    pub head_dim: usize,
    /// Start of the bucket prime search.
    pub vocab_size: u64,
    /// Number of distinct compressed token ids.
    pub compressed_vocab_size: u64,
    /// Token id whose compressed id pads n-grams before the sequence start.
    pub pad_token_id: usize,
}

/// DSpark block drafter settings (V4.1 `mtp.*` stages).
#[derive(Debug, Clone, PartialEq)]
pub struct DSparkConfig {
    /// Number of stages (`num_nextn_predict_layers`).
    pub stages: usize,
    /// Rows per drafted block (anchor plus noise rows).
    pub block_size: usize,
    /// Token id of the noise rows.
    pub noise_token_id: usize,
    /// Backbone layers whose input streams form the context features.
    pub target_layer_ids: Vec<usize>,
    /// Rank of the Markov head.
    pub markov_rank: usize,
    /// Routed experts per stage.
    pub n_routed_experts: usize,
    /// Experts chosen per token in a stage.
    pub num_experts_per_tok: usize,
}

/// Everything the forward pass reads from a config, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Model graph.
    pub kind: ModelKind,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden size D.
    pub hidden_size: usize,
    /// Backbone layers L.
    pub num_layers: usize,
    /// Query heads H.
    pub num_heads: usize,
    /// Width d of each head and of the shared K=V vector.
    pub head_dim: usize,
    /// Rotary channels r (the last r of each head).
    pub rope_dim: usize,
    /// Query low-rank width.
    pub q_lora_rank: usize,
    /// Output projection groups.
    pub o_groups: usize,
    /// Output low-rank width per group.
    pub o_lora_rank: usize,
    /// Window length W (keys p-W+1..=p).
    pub sliding_window: usize,
    /// Attention kind of each backbone layer.
    pub attn_kinds: Vec<AttnKind>,
    /// Compression ratio of each backbone layer (0 for sliding layers).
    pub compress_ratios: Vec<usize>,
    /// Whether each layer routes by token id (V4 `hash_moe`).
    pub hash_moe: Vec<bool>,
    /// V4.1 layers that own compressed KV.
    pub kv_source_layers: Vec<usize>,
    /// V4.1 layers that run an indexer.
    pub index_source_layers: Vec<usize>,
    /// V4.1 layer that publishes candidate blocks.
    pub candidate_source_layer: Option<usize>,
    /// Candidate blocks kept.
    pub candidate_topk_blocks: usize,
    /// Entries per candidate block.
    pub candidate_block_size: usize,
    /// Indexer heads.
    pub index_n_heads: usize,
    /// Indexer head width.
    pub index_head_dim: usize,
    /// Compressed entries selected per query.
    pub index_topk: usize,
    /// Routed experts.
    pub n_routed_experts: usize,
    /// Experts per token.
    pub num_experts_per_tok: usize,
    /// Expert hidden width.
    pub moe_intermediate_size: usize,
    /// Renormalise the selected routing weights.
    pub norm_topk_prob: bool,
    /// Routing weight multiplier.
    pub routed_scaling_factor: f64,
    /// SwiGLU clamp (0 disables).
    pub swiglu_limit: f64,
    /// Router logit temperature.
    pub gate_temp: f64,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Residual streams N.
    pub hc_mult: usize,
    /// Sinkhorn iterations.
    pub hc_sinkhorn_iters: usize,
    /// Hyper-connection epsilon.
    pub hc_eps: f64,
    /// RoPE base of sliding layers.
    pub rope_theta: f64,
    /// RoPE base of compressed layers.
    pub compress_rope_theta: f64,
    /// YaRN on the compressed table, if any.
    pub yarn: Option<Yarn>,
    /// Engram settings (V4.1 only).
    pub engram: Option<EngramConfig>,
    /// DSpark settings (V4.1 only).
    pub dspark: Option<DSparkConfig>,
    /// End-of-sequence token, when the config names one.
    pub eos_token_id: Option<usize>,
    /// `quantization_config.weight_block_size`: the `[rows, cols]` blocks of FP8 weights'
    /// scales (`[32, 32]` for V4.1-Flash, `[128, 128]` for V4-Flash). `None`: inferred from
    /// each scale's shape.
    pub weight_block_size: Option<[usize; 2]>,
}

fn weight_block_size(q: Option<&Value>) -> Result<Option<[usize; 2]>, ConfigError> {
    const FIELD: &str = "quantization_config.weight_block_size";
    let Some(b) = q.and_then(|q| q.get("weight_block_size")) else {
        return Ok(None);
    };
    let dims: Option<Vec<usize>> = b.as_array().map(|a| {
        a.iter()
            .filter_map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
            .filter(|&d| d > 0)
            .collect()
    });
    match dims.as_deref() {
        Some(&[r, c]) if b.as_array().is_some_and(|a| a.len() == 2) => Ok(Some([r, c])),
        _ => Err(invalid(
            FIELD,
            format!("expected two positive integers, got {b}"),
        )),
    }
}

/// Field access over one flat JSON object with alias lists; errors name the first alias.
struct Fields<'a> {
    map: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn get(&self, names: &[&str]) -> Option<&Value> {
        names
            .iter()
            .find_map(|n| self.map.get(*n).filter(|v| !v.is_null()))
    }
    fn usize(&self, names: &[&str]) -> Result<usize, ConfigError> {
        let v = self
            .get(names)
            .ok_or_else(|| ConfigError::Missing(names[0].into()))?;
        as_usize(v, names[0])
    }
    fn usize_or(&self, names: &[&str], default: usize) -> Result<usize, ConfigError> {
        match self.get(names) {
            Some(v) => as_usize(v, names[0]),
            None => Ok(default),
        }
    }
    fn f64(&self, names: &[&str]) -> Result<f64, ConfigError> {
        let v = self
            .get(names)
            .ok_or_else(|| ConfigError::Missing(names[0].into()))?;
        as_f64(v, names[0])
    }
    fn f64_or(&self, names: &[&str], default: f64) -> Result<f64, ConfigError> {
        match self.get(names) {
            Some(v) => as_f64(v, names[0]),
            None => Ok(default),
        }
    }
    fn bool_or(&self, names: &[&str], default: bool) -> Result<bool, ConfigError> {
        match self.get(names) {
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(invalid(names[0], "expected true or false")),
            None => Ok(default),
        }
    }
    fn list(&self, names: &[&str]) -> Result<Option<Vec<usize>>, ConfigError> {
        match self.get(names) {
            None => Ok(None),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| as_usize(v, names[0]))
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(invalid(
                names[0],
                "expected a list of non-negative integers",
            )),
        }
    }
    fn list_u64(&self, names: &[&str]) -> Result<Option<Vec<u64>>, ConfigError> {
        Ok(self
            .list(names)?
            .map(|v| v.into_iter().map(|x| x as u64).collect()))
    }
}

fn as_usize(v: &Value, field: &str) -> Result<usize, ConfigError> {
    if let Some(u) = v.as_u64() {
        return usize::try_from(u).map_err(|_| invalid(field, "too large"));
    }
    // Some writers store integers as 16.0.
    match v.as_f64() {
        Some(f) if f >= 0.0 && f.fract() == 0.0 && f < 9.0e15 => Ok(f as usize),
        _ => Err(invalid(
            field,
            format!("expected a non-negative integer, got {v}"),
        )),
    }
}

fn as_f64(v: &Value, field: &str) -> Result<f64, ConfigError> {
    match v.as_f64() {
        Some(f) if f.is_finite() => Ok(f),
        _ => Err(invalid(field, format!("expected a finite number, got {v}"))),
    }
}

fn positive(field: &str, v: usize) -> Result<usize, ConfigError> {
    if v == 0 {
        Err(invalid(field, "must be positive"))
    } else {
        Ok(v)
    }
}

/// The latest element of `layers` at or below `l`.
pub fn last_at_or_below(layers: &[usize], l: usize) -> Option<usize> {
    layers.iter().copied().filter(|&j| j <= l).max()
}

impl ModelConfig {
    /// Read and validate `config.json` (or DeepSeek's `inference/config.json`) at `path`.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::from_json_str(&text)
    }

    /// Parse and validate config JSON text in any supported spelling.
    pub fn from_json_str(text: &str) -> Result<Self, ConfigError> {
        let v: Value = serde_json::from_str(text).map_err(|e| ConfigError::Json(e.to_string()))?;
        Self::from_json(&v)
    }

    /// Parse and validate a config JSON value in any supported spelling.
    pub fn from_json(v: &Value) -> Result<Self, ConfigError> {
        let top = v
            .as_object()
            .ok_or_else(|| ConfigError::Json("the top level is not an object".into()))?;
        // Flatten V4.1's nested text_config; top-level keys fill gaps (eos ids etc.).
        let mut flat = match top.get("text_config") {
            Some(Value::Object(t)) => t.clone(),
            Some(_) => return Err(invalid("text_config", "expected an object")),
            None => top.clone(),
        };
        for (k, val) in top {
            if k != "text_config" && k != "vision_config" {
                flat.entry(k.clone()).or_insert_with(|| val.clone());
            }
        }
        // The top-level model_type wins over text_config's `deepseek_v41_text`.
        let model_type = top
            .get("model_type")
            .or_else(|| flat.get("model_type"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let f = Fields { map: &flat };
        let kind = match model_type.as_deref() {
            Some("deepseek_v41") | Some("deepseek_v41_text") => ModelKind::V41,
            Some("deepseek_v4") => ModelKind::V4,
            Some(other) => return Err(ConfigError::UnknownModelType(other.into())),
            None => {
                // DeepSeek's inference/config.json has no model_type: V4.1 has KV sharing.
                if f.get(&["dim"]).is_none() && f.get(&["hidden_size"]).is_none() {
                    return Err(ConfigError::Missing("model_type".into()));
                }
                if f.get(&["kv_source_layers", "kv_source_layer_ids"])
                    .is_some()
                {
                    ModelKind::V41
                } else {
                    ModelKind::V4
                }
            }
        };
        Self::parse(kind, &f)
    }

    fn parse(kind: ModelKind, f: &Fields<'_>) -> Result<Self, ConfigError> {
        let vocab_size = positive("vocab_size", f.usize(&["vocab_size"])?)?;
        let hidden_size = positive("hidden_size", f.usize(&["hidden_size", "dim"])?)?;
        let num_layers = positive(
            "num_hidden_layers",
            f.usize(&["num_hidden_layers", "n_layers"])?,
        )?;
        let num_heads = positive(
            "num_attention_heads",
            f.usize(&["num_attention_heads", "n_heads"])?,
        )?;
        let head_dim = positive("head_dim", f.usize(&["head_dim"])?)?;
        let rope_dim = match f.get(&["qk_rope_head_dim", "rope_head_dim"]) {
            Some(v) => as_usize(v, "qk_rope_head_dim")?,
            None => {
                let prf = f
                    .f64(&["partial_rotary_factor"])
                    .map_err(|_| ConfigError::Missing("qk_rope_head_dim".into()))?;
                (head_dim as f64 * prf).round() as usize
            }
        };
        if rope_dim == 0 || rope_dim % 2 != 0 || rope_dim > head_dim {
            return Err(invalid(
                "qk_rope_head_dim",
                format!("must be even, positive and at most head_dim ({head_dim})"),
            ));
        }
        let q_lora_rank = positive("q_lora_rank", f.usize(&["q_lora_rank"])?)?;
        let o_groups = positive("o_groups", f.usize(&["o_groups"])?)?;
        let o_lora_rank = positive("o_lora_rank", f.usize(&["o_lora_rank"])?)?;
        if num_heads % o_groups != 0 {
            return Err(invalid("o_groups", "must divide num_attention_heads"));
        }
        let sliding_window = positive(
            "sliding_window",
            f.usize(&["sliding_window", "window_size"])?,
        )?;
        let n_routed_experts = positive(
            "n_routed_experts",
            f.usize(&["n_routed_experts", "num_local_experts"])?,
        )?;
        let num_experts_per_tok = positive(
            "num_experts_per_tok",
            f.usize(&["num_experts_per_tok", "n_activated_experts"])?,
        )?;
        if num_experts_per_tok > n_routed_experts {
            return Err(invalid("num_experts_per_tok", "exceeds n_routed_experts"));
        }
        let moe_intermediate_size = positive(
            "moe_intermediate_size",
            f.usize(&["moe_intermediate_size", "moe_inter_dim"])?,
        )?;
        let n_shared = f.usize_or(&["n_shared_experts"], 1)?;
        if n_shared != 1 {
            return Err(invalid(
                "n_shared_experts",
                "exactly one shared expert is supported",
            ));
        }
        if let Some(s) = f.get(&["scoring_func", "score_func"])
            && s.as_str() != Some("sqrtsoftplus")
        {
            return Err(invalid(
                "scoring_func",
                format!("only sqrtsoftplus is supported, got {s}"),
            ));
        }
        let index_n_heads = positive("index_n_heads", f.usize(&["index_n_heads"])?)?;
        let index_head_dim = positive("index_head_dim", f.usize(&["index_head_dim"])?)?;
        if index_head_dim < rope_dim {
            return Err(invalid(
                "index_head_dim",
                "must be at least qk_rope_head_dim",
            ));
        }
        let index_topk = positive("index_topk", f.usize(&["index_topk"])?)?;
        let hc_mult = positive("hc_mult", f.usize(&["hc_mult"])?)?;
        let hc_sinkhorn_iters = positive("hc_sinkhorn_iters", f.usize(&["hc_sinkhorn_iters"])?)?;
        let hc_eps = f.f64(&["hc_eps"])?;
        let rms_norm_eps = f.f64(&["rms_norm_eps", "norm_eps"])?;
        if rms_norm_eps < 0.0 || hc_eps < 0.0 {
            return Err(invalid("rms_norm_eps", "epsilons must be non-negative"));
        }
        let gate_temp = f.f64_or(&["gate_temp"], 1.0)?;
        if gate_temp <= 0.0 {
            return Err(invalid("gate_temp", "must be positive"));
        }
        let (rope_theta, compress_rope_theta, yarn) = parse_rope(f)?;
        let eos_token_id = match f.get(&["eos_token_id"]) {
            Some(Value::Array(a)) => a.first().map(|v| as_usize(v, "eos_token_id")).transpose()?,
            Some(v) => Some(as_usize(v, "eos_token_id")?),
            None => None,
        };

        let mut cfg = ModelConfig {
            kind,
            vocab_size,
            hidden_size,
            num_layers,
            num_heads,
            head_dim,
            rope_dim,
            q_lora_rank,
            o_groups,
            o_lora_rank,
            sliding_window,
            attn_kinds: Vec::new(),
            compress_ratios: Vec::new(),
            hash_moe: vec![false; num_layers],
            kv_source_layers: Vec::new(),
            index_source_layers: Vec::new(),
            candidate_source_layer: None,
            candidate_topk_blocks: 0,
            candidate_block_size: 0,
            index_n_heads,
            index_head_dim,
            index_topk,
            n_routed_experts,
            num_experts_per_tok,
            moe_intermediate_size,
            norm_topk_prob: f.bool_or(&["norm_topk_prob"], true)?,
            routed_scaling_factor: f.f64_or(&["routed_scaling_factor", "route_scale"], 1.0)?,
            swiglu_limit: f.f64_or(&["swiglu_limit"], 0.0)?,
            gate_temp,
            rms_norm_eps,
            hc_mult,
            hc_sinkhorn_iters,
            hc_eps,
            rope_theta,
            compress_rope_theta,
            yarn,
            engram: None,
            dspark: None,
            eos_token_id,
            weight_block_size: weight_block_size(f.get(&["quantization_config"]))?,
        };
        match kind {
            ModelKind::V41 => cfg.parse_v41(f)?,
            ModelKind::V4 => cfg.parse_v4(f)?,
        }
        Ok(cfg)
    }

    fn parse_v41(&mut self, f: &Fields<'_>) -> Result<(), ConfigError> {
        let l = self.num_layers;
        let ratios = f
            .list(&["compress_ratios"])?
            .ok_or_else(|| ConfigError::Missing("compress_ratios".into()))?;
        if ratios.len() < l {
            return Err(invalid(
                "compress_ratios",
                format!(
                    "has {} entries, needs at least num_hidden_layers = {l}",
                    ratios.len()
                ),
            ));
        }
        let ratios = ratios[..l].to_vec();
        if let Some(r) = ratios.iter().find(|&&r| r > 2) {
            return Err(invalid(
                "compress_ratios",
                format!("deepseek_v41 uses ratios 0, 1, 2; got {r}"),
            ));
        }
        let kv = f
            .list(&["kv_source_layer_ids", "kv_source_layers"])?
            .unwrap_or_default();
        let idx = f
            .list(&["index_source_layer_ids", "index_source_layers"])?
            .unwrap_or_default();
        for (name, list) in [
            ("kv_source_layer_ids", &kv),
            ("index_source_layer_ids", &idx),
        ] {
            if list.windows(2).any(|w| w[0] >= w[1]) || list.iter().any(|&j| j >= l) {
                return Err(invalid(name, "must be increasing backbone layer ids"));
            }
        }
        for &j in &kv {
            if ratios[j] == 0 {
                return Err(invalid(
                    "kv_source_layer_ids",
                    format!("layer {j} has ratio 0"),
                ));
            }
            if !idx.contains(&j) {
                return Err(invalid(
                    "index_source_layer_ids",
                    format!("KV source layer {j} must also be an index source"),
                ));
            }
        }
        for (layer, &r) in ratios.iter().enumerate() {
            if r == 0 {
                continue;
            }
            match last_at_or_below(&kv, layer) {
                Some(s) if ratios[s] == r => {}
                _ => {
                    return Err(invalid(
                        "kv_source_layer_ids",
                        format!(
                            "layer {layer} (ratio {r}) has no KV source of its ratio at or below it"
                        ),
                    ));
                }
            }
        }
        for &j in &idx {
            if ratios[j] == 0 {
                return Err(invalid(
                    "index_source_layer_ids",
                    format!("layer {j} has ratio 0"),
                ));
            }
        }
        let cand = match f.get(&["candidate_source_layer_id", "candidate_source_layer"]) {
            None => None,
            Some(v) if v.as_i64() == Some(-1) => None,
            Some(v) => Some(as_usize(v, "candidate_source_layer_id")?),
        };
        let topk_blocks = f.usize_or(&["candidate_topk_blocks"], 0)?;
        let block = f.usize_or(&["candidate_block_size"], 0)?;
        if let Some(c) = cand {
            if !idx.contains(&c) {
                return Err(invalid(
                    "candidate_source_layer_id",
                    "must be an index source",
                ));
            }
            if topk_blocks > 0 && block == 0 {
                return Err(invalid("candidate_block_size", "must be positive"));
            }
        }
        self.attn_kinds = ratios
            .iter()
            .map(|&r| {
                if r == 0 {
                    AttnKind::Sliding
                } else {
                    AttnKind::Shared
                }
            })
            .collect();
        self.compress_ratios = ratios;
        self.kv_source_layers = kv;
        self.index_source_layers = idx;
        self.candidate_source_layer = cand.filter(|_| topk_blocks > 0);
        self.candidate_topk_blocks = topk_blocks;
        self.candidate_block_size = block;
        if f.usize_or(&["num_hash_layers", "n_hash_layers"], 0)? != 0 {
            return Err(invalid(
                "num_hash_layers",
                "deepseek_v41 has no hash-routed layers",
            ));
        }

        let engram_layers = f.list(&["engram_layer_ids"])?.unwrap_or_default();
        if !engram_layers.is_empty() {
            if engram_layers.iter().any(|&j| j >= l)
                || engram_layers.windows(2).any(|w| w[0] >= w[1])
            {
                return Err(invalid(
                    "engram_layer_ids",
                    "must be increasing backbone layer ids",
                ));
            }
            let num_embeddings = f
                .list_u64(&["engram_num_embeddings"])?
                .ok_or_else(|| ConfigError::Missing("engram_num_embeddings".into()))?;
            if num_embeddings.len() != engram_layers.len() {
                return Err(invalid(
                    "engram_num_embeddings",
                    "needs one entry per Engram layer",
                ));
            }
            let max_ngram_size = f.usize(&["engram_max_ngram_size"])?;
            if max_ngram_size < 2 {
                return Err(invalid("engram_max_ngram_size", "must be at least 2"));
            }
            self.engram = Some(EngramConfig {
                layer_ids: engram_layers,
                num_embeddings,
                max_ngram_size,
                n_heads: positive("engram_n_heads", f.usize(&["engram_n_heads"])?)?,
                head_dim: positive("engram_head_dim", f.usize(&["engram_head_dim"])?)?,
                vocab_size: f.usize(&["engram_vocab_size"])? as u64,
                compressed_vocab_size: positive(
                    "engram_compressed_vocab_size",
                    f.usize(&["engram_compressed_vocab_size"])?,
                )? as u64,
                pad_token_id: f.usize(&["engram_pad_token_id", "engram_pad_id"])?,
            });
        }

        let stages = f.usize_or(&["num_nextn_predict_layers", "n_mtp_layers"], 0)?;
        let block_size = f.usize_or(&["dspark_block_size"], 0)?;
        if stages > 0 && block_size > 0 {
            let targets = f
                .list(&["dspark_target_layer_ids"])?
                .ok_or_else(|| ConfigError::Missing("dspark_target_layer_ids".into()))?;
            if targets.is_empty()
                || targets.windows(2).any(|w| w[0] >= w[1])
                || targets.iter().any(|&j| j >= l)
            {
                return Err(invalid(
                    "dspark_target_layer_ids",
                    "must be increasing backbone layer ids",
                ));
            }
            let noise = f.usize(&["dspark_noise_token_id"])?;
            if noise >= self.vocab_size {
                return Err(invalid("dspark_noise_token_id", "outside the vocabulary"));
            }
            let n_exp = f.usize_or(&["dspark_n_routed_experts"], self.n_routed_experts)?;
            let k = f.usize_or(
                &["dspark_num_experts_per_tok", "dspark_n_activated_experts"],
                self.num_experts_per_tok,
            )?;
            if k == 0 || k > n_exp {
                return Err(invalid(
                    "dspark_num_experts_per_tok",
                    "must be in 1..=dspark_n_routed_experts",
                ));
            }
            self.dspark = Some(DSparkConfig {
                stages,
                block_size,
                noise_token_id: noise,
                target_layer_ids: targets,
                markov_rank: positive("dspark_markov_rank", f.usize(&["dspark_markov_rank"])?)?,
                n_routed_experts: n_exp,
                num_experts_per_tok: k,
            });
        }
        Ok(())
    }

    fn parse_v4(&mut self, f: &Fields<'_>) -> Result<(), ConfigError> {
        let l = self.num_layers;
        let (csa_rate, hca_rate) = match f.get(&["compress_rates"]) {
            Some(Value::Object(m)) => {
                let g = Fields { map: m };
                (
                    g.usize(&["compressed_sparse_attention"]).map_err(|_| {
                        invalid("compress_rates", "needs compressed_sparse_attention")
                    })?,
                    g.usize(&["heavily_compressed_attention"]).map_err(|_| {
                        invalid("compress_rates", "needs heavily_compressed_attention")
                    })?,
                )
            }
            Some(_) => return Err(invalid("compress_rates", "expected an object")),
            None => (4, 128),
        };
        let kinds: Vec<AttnKind> = if let Some(Value::Array(types)) = f.get(&["layer_types"]) {
            if types.len() < l {
                return Err(invalid("layer_types", format!("needs {l} entries")));
            }
            types[..l]
                .iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(AttnKind::Sliding),
                    Some("compressed_sparse_attention") => Ok(AttnKind::Csa),
                    Some("heavily_compressed_attention") => Ok(AttnKind::Hca),
                    _ => Err(invalid("layer_types", format!("unknown layer type {t}"))),
                })
                .collect::<Result<_, _>>()?
        } else if let Some(r) = f.list(&["compress_ratios"])? {
            if r.len() < l {
                return Err(invalid(
                    "compress_ratios",
                    format!("needs at least {l} entries"),
                ));
            }
            r[..l]
                .iter()
                .map(|&x| match x {
                    0 => Ok(AttnKind::Sliding),
                    4 => Ok(AttnKind::Csa),
                    128 => Ok(AttnKind::Hca),
                    _ => Err(invalid(
                        "compress_ratios",
                        format!("deepseek_v4 uses 0, 4, 128; got {x}"),
                    )),
                })
                .collect::<Result<_, _>>()?
        } else {
            return Err(ConfigError::Missing("layer_types".into()));
        };
        if csa_rate == 0 || hca_rate == 0 {
            return Err(invalid("compress_rates", "rates must be positive"));
        }
        self.compress_ratios = kinds
            .iter()
            .map(|k| match k {
                AttnKind::Csa => csa_rate,
                AttnKind::Hca => hca_rate,
                _ => 0,
            })
            .collect();
        self.attn_kinds = kinds;
        self.hash_moe = if let Some(Value::Array(types)) = f.get(&["mlp_layer_types"]) {
            if types.len() < l {
                return Err(invalid("mlp_layer_types", format!("needs {l} entries")));
            }
            types[..l]
                .iter()
                .map(|t| match t.as_str() {
                    Some("hash_moe") => Ok(true),
                    Some("moe") => Ok(false),
                    _ => Err(invalid("mlp_layer_types", format!("unknown MLP type {t}"))),
                })
                .collect::<Result<_, _>>()?
        } else {
            let n = f.usize_or(&["num_hash_layers", "n_hash_layers"], 0)?;
            if n > l {
                return Err(invalid("num_hash_layers", "exceeds num_hidden_layers"));
            }
            (0..l).map(|i| i < n).collect()
        };
        Ok(())
    }

    /// Number of mHC mixing coefficients per sublayer: (2 + N) * N.
    pub fn hc_mix_dim(&self) -> usize {
        (2 + self.hc_mult) * self.hc_mult
    }
}

/// RoPE bases and YaRN, from `rope_parameters` (nested), `rope_scaling` (flat legacy) or
/// DeepSeek's names (`rope_factor`, `original_seq_len`, `beta_fast`, `beta_slow`).
fn parse_rope(f: &Fields<'_>) -> Result<(f64, f64, Option<Yarn>), ConfigError> {
    if let Some(Value::Object(rp)) = f.get(&["rope_parameters"])
        && let (Some(Value::Object(main)), Some(Value::Object(comp))) =
            (rp.get("main"), rp.get("compress"))
    {
        let m = Fields { map: main };
        let c = Fields { map: comp };
        let theta = m
            .f64(&["rope_theta"])
            .map_err(|_| ConfigError::Missing("rope_parameters.main.rope_theta".into()))?;
        let ctheta = c
            .f64(&["rope_theta"])
            .map_err(|_| ConfigError::Missing("rope_parameters.compress.rope_theta".into()))?;
        let yarn = yarn_from(&c, "rope_parameters.compress")?;
        return Ok((theta, ctheta, yarn));
    }
    let theta = f.f64(&["rope_theta"])?;
    let ctheta = f.f64_or(&["compress_rope_theta"], theta)?;
    let yarn = match f.get(&["rope_scaling"]) {
        Some(Value::Object(rs)) => yarn_from(&Fields { map: rs }, "rope_scaling")?,
        Some(_) => return Err(invalid("rope_scaling", "expected an object")),
        None => match f.get(&["rope_factor"]) {
            Some(v) => {
                let factor = as_f64(v, "rope_factor")?;
                if factor <= 1.0 {
                    None
                } else {
                    Some(Yarn {
                        factor,
                        original_max_position_embeddings: f.f64(&["original_seq_len"])?,
                        beta_fast: f.f64_or(&["beta_fast"], 32.0)?,
                        beta_slow: f.f64_or(&["beta_slow"], 1.0)?,
                    })
                }
            }
            None => None,
        },
    };
    if theta <= 0.0 || ctheta <= 0.0 {
        return Err(invalid("rope_theta", "must be positive"));
    }
    Ok((theta, ctheta, yarn))
}

fn yarn_from(m: &Fields<'_>, prefix: &str) -> Result<Option<Yarn>, ConfigError> {
    let ty = m
        .get(&["rope_type", "type"])
        .and_then(Value::as_str)
        .unwrap_or("default");
    match ty {
        "default" => Ok(None),
        "yarn" => {
            let factor = m
                .f64(&["factor"])
                .map_err(|_| ConfigError::Missing(format!("{prefix}.factor")))?;
            let orig = m.f64(&["original_max_position_embeddings"]).map_err(|_| {
                ConfigError::Missing(format!("{prefix}.original_max_position_embeddings"))
            })?;
            if factor <= 0.0 || orig <= 0.0 {
                return Err(invalid(&format!("{prefix}.factor"), "must be positive"));
            }
            Ok(Some(Yarn {
                factor,
                original_max_position_embeddings: orig,
                beta_fast: m.f64_or(&["beta_fast"], 32.0)?,
                beta_slow: m.f64_or(&["beta_slow"], 1.0)?,
            }))
        }
        other => Err(invalid(
            &format!("{prefix}.rope_type"),
            format!("unsupported `{other}`"),
        )),
    }
}

//! Stored weight formats: how many bytes a `[rows, cols]` tensor takes in a checkpoint, and
//! which format each kind of tensor uses, read from a config's `quantization_config`.

use super::PlanError;
use crate::config::ModelKind;
use serde::Serialize;
use serde_json::Value;

/// How one weight tensor is stored in a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StoredFormat {
    /// FP8 e4m3, one byte per value, plus one scale of `scale_bytes` per `block[0]` x
    /// `block[1]` tile (rows x columns), ceil-divided at the edges: the dense linears of
    /// `quantization_config.weight_block_size`.
    Fp8Block {
        /// Tile height and width.
        block: [u64; 2],
        /// Bytes per scale: 1 for UE8M0 (`scale_fmt: "ue8m0"`), 4 for f32.
        scale_bytes: u64,
    },
    /// FP8 e4m3 rows with one scale of `scale_bytes` per `group` values of a row (the Engram
    /// tables: `embed.scale` is `[rows, cols / 32]`).
    Fp8Group {
        /// Values per scale.
        group: u64,
        /// Bytes per scale.
        scale_bytes: u64,
    },
    /// FP4 e2m1, two values per byte (low nibble first), plus one scale of `scale_bytes` per
    /// `group` values of a row (`expert_dtype: "fp4"`: one UE8M0 per 32 inputs).
    Fp4Group {
        /// Values per scale.
        group: u64,
        /// Bytes per scale.
        scale_bytes: u64,
    },
    /// bfloat16, two bytes per value.
    Bf16,
    /// float32, four bytes per value.
    F32,
    /// int32, four bytes per value (V4's `tid2eid` hash-routing tables).
    I32,
}

impl StoredFormat {
    /// Bytes of a `[rows, cols]` tensor in this format, scales included.
    pub fn bytes(&self, rows: u64, cols: u64) -> u64 {
        match *self {
            StoredFormat::Fp8Block { block, scale_bytes } => {
                rows * cols + rows.div_ceil(block[0]) * cols.div_ceil(block[1]) * scale_bytes
            }
            StoredFormat::Fp8Group { group, scale_bytes } => {
                rows * cols + rows * cols.div_ceil(group) * scale_bytes
            }
            StoredFormat::Fp4Group { group, scale_bytes } => {
                rows * cols.div_ceil(2) + rows * cols.div_ceil(group) * scale_bytes
            }
            StoredFormat::Bf16 => rows * cols * 2,
            StoredFormat::F32 | StoredFormat::I32 => rows * cols * 4,
        }
    }

    /// A short human label, e.g. `FP8 e4m3 + UE8M0 per 32x32`.
    pub fn label(&self) -> String {
        let scale = |b: u64| if b == 1 { "UE8M0" } else { "f32" };
        match *self {
            StoredFormat::Fp8Block { block, scale_bytes } => format!(
                "FP8 e4m3 + {} per {}x{}",
                scale(scale_bytes),
                block[0],
                block[1]
            ),
            StoredFormat::Fp8Group { group, scale_bytes } => {
                format!("FP8 e4m3 + {} per {group} of a row", scale(scale_bytes))
            }
            StoredFormat::Fp4Group { group, scale_bytes } => {
                format!("FP4 e2m1 + {} per {group}", scale(scale_bytes))
            }
            StoredFormat::Bf16 => "bf16".into(),
            StoredFormat::F32 => "f32".into(),
            StoredFormat::I32 => "int32".into(),
        }
    }
}

/// Which stored format each kind of tensor of a checkpoint uses.
///
/// With `quantization_config.quant_method: "fp8"` (both published Flash checkpoints): plain
/// linears are FP8 blocks of `weight_block_size` (default [128, 128]) with `scale_fmt` scales
/// (UE8M0, else f32); routed experts follow `expert_dtype` (`"fp4"`: FP4 e2m1 with a UE8M0
/// per 32; absent or `"fp8"`: like the linears; `"bf16"`); Engram tables are FP8 rows with a
/// scale per 32. Without a `quantization_config` everything that would be quantised is bf16.
/// The tensors DeepSeek keeps unquantised (embedding, head, router, `wo_a`, compressors,
/// `indexer.wk` / `weights_proj`, Engram `q_weight` / `k_weight`) are bf16 either way, and
/// `hc_*`, sinks, router biases and V4's `ape` are f32 (v41-architecture.md section 12,
/// v4-architecture.md section 10.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CheckpointFormat {
    /// Plain linears (`wq_a`, `wq_b`, `wkv`, `wo_b`, `indexer.wq_b`, shared experts, Engram
    /// `wkv`, drafter projections).
    pub dense: StoredFormat,
    /// Routed experts.
    pub experts: StoredFormat,
    /// Engram embedding tables.
    pub tables: StoredFormat,
    /// RMSNorm weights: f32 for V4.1 (as DeepSeek's reference declares them), bf16 for V4
    /// (as the V4 checkpoint stores them).
    pub norms: StoredFormat,
}

impl CheckpointFormat {
    /// The formats of a checkpoint whose config JSON is `v` (its `quantization_config`, at
    /// the top level or inside `text_config`).
    pub fn from_config_json(v: &Value, kind: ModelKind) -> Result<Self, PlanError> {
        let norms = match kind {
            ModelKind::V41 => StoredFormat::F32,
            ModelKind::V4 => StoredFormat::Bf16,
        };
        let q = v.get("quantization_config").or_else(|| {
            v.get("text_config")
                .and_then(|t| t.get("quantization_config"))
        });
        let Some(q) = q.filter(|q| !q.is_null()) else {
            return Ok(Self {
                dense: StoredFormat::Bf16,
                experts: StoredFormat::Bf16,
                tables: StoredFormat::Bf16,
                norms,
            });
        };
        let bad = |field: &str, why: String| PlanError::Unsupported(format!("{field}: {why}"));
        match q.get("quant_method").and_then(Value::as_str) {
            Some("fp8") => {}
            other => {
                return Err(bad(
                    "quantization_config.quant_method",
                    format!("{other:?} (only \"fp8\" is known)"),
                ));
            }
        }
        let scale_bytes = match q.get("scale_fmt").and_then(Value::as_str) {
            Some("ue8m0") => 1,
            None => 4,
            Some(other) => {
                return Err(bad(
                    "quantization_config.scale_fmt",
                    format!("`{other}` (known: ue8m0, or absent for f32)"),
                ));
            }
        };
        let block = match q.get("weight_block_size") {
            None => [128, 128],
            Some(Value::Array(a)) if a.len() == 2 => {
                let side = |x: &Value| x.as_u64().filter(|&n| n > 0);
                match (side(&a[0]), side(&a[1])) {
                    (Some(r), Some(c)) => [r, c],
                    _ => {
                        return Err(bad(
                            "quantization_config.weight_block_size",
                            "expected two positive integers".into(),
                        ));
                    }
                }
            }
            Some(_) => {
                return Err(bad(
                    "quantization_config.weight_block_size",
                    "expected two positive integers".into(),
                ));
            }
        };
        let dense = StoredFormat::Fp8Block { block, scale_bytes };
        let experts = match q.get("expert_dtype").and_then(Value::as_str) {
            Some("fp4") => StoredFormat::Fp4Group {
                group: 32,
                scale_bytes: 1,
            },
            None | Some("fp8") => dense,
            Some("bf16") => StoredFormat::Bf16,
            Some(other) => {
                return Err(bad(
                    "quantization_config.expert_dtype",
                    format!("`{other}` (known: fp4, fp8, bf16)"),
                ));
            }
        };
        Ok(Self {
            dense,
            experts,
            tables: StoredFormat::Fp8Group {
                group: 32,
                scale_bytes,
            },
            norms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_of_each_format() {
        let fp8 = StoredFormat::Fp8Block {
            block: [32, 32],
            scale_bytes: 1,
        };
        // [1280, 5120]: 6,553,600 values and 40 x 160 scales.
        assert_eq!(fp8.bytes(1280, 5120), 6_553_600 + 6_400);
        // Edges round up: [33, 33] has 2 x 2 tiles.
        assert_eq!(fp8.bytes(33, 33), 33 * 33 + 4);
        let fp4 = StoredFormat::Fp4Group {
            group: 32,
            scale_bytes: 1,
        };
        // One V4.1 expert's w1: [2304, 5120] -> 2304 x (2560 + 160) bytes.
        assert_eq!(fp4.bytes(2304, 5120), 2304 * 2720);
        let table = StoredFormat::Fp8Group {
            group: 32,
            scale_bytes: 1,
        };
        // An Engram row of 256 values: 256 + 8 bytes.
        assert_eq!(table.bytes(1, 256), 264);
        assert_eq!(StoredFormat::Bf16.bytes(3, 5), 30);
        assert_eq!(StoredFormat::F32.bytes(3, 5), 60);
    }

    #[test]
    fn formats_from_quantization_config() {
        let v: Value = serde_json::json!({"quantization_config": {"quant_method": "fp8",
            "weight_block_size": [32, 32], "scale_fmt": "ue8m0", "expert_dtype": "fp4"}});
        let f = CheckpointFormat::from_config_json(&v, ModelKind::V41).unwrap();
        assert_eq!(
            f.dense,
            StoredFormat::Fp8Block {
                block: [32, 32],
                scale_bytes: 1
            }
        );
        assert_eq!(f.experts.label(), "FP4 e2m1 + UE8M0 per 32");
        assert_eq!(f.dense.label(), "FP8 e4m3 + UE8M0 per 32x32");
        assert_eq!(f.norms, StoredFormat::F32);
        // No scale_fmt: f32 scales; no expert_dtype: experts like the linears.
        let v: Value = serde_json::json!({"quantization_config": {"quant_method": "fp8"}});
        let f = CheckpointFormat::from_config_json(&v, ModelKind::V4).unwrap();
        assert_eq!(
            f.experts,
            StoredFormat::Fp8Block {
                block: [128, 128],
                scale_bytes: 4
            }
        );
        // No quantization_config: bf16.
        let f = CheckpointFormat::from_config_json(&serde_json::json!({}), ModelKind::V4).unwrap();
        assert_eq!(f.dense, StoredFormat::Bf16);
        for bad in [
            serde_json::json!({"quantization_config": {"quant_method": "gptq"}}),
            serde_json::json!({"quantization_config": {"quant_method": "fp8", "weight_block_size": [0, 32]}}),
            serde_json::json!({"quantization_config": {"quant_method": "fp8", "expert_dtype": "int4"}}),
        ] {
            assert!(matches!(
                CheckpointFormat::from_config_json(&bad, ModelKind::V41),
                Err(PlanError::Unsupported(_))
            ));
        }
    }
}

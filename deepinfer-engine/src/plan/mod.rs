//! Memory plans: for a model config and a set of devices, the weight bytes in their stored
//! formats (per device, with expert parallelism), the cache bytes per token, per block and per
//! sequence in deployment record formats, and how many sequences of a context fit in what
//! device memory remains. `deepinfer plan` prints this; the engine can size its pools with the
//! same arithmetic ([`kv_layout`] returns a [`deepinfer_kv::KvLayout`]).
//!
//! ```
//! use deepinfer_engine::plan::{PlanModel, PlanOptions, plan};
//!
//! let model = PlanModel::preset("v4.1-flash")?;
//! let p = plan(&model, &PlanOptions::default())?;
//! assert_eq!(p.kv.bytes_per_token, 890.0);
//! assert_eq!(p.kv.window.bytes, 1_415_040);
//! # Ok::<(), deepinfer_engine::plan::PlanError>(())
//! ```
//!
//! Placement: without expert parallelism every device holds all weights (each is a replica
//! serving its own sequences). With [`PlanOptions::expert_parallel`] the routed experts of
//! every layer are split over the devices (the busiest holds `ceil(E / N)` per layer) and
//! everything else is on every device; the Engram tables follow [`EngramPlacement`]. Either
//! way each device keeps the cache of its own sequences (data-parallel attention), so the
//! deployment serves `devices x` the sequences one device fits.

mod format;
mod kv;
mod presets;
mod weights;

pub use format::{CheckpointFormat, StoredFormat};
pub use kv::{
    KvFormat, KvOptions, KvOwner, WindowAccounting, WindowState, compressor_state_bytes,
    kv_bytes_per_token, kv_layout, kv_owners, window_state,
};
pub use presets::{PRESETS, Preset, Published, V4_FLASH, V41_FLASH, find_preset};
pub use weights::{Part, WeightPart, weight_parts};

use crate::config::{ConfigError, ModelConfig, ModelKind};
use serde::Serialize;
use serde_json::Value;

/// Context planned for when neither the options nor the config give one.
pub const DEFAULT_CONTEXT: usize = 8192;

/// Why a plan could not be made. Every message is one line.
#[derive(Debug)]
pub enum PlanError {
    /// The config is unreadable or invalid.
    Config(ConfigError),
    /// No preset of that name.
    UnknownPreset(String),
    /// The config uses a storage format this planner does not know.
    Unsupported(String),
    /// An option is out of range.
    Invalid(String),
    /// The cache layout could not be built.
    Layout(deepinfer_kv::KvError),
    /// The weights of one device exceed its memory.
    WeightsDoNotFit {
        /// Weight bytes per device.
        need: u64,
        /// Device memory.
        memory: u64,
        /// Bytes held back from the device memory.
        reserve: u64,
        /// Bytes of replicated Engram tables among `need`.
        engram_tables: u64,
    },
    /// Not even one sequence of the context fits in what the weights leave.
    ContextDoesNotFit {
        /// Context tokens.
        context: usize,
        /// Cache bytes of one sequence.
        need: u64,
        /// Bytes left per device after the weights.
        available: u64,
    },
    /// The requested sequences do not fit.
    SequencesDoNotFit {
        /// Sequences requested over all devices.
        sequences: u64,
        /// Of these, on the busiest device.
        per_device: u64,
        /// Context tokens.
        context: usize,
        /// Cache bytes they need per device.
        need: u64,
        /// Bytes left per device after the weights.
        available: u64,
    },
}

impl std::fmt::Display for PlanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlanError::Config(e) => write!(f, "{e}"),
            PlanError::UnknownPreset(n) => {
                let known: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
                write!(f, "unknown preset `{n}` (known: {})", known.join(", "))
            }
            PlanError::Unsupported(s) => write!(f, "unsupported {s}"),
            PlanError::Invalid(s) => write!(f, "{s}"),
            PlanError::Layout(e) => write!(f, "cache layout: {e}"),
            PlanError::WeightsDoNotFit {
                need,
                memory,
                reserve,
                engram_tables,
            } => {
                let available = memory.saturating_sub(*reserve);
                write!(
                    f,
                    "weights need {} per device, {} more than the {}",
                    format_bytes(*need),
                    format_bytes(need - available),
                    format_bytes(available),
                )?;
                if *reserve > 0 {
                    write!(
                        f,
                        " left of {} ({}) after the {} reserve",
                        format_bytes(*memory),
                        format_gib(*memory),
                        format_bytes(*reserve)
                    )?;
                } else {
                    write!(f, " ({}) given", format_gib(*memory))?;
                }
                if *engram_tables > 0 {
                    write!(
                        f,
                        "; the replicated Engram tables are {} of that (shard them or keep \
                         them in host memory)",
                        format_bytes(*engram_tables)
                    )?;
                }
                Ok(())
            }
            PlanError::ContextDoesNotFit {
                context,
                need,
                available,
            } => write!(
                f,
                "one sequence of {} tokens needs {} of cache, {} more than the {} left per \
                 device after the weights",
                format_count(*context as u64),
                format_bytes(*need),
                format_bytes(need - available),
                format_bytes(*available)
            ),
            PlanError::SequencesDoNotFit {
                sequences,
                per_device,
                context,
                need,
                available,
            } => write!(
                f,
                "{} sequences of {} tokens ({} per device) need {} of cache per device, {} \
                 more than the {} left after the weights",
                format_count(*sequences),
                format_count(*context as u64),
                format_count(*per_device),
                format_bytes(*need),
                format_bytes(need - available),
                format_bytes(*available)
            ),
        }
    }
}

impl std::error::Error for PlanError {}

impl From<ConfigError> for PlanError {
    fn from(e: ConfigError) -> Self {
        PlanError::Config(e)
    }
}

/// A model to plan for: its validated config plus what the planner reads beyond it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanModel {
    /// A name for reports (the preset's title or the config's path).
    pub name: String,
    /// The validated config.
    pub config: ModelConfig,
    /// Stored formats, from `quantization_config`.
    pub format: CheckpointFormat,
    /// `max_position_embeddings`, when the config states it.
    pub max_context: Option<usize>,
    /// V4 only: the compression ratio of each MTP layer (`num_nextn_predict_layers` entries,
    /// from `compress_ratios` past the backbone, 0 where absent).
    pub mtp_ratios: Vec<usize>,
    /// Whether the config has a `vision_config` (V4.1 routers then carry `gate.bias_vl`).
    pub vision: bool,
    /// Figures published about the checkpoint (presets only).
    pub published: Option<Published>,
}

impl PlanModel {
    /// Parse config JSON text (HF or DeepSeek names, as [`ModelConfig::from_json_str`]).
    pub fn from_json_str(name: &str, text: &str) -> Result<Self, PlanError> {
        let v: Value = serde_json::from_str(text).map_err(|e| ConfigError::Json(e.to_string()))?;
        let config = ModelConfig::from_json(&v)?;
        let format = CheckpointFormat::from_config_json(&v, config.kind)?;
        let field = |names: &[&str]| {
            let text = v.get("text_config").filter(|t| t.is_object());
            names
                .iter()
                .find_map(|n| text.and_then(|t| t.get(*n)).or_else(|| v.get(*n)))
                .filter(|x| !x.is_null())
        };
        let max_context = field(&["max_position_embeddings"])
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n > 0);
        let mtp_ratios = match config.kind {
            ModelKind::V41 => Vec::new(),
            ModelKind::V4 => {
                let n = field(&["num_nextn_predict_layers", "n_mtp_layers"])
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                if n > 1 << 10 {
                    return Err(PlanError::Invalid(format!(
                        "config field `num_nextn_predict_layers` = {n} is beyond what a plan \
                         covers (at most 1024)"
                    )));
                }
                let n = n as usize;
                let ratios = field(&["compress_ratios"]).and_then(Value::as_array);
                (0..n)
                    .map(|j| {
                        ratios
                            .and_then(|r| r.get(config.num_layers + j))
                            .and_then(Value::as_u64)
                            .unwrap_or(0) as usize
                    })
                    .collect()
            }
        };
        check_limits(&config, &mtp_ratios)?;
        Ok(Self {
            name: name.to_string(),
            config,
            format,
            max_context,
            mtp_ratios,
            vision: v.get("vision_config").is_some_and(Value::is_object),
            published: None,
        })
    }

    /// Read and parse a config file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, PlanError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::from_json_str(&path.display().to_string(), &text)
    }

    /// A built-in preset (`v4.1-flash`, `v4-flash`), with its published figures.
    pub fn preset(name: &str) -> Result<Self, PlanError> {
        let p = find_preset(name).ok_or_else(|| PlanError::UnknownPreset(name.to_string()))?;
        let mut m = Self::from_json_str(p.title, p.json)?;
        m.published = Some(p.published);
        Ok(m)
    }

    /// Drafter stages that keep a window: V4.1 DSpark stages, V4 MTP layers.
    pub fn drafter_stages(&self) -> u64 {
        match self.config.kind {
            ModelKind::V41 => self.config.dspark.as_ref().map_or(0, |d| d.stages as u64),
            ModelKind::V4 => self.mtp_ratios.len() as u64,
        }
    }
}

/// Refuse sizes beyond any real model, so that no product or sum of the plan's arithmetic
/// can overflow a `u64`: with these bounds the largest part (Engram tables: at most 2^10
/// layers x 2^36 rows x 2^12 values x 1.03 B) is below 2^59 B and the whole checkpoint below
/// 2^62 B; cache records stay below 2^14 B, windows below 2^44 B per sequence.
fn check_limits(c: &ModelConfig, mtp_ratios: &[usize]) -> Result<(), PlanError> {
    let mut fields: Vec<(&str, u64, u32)> = vec![
        ("vocab_size", c.vocab_size as u64, 24),
        ("hidden_size", c.hidden_size as u64, 16),
        ("num_hidden_layers", c.num_layers as u64, 10),
        ("num_attention_heads", c.num_heads as u64, 10),
        ("head_dim", c.head_dim as u64, 12),
        ("q_lora_rank", c.q_lora_rank as u64, 16),
        ("o_lora_rank", c.o_lora_rank as u64, 16),
        ("sliding_window", c.sliding_window as u64, 20),
        ("index_n_heads", c.index_n_heads as u64, 10),
        ("index_head_dim", c.index_head_dim as u64, 12),
        ("n_routed_experts", c.n_routed_experts as u64, 12),
        ("moe_intermediate_size", c.moe_intermediate_size as u64, 16),
        ("hc_mult", c.hc_mult as u64, 4),
        ("num_nextn_predict_layers", mtp_ratios.len() as u64, 10),
    ];
    let ratio = c
        .compress_ratios
        .iter()
        .chain(mtp_ratios)
        .copied()
        .max()
        .unwrap_or(0);
    fields.push(("compress_ratios", ratio as u64, 20));
    if let Some(e) = &c.engram {
        let rows = e.num_embeddings.iter().copied().max().unwrap_or(0);
        fields.extend([
            ("engram_num_embeddings", rows, 36),
            ("engram_max_ngram_size", e.max_ngram_size as u64, 6),
            ("engram_n_heads", e.n_heads as u64, 6),
            ("engram_head_dim", e.head_dim as u64, 12),
        ]);
    }
    if let Some(d) = &c.dspark {
        fields.extend([
            ("num_nextn_predict_layers", d.stages as u64, 10),
            ("dspark_markov_rank", d.markov_rank as u64, 16),
            ("dspark_n_routed_experts", d.n_routed_experts as u64, 12),
        ]);
    }
    match fields.into_iter().find(|&(_, v, bits)| v > 1 << bits) {
        Some((name, v, bits)) => Err(PlanError::Invalid(format!(
            "config field `{name}` = {v} is beyond what a plan covers (at most {})",
            1u64 << bits
        ))),
        None => Ok(()),
    }
}

/// Where the Engram tables live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EngramPlacement {
    /// On every device, like the other dense weights.
    #[default]
    Replicated,
    /// Rows split evenly over the devices.
    Sharded,
    /// In host memory (lookups are known from the token ids ahead of the layer).
    Host,
}

/// What to plan for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanOptions {
    /// Devices (at least 1).
    pub devices: usize,
    /// Memory of each device; `None` plans weights and cache without a fit.
    pub device_memory: Option<u64>,
    /// Bytes of each device held back (activations, workspace).
    pub reserve: u64,
    /// Split the routed experts over the devices.
    pub expert_parallel: bool,
    /// Where the Engram tables live.
    pub engram: EngramPlacement,
    /// Context tokens per sequence; `None`: the config's `max_position_embeddings`, else
    /// [`DEFAULT_CONTEXT`].
    pub context: Option<usize>,
    /// Sequences over all devices that must fit; `None`: report how many do.
    pub sequences: Option<u64>,
    /// Cache layout.
    pub kv: KvOptions,
}

impl Default for PlanOptions {
    fn default() -> Self {
        Self {
            devices: 1,
            device_memory: None,
            reserve: 0,
            expert_parallel: false,
            engram: EngramPlacement::Replicated,
            context: None,
            sequences: None,
            kv: KvOptions::default(),
        }
    }
}

/// One row of the weight table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WeightRow {
    /// The part's label.
    pub label: &'static str,
    /// Part, format, parameters and checkpoint bytes.
    #[serde(flatten)]
    pub part: WeightPart,
    /// Bytes on the busiest device.
    pub per_device_bytes: u64,
}

/// The weights of a plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WeightPlan {
    /// By part and format.
    pub parts: Vec<WeightRow>,
    /// All parameters (Engram table entries and drafter included).
    pub total_params: u64,
    /// Parameters without the Engram tables and the drafter.
    pub backbone_params: u64,
    /// Routed expert parameters of the backbone.
    pub routed_expert_params: u64,
    /// Checkpoint bytes, scales included.
    pub total_bytes: u64,
    /// Bytes on the busiest device.
    pub per_device_bytes: u64,
    /// Bytes kept in host memory (Engram tables with [`EngramPlacement::Host`]).
    pub host_bytes: u64,
    /// Published figures and our difference to them.
    pub published: Option<PublishedCheck>,
}

/// The plan's totals against published figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PublishedCheck {
    /// The published figures.
    #[serde(flatten)]
    pub published: Published,
    /// Our total bytes minus the published total.
    pub bytes_diff: Option<i64>,
    /// `bytes_diff` as a fraction of the published total.
    pub bytes_diff_fraction: Option<f64>,
    /// Our backbone parameters minus the stated count, as a fraction of it.
    pub params_diff_fraction: Option<f64>,
}

/// The cache of a plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvPlan {
    /// Record sizes.
    pub format: KvFormat,
    /// Layers with paged state.
    pub owners: Vec<KvOwner>,
    /// Paged bytes per token (exact).
    pub bytes_per_token: f64,
    /// Tokens per block.
    pub block_size: usize,
    /// Paged bytes per block (entries per block rounded up per layer).
    pub bytes_per_block: u64,
    /// Which window accounting the fit uses.
    pub windows: WindowAccounting,
    /// Window state per sequence under that accounting.
    pub window: WindowState,
    /// Window state per sequence with a window on every layer.
    pub window_all_layers: WindowState,
    /// Drafter windows per sequence.
    pub drafter_window_bytes: u64,
    /// Open compressor rows per sequence.
    pub compressor_bytes: u64,
    /// All fixed state per sequence.
    pub fixed_bytes_per_sequence: u64,
    /// Context tokens planned for.
    pub context: usize,
    /// Blocks one sequence of that context takes.
    pub blocks_per_sequence: u64,
    /// Fixed state plus blocks of one sequence.
    pub bytes_per_sequence: u64,
}

/// How the cache fits in device memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FitPlan {
    /// Memory of each device.
    pub device_memory: u64,
    /// Held back per device.
    pub reserve: u64,
    /// Weights on the busiest device.
    pub weights_per_device: u64,
    /// Left per device for the cache.
    pub kv_budget_per_device: u64,
    /// Sequences of the context one device fits.
    pub sequences_per_device: u64,
    /// Over all devices.
    pub sequences_total: u64,
    /// Sequences requested, when given.
    pub requested_sequences: Option<u64>,
    /// Pool blocks per device once the fixed state of the planned sequences (requested, else
    /// the most that fit) is set aside.
    pub pool_blocks_per_device: u64,
}

/// A memory plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// The model's name.
    pub model: String,
    /// `deepseek_v41` or `deepseek_v4`.
    pub model_type: &'static str,
    /// Devices.
    pub devices: usize,
    /// Whether routed experts are split over the devices.
    pub expert_parallel: bool,
    /// Where the Engram tables live (meaningful for V4.1).
    pub engram: EngramPlacement,
    /// Weights.
    pub weights: WeightPlan,
    /// Cache.
    pub kv: KvPlan,
    /// The fit, when a device memory was given.
    pub fit: Option<FitPlan>,
}

/// Make a plan, or say why the model does not fit.
pub fn plan(m: &PlanModel, o: &PlanOptions) -> Result<Plan, PlanError> {
    if o.devices == 0 {
        return Err(PlanError::Invalid("devices must be at least 1".into()));
    }
    let context = o.context.or(m.max_context).unwrap_or(DEFAULT_CONTEXT);
    if context == 0 {
        return Err(PlanError::Invalid(
            "context must be at least 1 token".into(),
        ));
    }
    if o.kv.block_size > 1 << 24 || o.kv.window_slack > 1 << 16 {
        return Err(PlanError::Invalid(
            "block size (at most 2^24 tokens) or window slack (at most 2^16 rows) too large".into(),
        ));
    }
    if o.sequences == Some(0) {
        return Err(PlanError::Invalid("sequences must be at least 1".into()));
    }
    let weights = plan_weights(m, o);
    let kv = plan_kv(m, o, context)?;
    let fit = match o.device_memory {
        Some(memory) => Some(plan_fit(m, o, memory, &weights, &kv)?),
        None => None,
    };
    Ok(Plan {
        model: m.name.clone(),
        model_type: match m.config.kind {
            ModelKind::V41 => "deepseek_v41",
            ModelKind::V4 => "deepseek_v4",
        },
        devices: o.devices,
        expert_parallel: o.expert_parallel,
        engram: o.engram,
        weights,
        kv,
        fit,
    })
}

fn plan_weights(m: &PlanModel, o: &PlanOptions) -> WeightPlan {
    let n = o.devices as u64;
    let parts: Vec<WeightRow> = weight_parts(m)
        .into_iter()
        .map(|p| {
            let per_device_bytes = match (p.part, p.experts_per_layer) {
                (Part::RoutedExperts | Part::DrafterExperts, Some(e)) if o.expert_parallel => {
                    p.bytes / e * e.div_ceil(n)
                }
                (Part::EngramTables, _) => match o.engram {
                    EngramPlacement::Replicated => p.bytes,
                    EngramPlacement::Sharded => p.bytes.div_ceil(n),
                    EngramPlacement::Host => 0,
                },
                _ => p.bytes,
            };
            WeightRow {
                label: p.part.label(),
                part: p,
                per_device_bytes,
            }
        })
        .collect();
    let sum = |f: &dyn Fn(&WeightRow) -> u64| parts.iter().map(f).sum::<u64>();
    let total_params = sum(&|r| r.part.params);
    let total_bytes = sum(&|r| r.part.bytes);
    let backbone_params = sum(&|r| {
        if r.part.part.in_backbone() {
            r.part.params
        } else {
            0
        }
    });
    let host_bytes = match o.engram {
        EngramPlacement::Host => sum(&|r| {
            if r.part.part == Part::EngramTables {
                r.part.bytes
            } else {
                0
            }
        }),
        _ => 0,
    };
    let published = m.published.map(|p| PublishedCheck {
        published: p,
        bytes_diff: p.total_bytes.map(|t| total_bytes as i64 - t as i64),
        bytes_diff_fraction: p
            .total_bytes
            .map(|t| (total_bytes as f64 - t as f64) / t as f64),
        params_diff_fraction: p
            .backbone_params
            .map(|t| (backbone_params as f64 - t as f64) / t as f64),
    });
    WeightPlan {
        total_params,
        backbone_params,
        routed_expert_params: sum(&|r| {
            if r.part.part == Part::RoutedExperts {
                r.part.params
            } else {
                0
            }
        }),
        total_bytes,
        per_device_bytes: sum(&|r| r.per_device_bytes),
        host_bytes,
        published,
        parts,
    }
}

fn plan_kv(m: &PlanModel, o: &PlanOptions, context: usize) -> Result<KvPlan, PlanError> {
    let c = &m.config;
    let layout = kv_layout(c, m.drafter_stages(), &o.kv)?;
    let part = |name: &str| {
        layout
            .sequence_parts()
            .iter()
            .filter(|p| p.name == name)
            .map(|p| p.bytes)
            .sum::<u64>()
    };
    let blocks_per_sequence = context.div_ceil(o.kv.block_size) as u64;
    let fixed = layout.bytes_per_sequence();
    Ok(KvPlan {
        format: KvFormat::for_config(c),
        owners: kv_owners(c),
        bytes_per_token: kv_bytes_per_token(c),
        block_size: o.kv.block_size,
        bytes_per_block: layout.bytes_per_block(),
        windows: o.kv.windows,
        window: window_state(c, o.kv.window_slack, o.kv.windows),
        window_all_layers: window_state(c, o.kv.window_slack, WindowAccounting::AllLayers),
        drafter_window_bytes: part("drafter.window"),
        compressor_bytes: part("compressor"),
        fixed_bytes_per_sequence: fixed,
        context,
        blocks_per_sequence,
        bytes_per_sequence: blocks_per_sequence
            .saturating_mul(layout.bytes_per_block())
            .saturating_add(fixed),
    })
}

fn plan_fit(
    m: &PlanModel,
    o: &PlanOptions,
    memory: u64,
    w: &WeightPlan,
    kv: &KvPlan,
) -> Result<FitPlan, PlanError> {
    if o.reserve >= memory {
        return Err(PlanError::Invalid(format!(
            "the reserve ({}) leaves nothing of the {} device memory",
            format_bytes(o.reserve),
            format_bytes(memory)
        )));
    }
    let capacity = memory - o.reserve;
    if w.per_device_bytes > capacity {
        let engram_tables = match o.engram {
            EngramPlacement::Replicated => w
                .parts
                .iter()
                .filter(|r| r.part.part == Part::EngramTables)
                .map(|r| r.per_device_bytes)
                .sum(),
            _ => 0,
        };
        return Err(PlanError::WeightsDoNotFit {
            need: w.per_device_bytes,
            memory,
            reserve: o.reserve,
            engram_tables,
        });
    }
    let budget = capacity - w.per_device_bytes;
    let n = o.devices as u64;
    let most = budget / kv.bytes_per_sequence;
    if let Some(s) = o.sequences {
        let per_device = s.div_ceil(n);
        if per_device > most {
            return Err(PlanError::SequencesDoNotFit {
                sequences: s,
                per_device,
                context: kv.context,
                need: per_device.saturating_mul(kv.bytes_per_sequence),
                available: budget,
            });
        }
    } else if most == 0 {
        return Err(PlanError::ContextDoesNotFit {
            context: kv.context,
            need: kv.bytes_per_sequence,
            available: budget,
        });
    }
    let planned = o.sequences.map_or(most, |s| s.div_ceil(n));
    let layout = kv_layout(&m.config, m.drafter_stages(), &o.kv)?;
    let pool = layout
        .blocks_for_budget(budget, planned)
        .map_err(PlanError::Layout)?;
    Ok(FitPlan {
        device_memory: memory,
        reserve: o.reserve,
        weights_per_device: w.per_device_bytes,
        kv_budget_per_device: budget,
        sequences_per_device: most,
        sequences_total: most.saturating_mul(n),
        requested_sequences: o.sequences,
        pool_blocks_per_device: pool as u64,
    })
}

/// Bytes in decimal units with two decimals: `510.29 GB`, `113.92 kB`, `890 B`.
pub fn format_bytes(b: u64) -> String {
    let f = b as f64;
    if f >= 1e12 {
        format!("{:.2} TB", f / 1e12)
    } else if f >= 1e9 {
        format!("{:.2} GB", f / 1e9)
    } else if f >= 1e6 {
        format!("{:.2} MB", f / 1e6)
    } else if f >= 1e3 {
        format!("{:.2} kB", f / 1e3)
    } else {
        format!("{b} B")
    }
}

/// Bytes in GiB, trailing zeros trimmed: `141 GiB`, `79.5 GiB`.
pub fn format_gib(b: u64) -> String {
    let s = format!("{:.2}", b as f64 / (1u64 << 30) as f64);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s} GiB")
}

/// An integer with thousands separators: `1,048,576`.
pub fn format_count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests;

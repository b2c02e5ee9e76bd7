//! The published DeepSeek Flash configs, embedded, with the figures published about them.

/// Figures published about a checkpoint, to check the plan's arithmetic against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Published {
    /// `total_size` of the checkpoint's `model.safetensors.index.json`, in bytes.
    pub total_bytes: Option<u64>,
    /// Stated parameter count of the backbone (without Engram tables and drafter).
    pub backbone_params: Option<u64>,
    /// Where the figures come from.
    pub source: &'static str,
}

/// A built-in config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    /// The name `--preset` takes.
    pub name: &'static str,
    /// The model's name.
    pub title: &'static str,
    /// The config JSON (HF layout).
    pub json: &'static str,
    /// What was published about the checkpoint.
    pub published: Published,
}

/// DeepSeek-V4.1-Flash, from the config table of v41-architecture.md section 1 (HF layout,
/// `text_config` nested). Left out: `vision_config` (the document gives its values but not
/// its key names, and the config parser ignores it, so the vision tower is not counted).
pub const V41_FLASH: Preset = Preset {
    name: "v4.1-flash",
    title: "DeepSeek-V4.1-Flash",
    json: include_str!("presets/deepseek-v4.1-flash.json"),
    published: Published {
        total_bytes: Some(510_286_023_000),
        backbone_params: Some(552_000_000_000),
        source: "checkpoint index total_size 510,286,023,000 B (v41-architecture.md section 12, \
                 single source); 552 B parameters without Engram tables and DSpark (the issue; \
                 the document says 551.6 B)",
    },
};

/// DeepSeek-V4-Flash, from the V4-Flash column of v41-architecture.md section 1 and
/// v4-architecture.md sections 0 and 10.1 (upstream legacy keys: `compress_ratios` with the
/// MTP layer's entry, `num_hash_layers`, flat `rope_scaling`). Left out:
/// `max_position_embeddings`, which neither document states for V4-Flash.
pub const V4_FLASH: Preset = Preset {
    name: "v4-flash",
    title: "DeepSeek-V4-Flash",
    json: include_str!("presets/deepseek-v4-flash.json"),
    published: Published {
        total_bytes: None,
        backbone_params: Some(284_300_000_000),
        source: "284.3 B parameters for the 43 backbone layers without MTP \
                 (v4-architecture.md section 10, HF model on the meta device); no checkpoint \
                 total_size is stated",
    },
};

/// Every built-in preset.
pub const PRESETS: &[Preset] = &[V41_FLASH, V4_FLASH];

/// The preset named `name` (case-insensitive; a `deepseek-` prefix is accepted).
pub fn find_preset(name: &str) -> Option<&'static Preset> {
    let n = name.trim().to_ascii_lowercase();
    let n = n.strip_prefix("deepseek-").unwrap_or(&n);
    PRESETS.iter().find(|p| p.name == n)
}

//! `deepinfer plan (--config PATH | --preset NAME) [--devices N] [--device-memory BYTES]
//! [--expert-parallel] [--context TOKENS] [--sequences N] [--json]`: the memory plan of a model
//! on a set of devices (weights by part in their stored formats, cache per token, per block and
//! per sequence, and how many sequences fit). The arithmetic is `crate::plan`'s; a plan that
//! does not fit is one `error:` line saying by how much.

use super::CliResult;
use super::engine_args::parse_bytes;
use crate::plan::{
    EngramPlacement, KvOptions, KvOwner, Plan, PlanModel, PlanOptions, WindowAccounting,
    format_bytes, format_count, format_gib, plan,
};
use clap::Args;
use std::fmt::Write as _;
use std::path::PathBuf;

/// Arguments of `deepinfer plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Model config.json (HF `deepseek_v41` / `deepseek_v4` or DeepSeek's inference names).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// A built-in published config instead of --config: `v4.1-flash` or `v4-flash`.
    #[arg(long, value_name = "NAME")]
    pub preset: Option<String>,
    /// Devices.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub devices: usize,
    /// Memory of each device, e.g. `80G`, `141G` (K/M/G/T are binary: 141G = 141 GiB).
    /// Without it the plan has no fit.
    #[arg(long, value_name = "BYTES")]
    pub device_memory: Option<String>,
    /// Memory of each device to hold back for activations and workspace (e.g. `8G`).
    #[arg(long, value_name = "BYTES")]
    pub reserve: Option<String>,
    /// Split the routed experts over the devices (dense weights stay on every device).
    #[arg(long)]
    pub expert_parallel: bool,
    /// Where V4.1's Engram tables live: `replicated` (on every device), `sharded` (rows split
    /// over the devices) or `host` (host memory).
    #[arg(long, default_value = "replicated", value_name = "WHERE")]
    pub engram: String,
    /// Context tokens per sequence (default: the config's max_position_embeddings, else 8192).
    #[arg(long, value_name = "TOKENS")]
    pub context: Option<usize>,
    /// Sequences over all devices that must fit (default: report how many do).
    #[arg(long, value_name = "N")]
    pub sequences: Option<u64>,
    /// Tokens per cache block.
    #[arg(long, default_value_t = 128, value_name = "TOKENS")]
    pub block_size: usize,
    /// Window rows kept beyond the sliding window (speculative slack; DeepSeek's rule uses 6).
    #[arg(long, default_value_t = 6, value_name = "ROWS")]
    pub spec_slack: usize,
    /// Fit with a window on every layer (exact mode) instead of the published bounded-replay
    /// accounting (V4.1: layers from the last KV source on).
    #[arg(long)]
    pub exact_windows: bool,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Run the subcommand.
pub fn run(a: &PlanArgs) -> CliResult {
    let model = match (&a.config, &a.preset) {
        (Some(path), None) => PlanModel::from_file(path)?,
        (None, Some(name)) => PlanModel::preset(name)?,
        _ => {
            return Err("give either --config PATH or --preset NAME (v4.1-flash, v4-flash)".into());
        }
    };
    let bytes = |flag: &str, v: &Option<String>| -> Result<Option<u64>, String> {
        v.as_deref()
            .map(|s| parse_bytes(s).map_err(|e| format!("--{flag}: {e}")))
            .transpose()
    };
    let engram = match a.engram.trim().to_ascii_lowercase().as_str() {
        "replicated" => EngramPlacement::Replicated,
        "sharded" => EngramPlacement::Sharded,
        "host" => EngramPlacement::Host,
        other => {
            return Err(format!(
                "--engram: unknown placement `{other}` (replicated, sharded, host)"
            )
            .into());
        }
    };
    if a.devices == 0 {
        return Err("--devices must be at least 1".into());
    }
    let opts = PlanOptions {
        devices: a.devices,
        device_memory: bytes("device-memory", &a.device_memory)?,
        reserve: bytes("reserve", &a.reserve)?.unwrap_or(0),
        expert_parallel: a.expert_parallel,
        engram,
        context: a.context,
        sequences: a.sequences,
        kv: KvOptions {
            block_size: a.block_size,
            window_slack: a.spec_slack,
            windows: if a.exact_windows {
                WindowAccounting::AllLayers
            } else {
                WindowAccounting::BoundedReplay
            },
        },
    };
    let p = plan(&model, &opts)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&p)?);
    } else {
        print!("{}", render(&p));
    }
    Ok(())
}

/// Parameters with a unit: `543.58 B`, `24.58 M`.
fn params(n: u64) -> String {
    let f = n as f64;
    if f >= 1e9 {
        format!("{:.2} B", f / 1e9)
    } else if f >= 1e6 {
        format!("{:.2} M", f / 1e6)
    } else if f >= 1e3 {
        format!("{:.2} k", f / 1e3)
    } else {
        n.to_string()
    }
}

/// Signed percentage: `+0.09 %`.
fn pct(frac: f64) -> String {
    format!("{:+.2} %", frac * 100.0)
}

/// The owners grouped by (ratio, bytes per entry): `layers 2, 8, 14: ratio 2, 356 B/entry`.
fn owners(os: &[KvOwner]) -> String {
    let mut groups: Vec<(usize, u64, Vec<usize>)> = Vec::new();
    for o in os {
        match groups
            .iter_mut()
            .find(|g| g.0 == o.ratio && g.1 == o.bytes_per_entry)
        {
            Some(g) => g.2.push(o.layer),
            None => groups.push((o.ratio, o.bytes_per_entry, vec![o.layer])),
        }
    }
    let parts: Vec<String> = groups
        .iter()
        .map(|(r, b, ls)| {
            let which = match ls.len() {
                1 => format!("layer {}", ls[0]),
                n if n <= 6 => {
                    let l: Vec<String> = ls.iter().map(|l| l.to_string()).collect();
                    format!("layers {}", l.join(", "))
                }
                n => format!("{n} layers"),
            };
            let per = if *r == 1 {
                "token".to_string()
            } else {
                format!("{r} tokens")
            };
            format!("{which}: one {b} B entry per {per}")
        })
        .collect();
    parts.join("; ")
}

/// A byte count per token, exact: `890 B`, `3,514.25 B`.
fn per_token(b: f64) -> String {
    let fixed = format!("{b:.2}");
    let (int, frac) = fixed.split_once('.').unwrap_or((&fixed, "00"));
    let int = format_count(int.parse().unwrap_or(0));
    if frac == "00" {
        format!("{int} B")
    } else {
        format!("{int}.{frac} B")
    }
}

/// The human table.
pub fn render(p: &Plan) -> String {
    let mut s = String::new();
    let placement = match (p.devices, p.expert_parallel) {
        (_, true) => ", expert parallel",
        (1, false) => "",
        (_, false) => ", every device holds all weights",
    };
    let _ = writeln!(
        s,
        "{} ({}): {} device{}{placement}",
        p.model,
        p.model_type,
        p.devices,
        if p.devices == 1 { "" } else { "s" }
    );
    render_weights(&mut s, p);
    render_kv(&mut s, p);
    render_fit(&mut s, p);
    s
}

fn render_weights(s: &mut String, p: &Plan) {
    let w = &p.weights;
    let _ = writeln!(
        s,
        "\nweights{:20}{:32}{:>12}{:>13}{:>13}",
        "", "stored as", "parameters", "checkpoint", "per device"
    );
    for r in &w.parts {
        let _ = writeln!(
            s,
            "  {:25}{:32}{:>12}{:>13}{:>13}",
            r.label,
            r.part.format_label,
            params(r.part.params),
            format_bytes(r.part.bytes),
            format_bytes(r.per_device_bytes)
        );
    }
    let _ = writeln!(
        s,
        "  {:25}{:32}{:>12}{:>13}{:>13}",
        "total",
        "",
        params(w.total_params),
        format_bytes(w.total_bytes),
        format_bytes(w.per_device_bytes)
    );
    if w.host_bytes > 0 {
        let _ = writeln!(s, "  in host memory: {}", format_bytes(w.host_bytes));
    }
    let _ = write!(
        s,
        "  backbone (no Engram tables, no drafter): {} parameters, {} in routed experts",
        params(w.backbone_params),
        params(w.routed_expert_params)
    );
    match w
        .published
        .as_ref()
        .and_then(|c| c.published.backbone_params.zip(c.params_diff_fraction))
    {
        Some((n, f)) => {
            let _ = writeln!(s, "; stated {} ({})", params(n), pct(f));
        }
        None => s.push('\n'),
    }
    if let Some(c) = &w.published
        && let (Some(t), Some(d), Some(f)) =
            (c.published.total_bytes, c.bytes_diff, c.bytes_diff_fraction)
    {
        let _ = writeln!(
            s,
            "  published checkpoint total_size: {} B ({}); ours {}{} ({})",
            format_count(t),
            format_bytes(t),
            if d < 0 { "-" } else { "+" },
            format_bytes(d.unsigned_abs()),
            pct(f)
        );
    }
}

fn render_kv(s: &mut String, p: &Plan) {
    let k = &p.kv;
    let f = &k.format;
    let _ = writeln!(
        s,
        "\ncache (records: window row {} B, compressed entry {} B, indexer key {} B)",
        f.window_row, f.entry, f.index_key
    );
    let _ = writeln!(
        s,
        "  per token         {} ({})",
        per_token(k.bytes_per_token),
        owners(&k.owners)
    );
    let _ = writeln!(
        s,
        "  per block         {} B ({} tokens)",
        format_count(k.bytes_per_block),
        k.block_size
    );
    let all = &k.window_all_layers;
    let which = match k.windows {
        WindowAccounting::BoundedReplay if k.window.layers < all.layers => format!(
            "bounded replay; a window on all {} layers: {} B",
            all.layers,
            format_count(all.bytes)
        ),
        _ => "a window on every layer".to_string(),
    };
    let _ = writeln!(
        s,
        "  window state      {} B per sequence ({} layers x {} rows x {} B; {which})",
        format_count(k.window.bytes),
        k.window.layers,
        k.window.rows,
        k.window.row_bytes
    );
    if k.drafter_window_bytes > 0 {
        let _ = writeln!(
            s,
            "  drafter windows   {} B per sequence",
            format_count(k.drafter_window_bytes)
        );
    }
    if k.compressor_bytes > 0 {
        let _ = writeln!(
            s,
            "  compressor rows   {} B per sequence (open rows, f32)",
            format_count(k.compressor_bytes)
        );
    }
    let _ = writeln!(
        s,
        "  one sequence      {} at {} tokens ({} blocks + {} fixed)",
        format_bytes(k.bytes_per_sequence),
        format_count(k.context as u64),
        format_count(k.blocks_per_sequence),
        format_bytes(k.fixed_bytes_per_sequence)
    );
}

fn render_fit(s: &mut String, p: &Plan) {
    let Some(f) = &p.fit else {
        let _ = writeln!(s, "\nfit: give --device-memory BYTES to fit sequences");
        return;
    };
    let _ = writeln!(
        s,
        "\nfit (each device: {} = {})",
        format_bytes(f.device_memory),
        format_gib(f.device_memory)
    );
    if f.reserve > 0 {
        let _ = writeln!(s, "  reserve           {}", format_bytes(f.reserve));
    }
    let _ = writeln!(
        s,
        "  weights           {}",
        format_bytes(f.weights_per_device)
    );
    let _ = writeln!(
        s,
        "  left for cache    {}",
        format_bytes(f.kv_budget_per_device)
    );
    let _ = writeln!(
        s,
        "  sequences         {} per device, {} in all, of {} tokens",
        format_count(f.sequences_per_device),
        format_count(f.sequences_total),
        format_count(p.kv.context as u64)
    );
    if let Some(r) = f.requested_sequences {
        let _ = writeln!(s, "  requested         {} (fit)", format_count(r));
    }
    let _ = writeln!(
        s,
        "  pool blocks       {} per device",
        format_count(f.pool_blocks_per_device)
    );
}

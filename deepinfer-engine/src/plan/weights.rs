//! The weight inventory of a model: every tensor the checkpoint holds (upstream names, see
//! v41-architecture.md section 13 and v4-architecture.md section 10), grouped by part of the
//! model and stored format, with parameter counts and bytes.

use super::PlanModel;
use super::format::{CheckpointFormat, StoredFormat};
use crate::config::{AttnKind, ModelConfig, ModelKind};
use serde::Serialize;

/// A part of the model, for the weight table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    /// `embed.weight` and `head.weight`.
    Embedding,
    /// Attention projections (`wq_a`, `wq_b`, `wkv`, `wo_a`, `wo_b`) and sinks.
    Attention,
    /// Compressors of the compressed-KV layers (V4.1 KV sources; V4 CSA / HCA layers).
    Compressors,
    /// Lightning indexers (V4.1 index sources; V4 CSA layers, with their own compressors).
    Indexers,
    /// Router weights and biases (and V4's `tid2eid` hash tables).
    Routers,
    /// The shared expert of every layer.
    SharedExperts,
    /// The routed experts of the backbone layers: split over the devices with expert
    /// parallelism.
    RoutedExperts,
    /// Hyper-connection (mHC) mixing parameters (`hc_*`).
    HyperConnections,
    /// RMSNorm weights.
    Norms,
    /// Engram n-gram embedding tables (V4.1 layers 1 and 14).
    EngramTables,
    /// Engram `wkv`, `q_weight`, `k_weight`.
    EngramProjections,
    /// The drafter (V4.1 DSpark stages, V4 MTP layers) apart from its routed experts.
    Drafter,
    /// The drafter's routed experts (split like the backbone's).
    DrafterExperts,
}

impl Part {
    /// A short human label.
    pub fn label(&self) -> &'static str {
        match self {
            Part::Embedding => "embedding + head",
            Part::Attention => "attention",
            Part::Compressors => "compressors",
            Part::Indexers => "indexers",
            Part::Routers => "routers",
            Part::SharedExperts => "shared experts",
            Part::RoutedExperts => "routed experts",
            Part::HyperConnections => "hyper-connections",
            Part::Norms => "norms",
            Part::EngramTables => "Engram tables",
            Part::EngramProjections => "Engram projections",
            Part::Drafter => "drafter",
            Part::DrafterExperts => "drafter routed experts",
        }
    }

    /// Whether the part belongs to the backbone count (everything but the Engram tables and
    /// the drafter).
    pub fn in_backbone(&self) -> bool {
        !matches!(
            self,
            Part::EngramTables | Part::Drafter | Part::DrafterExperts
        )
    }
}

/// The tensors of one part in one stored format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WeightPart {
    /// The part.
    pub part: Part,
    /// Its stored format.
    pub format: StoredFormat,
    /// The format's label (for readers of the JSON).
    pub format_label: String,
    /// Parameters (values, not counting scales).
    pub params: u64,
    /// Bytes in the checkpoint, scales included.
    pub bytes: u64,
    /// For routed experts: experts per layer (the unit expert parallelism splits).
    pub experts_per_layer: Option<u64>,
}

/// Accumulates tensors into (part, format) rows.
struct Inventory {
    fmt: CheckpointFormat,
    parts: Vec<WeightPart>,
    /// Route everything into the drafter parts (while adding drafter stages).
    drafter: bool,
}

impl Inventory {
    /// Add `count` tensors of shape `[rows, cols]`.
    fn add(&mut self, part: Part, format: StoredFormat, rows: u64, cols: u64, count: u64) {
        let part = match (self.drafter, part) {
            (false, p) => p,
            (true, Part::RoutedExperts) => Part::DrafterExperts,
            (true, _) => Part::Drafter,
        };
        let params = rows * cols * count;
        let bytes = format.bytes(rows, cols) * count;
        match self
            .parts
            .iter_mut()
            .find(|p| p.part == part && p.format == format)
        {
            Some(p) => {
                p.params += params;
                p.bytes += bytes;
            }
            None => self.parts.push(WeightPart {
                part,
                format,
                format_label: format.label(),
                params,
                bytes,
                experts_per_layer: None,
            }),
        }
    }

    /// A norm weight of width `n`.
    fn norm(&mut self, n: u64) {
        self.add(Part::Norms, self.fmt.norms, 1, n, 1);
    }

    /// `hc_attn_*` and `hc_ffn_*` of one layer: `fn` [M, N*D], `base` [M], `scale` [3].
    fn hyper_connections(&mut self, c: &ModelConfig) {
        let (m, nd) = (c.hc_mix_dim() as u64, (c.hc_mult * c.hidden_size) as u64);
        for _ in 0..2 {
            self.add(Part::HyperConnections, StoredFormat::F32, m, nd, 1);
            self.add(Part::HyperConnections, StoredFormat::F32, 1, m, 1);
            self.add(Part::HyperConnections, StoredFormat::F32, 1, 3, 1);
        }
    }

    /// The attention projections every layer has, with `attn_norm` and `ffn_norm`.
    fn attention(&mut self, c: &ModelConfig) {
        let dense = self.fmt.dense;
        let (dm, h, d) = (c.hidden_size as u64, c.num_heads as u64, c.head_dim as u64);
        let (rq, g, ro) = (
            c.q_lora_rank as u64,
            c.o_groups as u64,
            c.o_lora_rank as u64,
        );
        self.norm(dm); // attn_norm
        self.norm(dm); // ffn_norm
        self.add(Part::Attention, dense, rq, dm, 1); // wq_a
        self.norm(rq); // q_norm
        self.add(Part::Attention, dense, h * d, rq, 1); // wq_b
        self.add(Part::Attention, dense, d, dm, 1); // wkv
        self.norm(d); // kv_norm
        // wo_a: bf16 as DeepSeek's reference declares it (a grouped einsum; HF's V4
        // integration treats it as FP8, unconfirmed by a shard header).
        self.add(Part::Attention, StoredFormat::Bf16, g * ro, h * d / g, 1);
        self.add(Part::Attention, dense, dm, g * ro, 1); // wo_b
        self.add(Part::Attention, StoredFormat::F32, 1, h, 1); // attn_sink
    }

    /// Router, shared expert and `experts` routed experts of one MoE block.
    fn moe(&mut self, c: &ModelConfig, experts: u64, hash: bool, bias_vl: bool) {
        let (dm, i) = (c.hidden_size as u64, c.moe_intermediate_size as u64);
        self.add(Part::Routers, StoredFormat::Bf16, experts, dm, 1); // gate.weight
        if hash {
            let (v, k) = (c.vocab_size as u64, c.num_experts_per_tok as u64);
            self.add(Part::Routers, StoredFormat::I32, v, k, 1); // gate.tid2eid
        } else {
            self.add(Part::Routers, StoredFormat::F32, 1, experts, 1); // gate.bias
        }
        if bias_vl {
            self.add(Part::Routers, StoredFormat::F32, 1, experts, 1); // gate.bias_vl
        }
        let dense = self.fmt.dense;
        self.add(Part::SharedExperts, dense, i, dm, 2); // w1, w3
        self.add(Part::SharedExperts, dense, dm, i, 1); // w2
        let ef = self.fmt.experts;
        self.add(Part::RoutedExperts, ef, i, dm, 2 * experts); // w1, w3
        self.add(Part::RoutedExperts, ef, dm, i, experts); // w2
        let part = if self.drafter {
            Part::DrafterExperts
        } else {
            Part::RoutedExperts
        };
        if let Some(p) = self
            .parts
            .iter_mut()
            .find(|p| p.part == part && p.format == ef)
        {
            p.experts_per_layer = Some(experts);
        }
    }

    /// A V4 compressor (CSA: overlapping, 2x wide; HCA: plain) and, for CSA, the indexer.
    fn v4_compressor(&mut self, c: &ModelConfig, kind: AttnKind, ratio: u64) {
        let (dm, d, di) = (
            c.hidden_size as u64,
            c.head_dim as u64,
            c.index_head_dim as u64,
        );
        let bf = StoredFormat::Bf16;
        let wide = if kind == AttnKind::Csa { 2 } else { 1 };
        self.add(Part::Compressors, bf, wide * d, dm, 2); // wkv, wgate
        self.add(Part::Compressors, StoredFormat::F32, ratio, wide * d, 1); // ape
        self.norm(d);
        if kind == AttnKind::Csa {
            self.add(Part::Indexers, bf, 2 * di, dm, 2); // indexer.compressor.wkv, wgate
            self.add(Part::Indexers, StoredFormat::F32, ratio, 2 * di, 1); // indexer ape
            self.norm(di);
            let (hi, rq) = (c.index_n_heads as u64, c.q_lora_rank as u64);
            self.add(Part::Indexers, self.fmt.dense, hi * di, rq, 1); // indexer.wq_b
            self.add(Part::Indexers, bf, hi, dm, 1); // indexer.weights_proj
        }
    }
}

/// Every tensor of the checkpoint, as (part, format) rows in a fixed order.
pub fn weight_parts(m: &PlanModel) -> Vec<WeightPart> {
    let c = &m.config;
    let mut inv = Inventory {
        fmt: m.format,
        parts: Vec::new(),
        drafter: false,
    };
    let (v, dm) = (c.vocab_size as u64, c.hidden_size as u64);
    inv.add(Part::Embedding, StoredFormat::Bf16, v, dm, 2); // embed, head
    inv.norm(dm); // norm
    match c.kind {
        ModelKind::V41 => v41_backbone(&mut inv, c, m.vision),
        ModelKind::V4 => v4_backbone(&mut inv, c),
    }
    inv.drafter = true;
    match c.kind {
        ModelKind::V41 => v41_drafter(&mut inv, c, m.vision),
        ModelKind::V4 => v4_mtp(&mut inv, c, &m.mtp_ratios),
    }
    inv.parts
        .sort_by(|a, b| a.part.cmp(&b.part).then(b.bytes.cmp(&a.bytes)));
    inv.parts
}

fn v41_backbone(inv: &mut Inventory, c: &ModelConfig, vision: bool) {
    let (dm, d, di) = (
        c.hidden_size as u64,
        c.head_dim as u64,
        c.index_head_dim as u64,
    );
    let (hi, rq) = (c.index_n_heads as u64, c.q_lora_rank as u64);
    let bf = StoredFormat::Bf16;
    for l in 0..c.num_layers {
        inv.hyper_connections(c);
        inv.attention(c);
        if c.kv_source_layers.contains(&l) {
            let gates = if c.compress_ratios[l] > 1 { 2 } else { 1 };
            inv.add(Part::Compressors, bf, d, dm, gates); // compressor.wkv (+ wgate)
            inv.norm(d); // compressor.norm
            inv.add(Part::Indexers, bf, di, d, 1); // indexer.wk
            inv.norm(di); // indexer.k_norm
        }
        if c.index_source_layers.contains(&l) {
            inv.add(Part::Indexers, inv.fmt.dense, hi * di, rq, 1); // indexer.wq_b
            inv.add(Part::Indexers, bf, hi, dm, 1); // indexer.weights_proj
        }
        inv.moe(c, c.n_routed_experts as u64, false, vision);
    }
    if let Some(e) = &c.engram {
        let n = c.hc_mult as u64;
        let width = ((e.max_ngram_size - 1) * e.n_heads * e.head_dim) as u64;
        for &rows in &e.num_embeddings {
            let table = inv.fmt.tables;
            inv.add(Part::EngramTables, table, rows, e.head_dim as u64, 1); // embed (+ scale)
            inv.add(
                Part::EngramProjections,
                inv.fmt.dense,
                (n + 1) * dm,
                width,
                1,
            ); // wkv
            inv.add(Part::EngramProjections, bf, n, dm, 2); // q_weight, k_weight
        }
    }
}

fn v41_drafter(inv: &mut Inventory, c: &ModelConfig, vision: bool) {
    let Some(ds) = &c.dspark else { return };
    let dm = c.hidden_size as u64;
    let (v, r) = (c.vocab_size as u64, ds.markov_rank as u64);
    for _ in 0..ds.stages {
        inv.hyper_connections(c);
        inv.attention(c);
        inv.moe(c, ds.n_routed_experts as u64, false, vision);
    }
    let targets = ds.target_layer_ids.len() as u64;
    inv.add(Part::Drafter, inv.fmt.dense, dm, targets * dm, 1); // mtp.0.main_proj
    inv.norm(dm); // mtp.0.main_norm
    inv.norm(dm); // last stage's norm
    inv.add(Part::Drafter, StoredFormat::Bf16, v, r, 2); // markov embed, markov head
    inv.add(Part::Drafter, StoredFormat::Bf16, 1, dm + r, 1); // confidence_head.proj
}

fn v4_backbone(inv: &mut Inventory, c: &ModelConfig) {
    let (n, nd) = (c.hc_mult as u64, (c.hc_mult * c.hidden_size) as u64);
    inv.add(Part::HyperConnections, StoredFormat::F32, n, nd, 1); // hc_head_fn
    inv.add(Part::HyperConnections, StoredFormat::F32, 1, n + 1, 1); // hc_head_base, scale
    for l in 0..c.num_layers {
        inv.hyper_connections(c);
        inv.attention(c);
        let kind = c.attn_kinds[l];
        if matches!(kind, AttnKind::Csa | AttnKind::Hca) {
            inv.v4_compressor(c, kind, c.compress_ratios[l] as u64);
        }
        inv.moe(c, c.n_routed_experts as u64, c.hash_moe[l], false);
    }
}

/// V4's MTP layers: full decoder layers (attention kind from `compress_ratios` past the
/// backbone), plus `e_proj`, `h_proj`, `enorm`, `hnorm`, `norm` and their own head collapse.
fn v4_mtp(inv: &mut Inventory, c: &ModelConfig, ratios: &[usize]) {
    let (dm, n, nd) = (
        c.hidden_size as u64,
        c.hc_mult as u64,
        (c.hc_mult * c.hidden_size) as u64,
    );
    // A ratio is CSA's if a backbone CSA layer uses it, else HCA's.
    let csa_rate = c
        .attn_kinds
        .iter()
        .zip(&c.compress_ratios)
        .find(|(k, _)| **k == AttnKind::Csa)
        .map_or(4, |(_, &r)| r);
    for &r in ratios {
        inv.hyper_connections(c);
        inv.attention(c);
        match r {
            0 => {}
            r if r == csa_rate => inv.v4_compressor(c, AttnKind::Csa, r as u64),
            r => inv.v4_compressor(c, AttnKind::Hca, r as u64),
        }
        inv.moe(c, c.n_routed_experts as u64, false, false);
        inv.add(Part::Drafter, inv.fmt.dense, dm, dm, 2); // e_proj, h_proj
        for _ in 0..3 {
            inv.norm(dm); // enorm, hnorm, norm
        }
        inv.add(Part::Drafter, StoredFormat::F32, n, nd, 1); // hc_head_fn
        inv.add(Part::Drafter, StoredFormat::F32, 1, n + 1, 1); // hc_head_base, scale
    }
}

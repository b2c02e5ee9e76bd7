//! The model's weights on a backend, typed by role. Built from a [`Checkpoint`] through a
//! [`WeightLoader`] so every missing / unexpected / mis-shaped / mis-typed tensor is reported
//! together.

use crate::checkpoint::Checkpoint;
use crate::config::{AttnKind, ModelConfig, ModelKind};
use crate::weights::{Tensor, WeightLoader, WeightProblems};
use deepinfer_kernels::{Backend, KernelError};

/// Loading weights failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadWeightsError {
    /// The checkpoint's tensors do not fit the config.
    #[error(transparent)]
    Tensors(#[from] WeightProblems),
    /// The backend refused an upload.
    #[error("backend: {0}")]
    Backend(#[from] KernelError),
}

/// Hyper-connection parameters of one sublayer (or of V4's head collapse).
#[derive(Debug, Clone)]
pub struct HcW<T> {
    /// `[M, N*D]` mixing projection.
    pub fn_: T,
    /// `[M]` bias.
    pub base: T,
    /// `[3]` (or `[1]` for the head) scales.
    pub scale: T,
}

/// Compressor weights (V4.1 KV sources; V4 CSA/HCA and the V4 indexer's own).
#[derive(Debug, Clone)]
pub struct CompressorW<T> {
    /// `[c or 2c, D]` value projection.
    pub wkv: T,
    /// `[c or 2c, D]` gate projection (absent for V4.1 ratio 1).
    pub wgate: Option<T>,
    /// `[ratio, c or 2c]` slot bias (V4 only).
    pub ape: Option<T>,
    /// `[c]` RMSNorm weight.
    pub norm: T,
}

/// Lightning indexer weights.
#[derive(Debug, Clone)]
pub struct IndexerW<T> {
    /// `[Hi*di, Rq]` query projection.
    pub wq_b: T,
    /// `[Hi, D]` per-head weights.
    pub weights_proj: T,
    /// V4.1 KV sources: `[di, d]` key projection of the latent and its norm.
    pub wk: Option<(T, T)>,
    /// V4: the indexer's own compressor at width di.
    pub compressor: Option<CompressorW<T>>,
}

/// Attention weights of one layer or drafter stage.
#[derive(Debug, Clone)]
pub struct AttnW<T> {
    /// `[Rq, D]`.
    pub wq_a: T,
    /// `[Rq]`.
    pub q_norm: T,
    /// `[H*d, Rq]`.
    pub wq_b: T,
    /// `[d, D]`.
    pub wkv: T,
    /// `[d]`.
    pub kv_norm: T,
    /// `[G, Ro, H*d/G]` (reshaped from `[G*Ro, H*d/G]`).
    pub wo_a: T,
    /// `[D, G*Ro]`.
    pub wo_b: T,
    /// `[H]`.
    pub sink: T,
    /// Compressor, where the layer owns one.
    pub compressor: Option<CompressorW<T>>,
    /// Indexer, where the layer runs one.
    pub indexer: Option<IndexerW<T>>,
}

/// MoE weights.
#[derive(Debug, Clone)]
pub struct FfnW<T> {
    /// `[E, D]` router.
    pub gate: T,
    /// `[E]` selection bias (absent on hash layers).
    pub bias: Option<T>,
    /// `[V, k]` token → experts table (hash layers).
    pub tid2eid: Option<T>,
    /// Routed experts `(w1, w3, w2)`.
    pub experts: Vec<(T, T, T)>,
    /// Shared expert `(w1, w3, w2)`.
    pub shared: (T, T, T),
}

/// Engram weights of one layer.
#[derive(Debug, Clone)]
pub struct EngramW<T> {
    /// `[rows, head_dim]` table.
    pub embed: T,
    /// `[(N+1)*D, cols*head_dim]`.
    pub wkv: T,
    /// `[N, D]`: `q_weight * k_weight`.
    pub qk: T,
}

/// One decoder block (backbone layer or DSpark stage).
#[derive(Debug, Clone)]
pub struct BlockW<T> {
    /// `[D]`.
    pub attn_norm: T,
    /// `[D]`.
    pub ffn_norm: T,
    /// Attention hyper-connection.
    pub hc_attn: HcW<T>,
    /// FFN hyper-connection.
    pub hc_ffn: HcW<T>,
    /// Attention.
    pub attn: AttnW<T>,
    /// MoE.
    pub ffn: FfnW<T>,
    /// Engram (V4.1 Engram layers).
    pub engram: Option<EngramW<T>>,
}

/// DSpark drafter weights (`mtp.*`).
#[derive(Debug, Clone)]
pub struct DSparkW<T> {
    /// `[D, k*D]`.
    pub main_proj: T,
    /// `[D]`.
    pub main_norm: T,
    /// The stages.
    pub stages: Vec<BlockW<T>>,
    /// `[D]` final norm of the last stage.
    pub norm: T,
    /// `[V, r]` Markov embedding.
    pub markov_embed: T,
    /// `[V, r]` Markov head.
    pub markov_head: T,
    /// `[1, D + r]` confidence head.
    pub confidence: T,
}

/// All weights of a model.
#[derive(Debug, Clone)]
pub struct ModelW<T> {
    /// `[V, D]`.
    pub embed: T,
    /// `[V, D]`.
    pub head: T,
    /// `[D]`.
    pub norm: T,
    /// V4's head collapse.
    pub hc_head: Option<HcW<T>>,
    /// Backbone layers.
    pub layers: Vec<BlockW<T>>,
    /// DSpark drafter (V4.1 with `mtp.*`).
    pub dspark: Option<DSparkW<T>>,
    /// Checkpoint tensors of parts the engine does not run, skipped on load (sorted).
    pub skipped: Vec<String>,
}

/// How the matrices that only feed `matmul` (projections, experts, router, head) are held on
/// the backend. Everything else (norms, biases, tables, hyper-connection scales) stays f32.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MatmulWeights {
    /// Keep the stored precision: bf16 / f16 matrices stay 16-bit on the backend (the kernels
    /// widen them exactly, so the logits are bit-identical to f32 copies of the same values,
    /// at half the memory traffic); f32 stays f32; FP8 e4m3 with block scales and FP4 e2m1
    /// with per-32 UE8M0 scales stay quantised (1 and 0.5 bytes per weight plus scales) and
    /// are multiplied by the quantised kernels (in batch-invariant mode bit-identical to f32
    /// copies of the dequantised values).
    #[default]
    AsStored,
    /// Decode every matmul matrix to f32 on load (FP8 and FP4 dequantised, 16-bit widened):
    /// four bytes per weight, the reference the quantised path is checked against.
    F32,
    /// Round every matmul matrix to bf16 (an approximation for f32 checkpoints, as running
    /// transformers in bf16 is; activations and accumulation stay f32).
    Bf16,
}

/// Options of [`crate::Model::load_with_options`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Precision of the matmul matrices.
    pub matmul_weights: MatmulWeights,
}

struct Up<'a, 'b, B: Backend> {
    ld: WeightLoader<'a>,
    be: &'b B,
    opts: LoadOptions,
}

type KResult<T> = Result<T, KernelError>;

impl<B: Backend> Up<'_, '_, B> {
    fn put(&mut self, t: &Tensor, shape: &[usize]) -> KResult<B::Tensor> {
        self.be.upload_f32(t.data(), shape)
    }
    fn w(&mut self, name: &str, shape: &[usize]) -> KResult<B::Tensor> {
        let t = self.ld.f32(name, shape);
        self.put(&t, shape)
    }
    /// A matrix used only as a `matmul` weight: 16-bit when stored so or when asked for.
    /// Kept as stored (read in place from the checkpoint's mapping where the backend can)
    /// unless an f32 or f16 matrix must be rounded to bf16.
    fn m(&mut self, name: &str, shape: &[usize]) -> KResult<B::Tensor> {
        let stored = self.ld.stored_dtype(name);
        if self.opts.matmul_weights == MatmulWeights::AsStored
            && let Some(q) = self.ld.stored_quant(name, shape)
        {
            return self.be.upload_quant(&q);
        }
        let as_stored = self.opts.matmul_weights == MatmulWeights::AsStored
            || (stored == Some(safetensors::Dtype::BF16)
                && self.opts.matmul_weights != MatmulWeights::F32);
        if as_stored && let Some(t) = self.shared(name, shape) {
            return t;
        }
        let t = self.ld.f32(name, shape);
        self.put_m(&t, shape, stored)
    }
    /// A lookup table (embeddings): only its rows are read, widened to f32 exactly, so it is
    /// kept as stored.
    fn table(&mut self, name: &str, shape: &[usize]) -> KResult<B::Tensor> {
        match self.shared(name, shape) {
            Some(t) => t,
            None => self.w(name, shape),
        }
    }
    fn shared(&mut self, name: &str, shape: &[usize]) -> Option<KResult<B::Tensor>> {
        let (bytes, start, dtype) = self.ld.stored_as_is(name, shape)?;
        Some(self.be.upload_shared(bytes, start, dtype, shape))
    }
    fn put_m(
        &mut self,
        t: &Tensor,
        shape: &[usize],
        stored: Option<safetensors::Dtype>,
    ) -> KResult<B::Tensor> {
        use safetensors::Dtype;
        match (self.opts.matmul_weights, stored) {
            (MatmulWeights::F32, _) => self.put(t, shape),
            (MatmulWeights::Bf16, _) | (_, Some(Dtype::BF16)) => {
                let v: Vec<half::bf16> =
                    t.data().iter().map(|&x| half::bf16::from_f32(x)).collect();
                self.be.upload_bf16(&v, shape)
            }
            (_, Some(Dtype::F16)) => {
                let v: Vec<half::f16> = t.data().iter().map(|&x| half::f16::from_f32(x)).collect();
                self.be.upload_f16(&v, shape)
            }
            _ => self.put(t, shape),
        }
    }
    fn w_as(&mut self, name: &str, shape: &[usize], as_shape: &[usize]) -> KResult<B::Tensor> {
        let t = self.ld.f32(name, shape);
        self.put(&t, as_shape)
    }
    fn expert(
        &mut self,
        prefix: &str,
        e: usize,
        which: &str,
        shape: &[usize],
    ) -> KResult<B::Tensor> {
        let stored = self.ld.expert_stored_dtype(prefix, e, which);
        let unfused = format!("{prefix}.experts.{e}.{which}.weight");
        if self.opts.matmul_weights == MatmulWeights::AsStored
            && let Some(q) = self.ld.stored_quant(&unfused, shape)
        {
            return self.be.upload_quant(&q);
        }
        let as_stored = self.opts.matmul_weights == MatmulWeights::AsStored
            || (stored == Some(safetensors::Dtype::BF16)
                && self.opts.matmul_weights != MatmulWeights::F32);
        if as_stored && let Some(t) = self.shared(&unfused, shape) {
            return t;
        }
        let t = self.ld.expert(prefix, e, which, shape);
        self.put_m(&t, shape, stored)
    }
    fn ints(&mut self, name: &str, shape: &[usize]) -> KResult<B::Tensor> {
        let v = self.ld.ints(name, shape);
        self.be.upload_i64(&v, shape)
    }
}

impl<T> ModelW<T> {
    /// Load every tensor the config needs from `ck` onto `be`.
    pub fn load<B: Backend<Tensor = T>>(
        cfg: &ModelConfig,
        ck: &Checkpoint,
        be: &B,
    ) -> Result<Self, LoadWeightsError> {
        Self::load_with(cfg, ck, be, LoadOptions::default())
    }

    /// [`ModelW::load`] with explicit options.
    pub fn load_with<B: Backend<Tensor = T>>(
        cfg: &ModelConfig,
        ck: &Checkpoint,
        be: &B,
        opts: LoadOptions,
    ) -> Result<Self, LoadWeightsError> {
        let mut up = Up {
            ld: WeightLoader::new(ck).with_fp8_block(cfg.weight_block_size),
            be,
            opts,
        };
        let (v, d_model) = (cfg.vocab_size, cfg.hidden_size);
        let embed = up.table("embed.weight", &[v, d_model])?;
        let head = up.m("head.weight", &[v, d_model])?;
        let norm = up.w("norm.weight", &[d_model])?;
        let n = cfg.hc_mult;
        let hc_head = match cfg.kind {
            ModelKind::V4 => Some(HcW {
                fn_: up.m("hc_head_fn", &[n, n * d_model])?,
                base: up.w("hc_head_base", &[n])?,
                scale: up.w("hc_head_scale", &[1])?,
            }),
            ModelKind::V41 => None,
        };
        let layers = (0..cfg.num_layers)
            .map(|l| {
                load_block(
                    &mut up,
                    cfg,
                    &format!("layers.{l}"),
                    Some(l),
                    cfg.n_routed_experts,
                )
            })
            .collect::<KResult<Vec<_>>>()?;
        let dspark = match cfg.dspark.as_ref() {
            None => None,
            Some(ds) => {
                let stages = (0..ds.stages)
                    .map(|j| {
                        load_block(&mut up, cfg, &format!("mtp.{j}"), None, ds.n_routed_experts)
                    })
                    .collect::<KResult<Vec<_>>>()?;
                let last = format!("mtp.{}", ds.stages - 1);
                Some(DSparkW {
                    main_proj: up.m(
                        "mtp.0.main_proj.weight",
                        &[d_model, ds.target_layer_ids.len() * d_model],
                    )?,
                    main_norm: up.w("mtp.0.main_norm.weight", &[d_model])?,
                    stages,
                    norm: up.w(&format!("{last}.norm.weight"), &[d_model])?,
                    markov_embed: up.w(
                        &format!("{last}.markov_head.embed.weight"),
                        &[v, ds.markov_rank],
                    )?,
                    markov_head: up.w(
                        &format!("{last}.markov_head.head.weight"),
                        &[v, ds.markov_rank],
                    )?,
                    confidence: up.w(
                        &format!("{last}.confidence_head.proj.weight"),
                        &[1, d_model + ds.markov_rank],
                    )?,
                })
            }
        };
        let skipped = up.ld.finish()?;
        Ok(ModelW {
            embed,
            head,
            norm,
            hc_head,
            layers,
            dspark,
            skipped,
        })
    }
}

fn load_hc<B: Backend>(
    up: &mut Up<'_, '_, B>,
    cfg: &ModelConfig,
    p: &str,
) -> KResult<HcW<B::Tensor>> {
    let (n, d) = (cfg.hc_mult, cfg.hidden_size);
    let m = cfg.hc_mix_dim();
    Ok(HcW {
        fn_: up.m(&format!("{p}_fn"), &[m, n * d])?,
        base: up.w(&format!("{p}_base"), &[m])?,
        scale: up.w(&format!("{p}_scale"), &[3])?,
    })
}

/// `layer`: the backbone index, or None for a drafter stage (ratio 0, no Engram).
fn load_block<B: Backend>(
    up: &mut Up<'_, '_, B>,
    cfg: &ModelConfig,
    p: &str,
    layer: Option<usize>,
    n_experts: usize,
) -> KResult<BlockW<B::Tensor>> {
    let dm = cfg.hidden_size;
    let (h, hd, rq) = (cfg.num_heads, cfg.head_dim, cfg.q_lora_rank);
    let (g, ro) = (cfg.o_groups, cfg.o_lora_rank);
    let (hi, di) = (cfg.index_n_heads, cfg.index_head_dim);
    let kind = layer
        .map(|l| cfg.attn_kinds[l])
        .unwrap_or(AttnKind::Sliding);
    let ratio = layer.map(|l| cfg.compress_ratios[l]).unwrap_or(0);
    let a = format!("{p}.attn");
    let compressor = match (cfg.kind, kind) {
        (ModelKind::V41, AttnKind::Shared)
            if cfg.kv_source_layers.contains(&layer.unwrap_or(usize::MAX)) =>
        {
            Some(CompressorW {
                wkv: up.m(&format!("{a}.compressor.wkv.weight"), &[hd, dm])?,
                wgate: (ratio > 1)
                    .then(|| up.m(&format!("{a}.compressor.wgate.weight"), &[hd, dm]))
                    .transpose()?,
                ape: None,
                norm: up.w(&format!("{a}.compressor.norm.weight"), &[hd])?,
            })
        }
        (ModelKind::V4, AttnKind::Csa | AttnKind::Hca) => {
            let w = if kind == AttnKind::Csa { 2 * hd } else { hd };
            Some(CompressorW {
                wkv: up.m(&format!("{a}.compressor.wkv.weight"), &[w, dm])?,
                wgate: Some(up.m(&format!("{a}.compressor.wgate.weight"), &[w, dm])?),
                ape: Some(up.w(&format!("{a}.compressor.ape"), &[ratio, w])?),
                norm: up.w(&format!("{a}.compressor.norm.weight"), &[hd])?,
            })
        }
        _ => None,
    };
    let indexer = match (cfg.kind, kind) {
        (ModelKind::V41, AttnKind::Shared)
            if cfg
                .index_source_layers
                .contains(&layer.unwrap_or(usize::MAX)) =>
        {
            let owns = cfg.kv_source_layers.contains(&layer.unwrap_or(usize::MAX));
            Some(IndexerW {
                wq_b: up.m(&format!("{a}.indexer.wq_b.weight"), &[hi * di, rq])?,
                weights_proj: up.m(&format!("{a}.indexer.weights_proj.weight"), &[hi, dm])?,
                wk: if owns {
                    Some((
                        up.m(&format!("{a}.indexer.wk.weight"), &[di, hd])?,
                        up.w(&format!("{a}.indexer.k_norm.weight"), &[di])?,
                    ))
                } else {
                    None
                },
                compressor: None,
            })
        }
        (ModelKind::V4, AttnKind::Csa) => Some(IndexerW {
            wq_b: up.m(&format!("{a}.indexer.wq_b.weight"), &[hi * di, rq])?,
            weights_proj: up.m(&format!("{a}.indexer.weights_proj.weight"), &[hi, dm])?,
            wk: None,
            compressor: Some(CompressorW {
                wkv: up.m(&format!("{a}.indexer.compressor.wkv.weight"), &[2 * di, dm])?,
                wgate: Some(up.m(
                    &format!("{a}.indexer.compressor.wgate.weight"),
                    &[2 * di, dm],
                )?),
                ape: Some(up.w(&format!("{a}.indexer.compressor.ape"), &[ratio, 2 * di])?),
                norm: up.w(&format!("{a}.indexer.compressor.norm.weight"), &[di])?,
            }),
        }),
        _ => None,
    };
    let attn = AttnW {
        wq_a: up.m(&format!("{a}.wq_a.weight"), &[rq, dm])?,
        q_norm: up.w(&format!("{a}.q_norm.weight"), &[rq])?,
        wq_b: up.m(&format!("{a}.wq_b.weight"), &[h * hd, rq])?,
        wkv: up.m(&format!("{a}.wkv.weight"), &[hd, dm])?,
        kv_norm: up.w(&format!("{a}.kv_norm.weight"), &[hd])?,
        wo_a: up.w_as(
            &format!("{a}.wo_a.weight"),
            &[g * ro, h * hd / g],
            &[g, ro, h * hd / g],
        )?,
        wo_b: up.m(&format!("{a}.wo_b.weight"), &[dm, g * ro])?,
        sink: up.w(&format!("{a}.attn_sink"), &[h])?,
        compressor,
        indexer,
    };
    let f = format!("{p}.ffn");
    let inter = cfg.moe_intermediate_size;
    let hash = layer.map(|l| cfg.hash_moe[l]).unwrap_or(false);
    let ffn = FfnW {
        gate: up.m(&format!("{f}.gate.weight"), &[n_experts, dm])?,
        bias: (!hash)
            .then(|| up.w(&format!("{f}.gate.bias"), &[n_experts]))
            .transpose()?,
        tid2eid: hash
            .then(|| {
                up.ints(
                    &format!("{f}.gate.tid2eid"),
                    &[cfg.vocab_size, cfg.num_experts_per_tok],
                )
            })
            .transpose()?,
        experts: (0..n_experts)
            .map(|e| {
                Ok((
                    up.expert(&f, e, "w1", &[inter, dm])?,
                    up.expert(&f, e, "w3", &[inter, dm])?,
                    up.expert(&f, e, "w2", &[dm, inter])?,
                ))
            })
            .collect::<KResult<Vec<_>>>()?,
        shared: (
            up.m(&format!("{f}.shared_experts.w1.weight"), &[inter, dm])?,
            up.m(&format!("{f}.shared_experts.w3.weight"), &[inter, dm])?,
            up.m(&format!("{f}.shared_experts.w2.weight"), &[dm, inter])?,
        ),
    };
    let engram = match (&cfg.engram, layer) {
        (Some(ec), Some(l)) if ec.layer_ids.contains(&l) => {
            let li = ec.layer_ids.iter().position(|&x| x == l).unwrap_or(0);
            let rows = ec.num_embeddings[li] as usize;
            let cols = (ec.max_ngram_size - 1) * ec.n_heads;
            let n = cfg.hc_mult;
            let e = format!("{p}.engram");
            let q = up.ld.f32(&format!("{e}.q_weight"), &[n, dm]);
            let k = up.ld.f32(&format!("{e}.k_weight"), &[n, dm]);
            let qk: Vec<f32> = q.data().iter().zip(k.data()).map(|(a, b)| a * b).collect();
            let qk = Tensor::from_vec(vec![n, dm], qk);
            Some(EngramW {
                embed: up.table(&format!("{e}.embed.weight"), &[rows, ec.head_dim])?,
                wkv: up.m(
                    &format!("{e}.wkv.weight"),
                    &[(n + 1) * dm, cols * ec.head_dim],
                )?,
                qk: up.put(&qk, &[n, dm])?,
            })
        }
        _ => None,
    };
    Ok(BlockW {
        attn_norm: up.w(&format!("{p}.attn_norm.weight"), &[dm])?,
        ffn_norm: up.w(&format!("{p}.ffn_norm.weight"), &[dm])?,
        hc_attn: load_hc(up, cfg, &format!("{p}.hc_attn"))?,
        hc_ffn: load_hc(up, cfg, &format!("{p}.hc_ffn"))?,
        attn,
        ffn,
        engram,
    })
}

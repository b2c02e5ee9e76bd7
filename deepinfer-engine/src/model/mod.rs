//! The DeepSeek V4.1 and V4 model graphs, written against [`deepinfer_kernels::Backend`].

mod attention;
mod dspark;
mod expert_parallel;
mod footprint;
mod forward;
mod global;
mod prof;
mod random;
mod state;
mod state_codec;
pub mod sync;
mod weights;

pub use dspark::{Draft, argmax};
pub use expert_parallel::{ExpertParallel, ExpertPlacement, contiguous_owners};
pub use footprint::DecodeBytes;
pub use forward::{BatchItem, Logits, Trace};
pub use global::{GlobalCache, GlobalPart, GlobalTable, SharedGlobalCache};
pub use prof::profile_report;
pub use random::{RandomDtype, required_tensors, write_random_checkpoint};
pub use state::{CompressorState, SeqState};
pub use state_codec::{StateFormatError, state_bytes};
pub use weights::{
    AttnW, BlockW, CompressorW, DSparkW, EngramW, FfnW, HcW, IndexerW, LoadOptions,
    LoadWeightsError, MatmulWeights, ModelW,
};

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::{AttnKind, ConfigError, ModelConfig, ModelKind};
use crate::engram::{EngramError, EngramHasher};
use deepinfer_kernels::{Backend, KernelError, RopeParams, YarnParams};
use std::path::{Path, PathBuf};

/// Anything that can go wrong loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Bad config.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Unreadable checkpoint file.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Tensors that do not fit the config.
    #[error(transparent)]
    Weights(#[from] LoadWeightsError),
    /// Engram set-up.
    #[error(transparent)]
    Engram(#[from] EngramError),
    /// A backend operation failed.
    #[error("backend: {0}")]
    Backend(#[from] KernelError),
    /// Bad input to a forward call.
    #[error("invalid input: {0}")]
    Input(String),
    /// A device result was read back on a thread inside a launch phase (the runtime's
    /// debug check for host–device synchronisation while a step is in flight).
    #[error("host-device synchronisation inside the launch phase: {0}")]
    HostSync(&'static str),
}

/// Channels per scale of FP8 activations ([`Model::set_fp8_activations`]): V4.1's kernels
/// quantise activations per 32.
pub const FP8_ACTIVATION_BLOCK: usize = 32;

/// A loaded model on a backend.
pub struct Model<B: Backend> {
    /// The validated config.
    pub cfg: ModelConfig,
    pub(crate) be: B,
    pub(crate) w: ModelW<B::Tensor>,
    pub(crate) f_main: Vec<f64>,
    pub(crate) f_comp: Vec<f64>,
    pub(crate) hasher: Option<EngramHasher>,
    /// `[1, D]` of ones: sums over the last axis via `matmul`.
    pub(crate) ones_d: B::Tensor,
    /// Production approximation: round the cached tensors through their storage formats.
    pub(crate) cache_round_trips: bool,
    /// FP8 activations (fidelity mode, [`Model::set_fp8_activations`]).
    pub(crate) fp8_activations: bool,
    /// Production approximation: decoder-side bounded replay in prefill.
    pub(crate) decoder_replay: bool,
    /// The paged global state (compressed entries, indexer keys) of every sequence.
    pub(crate) global: SharedGlobalCache<B::Tensor>,
    /// Per layer and routed expert: token rows routed there (when counting is on).
    pub(crate) expert_load: Option<Vec<Vec<std::sync::atomic::AtomicU64>>>,
    /// `[part][layer]`: global entries a state holds after one global block of positions
    /// (which layers own entries and indexer keys), found by a probe forward on first use.
    global_counts: std::sync::OnceLock<[Vec<usize>; 2]>,
}

/// Positions per global block: the least multiple of every compression ratio and of 32.
fn global_block_tokens(ratios: &[usize]) -> usize {
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 { a } else { gcd(b, a % b) }
    }
    ratios
        .iter()
        .filter(|&&r| r > 0)
        .fold(32, |acc, &r| acc / gcd(acc, r) * r)
}

impl<B: Backend> std::fmt::Debug for Model<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("kind", &self.cfg.kind)
            .field("layers", &self.cfg.num_layers)
            .field("backend", &self.be.name())
            .finish()
    }
}

/// Where a model directory's config lives: `config.json`, else `inference/config.json`.
pub fn config_path(dir: &Path) -> PathBuf {
    let hf = dir.join("config.json");
    if hf.exists() {
        return hf;
    }
    let ds = dir.join("inference").join("config.json");
    if ds.exists() { ds } else { hf }
}

impl<B: Backend> Model<B> {
    /// Load `config.json` and the weights (`model.safetensors` or its shard index) of `dir`.
    pub fn load(dir: &Path, be: B) -> Result<Self, ModelError> {
        let cfg = ModelConfig::from_file(&config_path(dir))?;
        let ck = Checkpoint::open_dir(dir)?;
        let token_map = load_token_map(dir, &cfg)?;
        Self::from_parts(cfg, &ck, token_map, be)
    }

    /// [`Model::load`] with options (e.g. bf16 matmul weights).
    pub fn load_with_options(dir: &Path, be: B, opts: LoadOptions) -> Result<Self, ModelError> {
        let cfg = ModelConfig::from_file(&config_path(dir))?;
        let ck = Checkpoint::open_dir(dir)?;
        let token_map = load_token_map(dir, &cfg)?;
        Self::from_parts_with(cfg, &ck, token_map, be, opts)
    }

    /// Load with an explicit list of weight files (e.g. `model.upstream.safetensors`).
    pub fn load_with_files(dir: &Path, files: &[PathBuf], be: B) -> Result<Self, ModelError> {
        let cfg = ModelConfig::from_file(&config_path(dir))?;
        let ck = Checkpoint::open_files(files)?;
        let token_map = load_token_map(dir, &cfg)?;
        Self::from_parts(cfg, &ck, token_map, be)
    }

    /// Build from a parsed config, an opened checkpoint and (for Engram) the token map.
    pub fn from_parts(
        cfg: ModelConfig,
        ck: &Checkpoint,
        token_map: Option<Vec<i64>>,
        be: B,
    ) -> Result<Self, ModelError> {
        Self::from_parts_with(cfg, ck, token_map, be, LoadOptions::default())
    }

    /// [`Model::from_parts`] with options.
    pub fn from_parts_with(
        cfg: ModelConfig,
        ck: &Checkpoint,
        token_map: Option<Vec<i64>>,
        be: B,
        opts: LoadOptions,
    ) -> Result<Self, ModelError> {
        let hasher = match (&cfg.engram, token_map) {
            (Some(ec), Some(tm)) => Some(EngramHasher::new(ec, tm, cfg.vocab_size)?),
            (Some(_), None) => {
                return Err(ModelError::Engram(EngramError::TokenMap(
                    "the config has Engram layers but no engram_token_map.json was given".into(),
                )));
            }
            _ => None,
        };
        let w = ModelW::load_with(&cfg, ck, &be, opts)?;
        let r = cfg.rope_dim;
        let f_main = RopeParams {
            theta: cfg.rope_theta,
            dims: r,
            yarn: None,
        }
        .inv_freq();
        let f_comp = RopeParams {
            theta: cfg.compress_rope_theta,
            dims: r,
            yarn: cfg.yarn.map(|y| YarnParams {
                factor: y.factor,
                original_max_position_embeddings: y.original_max_position_embeddings,
                beta_fast: y.beta_fast,
                beta_slow: y.beta_slow,
            }),
        }
        .inv_freq();
        let ones_d = be.upload_f32(&vec![1.0; cfg.hidden_size], &[1, cfg.hidden_size])?;
        // No pool until an engine sizes one (`set_global_pool`); states outside an engine
        // keep their own blocks.
        let global = std::sync::Arc::new(std::sync::Mutex::new(GlobalCache::new(
            0,
            global_block_tokens(&cfg.compress_ratios),
            &cfg.compress_ratios,
        )?));
        Ok(Model {
            cfg,
            be,
            w,
            f_main,
            f_comp,
            hasher,
            ones_d,
            cache_round_trips: false,
            fp8_activations: false,
            decoder_replay: false,
            global,
            expert_load: None,
            global_counts: std::sync::OnceLock::new(),
        })
    }

    /// Switch the cache round trips on or off (off = exact mode, the default). When on, the
    /// window K=V rows go through MXFP8 (e4m3, power-of-two scale per 32), compressed entries
    /// through NVFP4 (e2m1, e4m3 scale per 16) and indexer keys and queries through MXFP4
    /// (e2m1, power-of-two scale per 32), as DeepSeek's reference does (its QAT) and as
    /// production caches store them. This changes the logits (see the README for figures).
    pub fn set_cache_round_trips(&mut self, on: bool) {
        self.cache_round_trips = on;
    }

    /// Switch FP8 activations on or off (off, the default, multiplies the activations as
    /// they are). When on, the input of every product with an FP8 or FP4 weight (the dense
    /// projections, the shared and the routed experts) is first rounded to FP8 e4m3 with one
    /// power-of-two scale per [`FP8_ACTIVATION_BLOCK`] channels, as DeepSeek's kernels
    /// quantise activations before their FP8 and FP4 GEMMs: a mode for fidelity studies
    /// against production numerics. Limits: products whose input width is not a multiple of
    /// the block keep their input as is, and the routed experts' down projection reads the
    /// unrounded intermediate (the backend's expert op does not round inside).
    pub fn set_fp8_activations(&mut self, on: bool) {
        self.fp8_activations = on;
    }

    /// Whether FP8 activations are on.
    pub fn fp8_activations(&self) -> bool {
        self.fp8_activations
    }

    /// `x · wᵀ`, with `x` rounded to FP8 first when FP8 activations are on and `w` is
    /// quantised.
    pub(crate) fn mm(&self, x: &B::Tensor, w: &B::Tensor) -> Result<B::Tensor, ModelError> {
        if deepinfer_kernels::TensorInfo::dtype(w).is_quantized() {
            let xq = self.fp8_activation(x)?;
            return Ok(self.be.matmul(xq.as_ref().unwrap_or(x), w)?);
        }
        Ok(self.be.matmul(x, w)?)
    }

    /// `x` rounded to FP8 per block when FP8 activations are on (and its width allows).
    pub(crate) fn fp8_activation(&self, x: &B::Tensor) -> Result<Option<B::Tensor>, ModelError> {
        let width = deepinfer_kernels::TensorInfo::shape(x)
            .last()
            .copied()
            .unwrap_or(0);
        if !self.fp8_activations || width == 0 || width % FP8_ACTIVATION_BLOCK != 0 {
            return Ok(None);
        }
        let f = deepinfer_kernels::FakeQuant::Fp8 {
            block: FP8_ACTIVATION_BLOCK,
        };
        Ok(Some(self.be.fake_quant(x, f)?))
    }

    /// Round `x` through a cache storage format when the round trips are on.
    pub(crate) fn cache_quant(
        &self,
        x: B::Tensor,
        f: deepinfer_kernels::FakeQuant,
    ) -> Result<B::Tensor, ModelError> {
        if self.cache_round_trips {
            Ok(self.be.fake_quant(&x, f)?)
        } else {
            Ok(x)
        }
    }

    /// The byte layout of this model's cache state as this engine keeps it (f32), for a
    /// `deepinfer-kv` block manager: paged parts (compressed entries and indexer keys of each
    /// owning layer, per block of `block_size` tokens) and fixed per-sequence parts (window rows
    /// of every layer with `spec_slack` extra rows, DSpark context windows).
    pub fn kv_layout(
        &self,
        block_size: usize,
        spec_slack: usize,
    ) -> Result<deepinfer_kv::KvLayout, ModelError> {
        let c = &self.cfg;
        let mut lay = deepinfer_kv::KvLayout::new(block_size)
            .map_err(|e| ModelError::Input(format!("kv layout: {e}")))?;
        let (d, di) = (c.head_dim as u64, c.index_head_dim as u64);
        for l in 0..c.num_layers {
            let r = c.compress_ratios[l];
            let per_entry = match c.attn_kinds[l] {
                AttnKind::Shared if c.kv_source_layers.contains(&l) => (d + di) * 4,
                AttnKind::Csa => (d + di) * 4,
                AttnKind::Hca => d * 4,
                _ => continue,
            };
            let entries = block_size.div_ceil(r) as u64;
            lay = lay.with_block_part(&format!("layer{l}.entries"), entries * per_entry);
        }
        let rows = (c.sliding_window - 1 + spec_slack) as u64;
        lay = lay.with_window_state("window", c.num_layers as u64, rows, d * 4);
        if let Some(ds) = &c.dspark {
            lay = lay.with_window_state(
                "dspark.window",
                ds.stages as u64,
                c.sliding_window as u64,
                d * 4,
            );
        }
        Ok(lay)
    }

    /// Decoder-side bounded replay (a production approximation, V4.1 only): in a prefill
    /// chunk longer than the window, the last KV source computes its compressed entries and
    /// indexer keys for every row, then its attention and all later layers run only on the
    /// chunk's last `sliding_window` rows, with their windows floored at the start of that
    /// tail. `forward` then returns logits for those tail rows only. Refused unless the last
    /// KV source is also an index source and the candidate source (when there is one), no
    /// Engram layer sits at or after it, and the drafter reads only layers at or after it.
    pub fn set_decoder_bounded_replay(&mut self, on: bool) -> Result<(), ModelError> {
        if on {
            let c = &self.cfg;
            let last = c.kv_source_layers.last().copied().ok_or_else(|| {
                ModelError::Input("decoder replay needs a KV source layer".into())
            })?;
            let ok = c.index_source_layers.contains(&last)
                && c.candidate_source_layer.is_none_or(|cs| cs == last)
                && c.engram
                    .as_ref()
                    .is_none_or(|e| e.layer_ids.iter().all(|&l| l < last))
                && c.dspark
                    .as_ref()
                    .is_none_or(|d| d.target_layer_ids.iter().all(|&l| l >= last));
            if !ok {
                return Err(ModelError::Input(format!(
                    "decoder bounded replay is not valid for this layout (last KV source {last})"
                )));
            }
        }
        self.decoder_replay = on;
        Ok(())
    }

    /// Bounded replay (a production approximation): rebuild the window state of a sequence
    /// whose global state (compressed entries, indexer keys, open compressor rows) came from a
    /// prefix cache without window state, by re-running its last `tokens` (at most
    /// `sliding_window` of them, the ones just before `state.pos`). Window attention during
    /// the replay reads no rows below the replay start, and the compressors are not run, as in
    /// vLLM's and SGLang's prefix replay. Rows of layers above the first see a truncated
    /// history, so the rebuilt windows (and the logits after them) are approximate unless the
    /// replay starts at position 0.
    pub fn rebuild_window(
        &self,
        state: &mut SeqState<B::Tensor>,
        tokens: &[u32],
    ) -> Result<(), ModelError> {
        let n = tokens.len();
        if n == 0 || n > state.pos || n > self.cfg.sliding_window {
            return Err(ModelError::Input(format!(
                "replay of {n} tokens: needs 1..=min(sliding_window, position {})",
                state.pos
            )));
        }
        if state.history.len() != state.pos || state.history[state.pos - n..] != *tokens {
            return Err(ModelError::Input(
                "replayed tokens are not the sequence's last tokens".into(),
            ));
        }
        state.drop_window();
        let tail = state.history.split_off(state.pos - n);
        state.pos -= n;
        let res = {
            let mut items = [BatchItem {
                state: &mut *state,
                tokens,
            }];
            self.forward_hidden_mode(&mut items, None, true, None)
                .map(|_| ())
        };
        state.pos += n;
        state.history.extend(tail);
        res
    }

    /// A state at position `history.len()` (a multiple of every compression ratio) whose
    /// global entries are all in the pool and which keeps no window state: no window rows,
    /// no open or previous compressor rows, no drafter windows. What a prefix hit whose window
    /// state is missing resumes from before [`Model::rebuild_window`] (bounded replay).
    pub fn windowless_state(&self, history: &[u32]) -> Result<SeqState<B::Tensor>, ModelError> {
        let bt = self.global_block_tokens();
        let q = history.len();
        if let Some(r) = self
            .cfg
            .compress_ratios
            .iter()
            .find(|&&r| r > 0 && !q.is_multiple_of(r))
        {
            return Err(ModelError::Input(format!(
                "a windowless state at position {q}: not a multiple of compression ratio {r}"
            )));
        }
        let per_block = match self.global_counts.get() {
            Some(c) => c.clone(),
            None => {
                let mut probe = self.new_state();
                let toks = vec![0u32; bt];
                self.forward(
                    &mut [BatchItem {
                        state: &mut probe,
                        tokens: &toks,
                    }],
                    Logits::Last,
                    None,
                )?;
                let layers = self.cfg.num_layers;
                let c = [GlobalPart::Entries, GlobalPart::IndexKeys]
                    .map(|p| (0..layers).map(|l| probe.global.count(p, l)).collect());
                self.global_counts.get_or_init(|| c).clone()
            }
        };
        let mut st = self.new_state();
        st.pos = q;
        st.history = history.to_vec();
        st.global
            .set_counts(per_block.map(|v| v.into_iter().map(|n| n * q / bt).collect()));
        Ok(st)
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.be
    }

    /// A fresh sequence state with its own global blocks (an engine moves it onto its pool,
    /// see [`GlobalTable::attach`]).
    pub fn new_state(&self) -> SeqState<B::Tensor> {
        let ratios: std::sync::Arc<[usize]> = self.cfg.compress_ratios.clone().into();
        #[allow(clippy::expect_used)]
        let global = GlobalTable::new(ratios, self.global_block_tokens())
            .expect("global_block_tokens is a multiple of every compression ratio");
        SeqState::with_global(
            self.cfg.num_layers,
            self.cfg.dspark.as_ref().map(|d| d.stages).unwrap_or(0),
            global,
        )
    }

    /// Blocks in the engine's global-state pool (0 until one is set).
    pub fn global_cache_blocks(&self) -> usize {
        global::lock_cache(&self.global).num_blocks()
    }

    /// Give the model an engine's pool of `num_blocks` global-state blocks of `block_tokens`
    /// positions, addressed by the block ids of the engine's scheduler (its block size must
    /// be a multiple of every compression ratio). Tensors of an earlier pool are dropped.
    pub fn set_global_pool(
        &mut self,
        num_blocks: usize,
        block_tokens: usize,
    ) -> Result<(), ModelError> {
        let pool = GlobalCache::new(num_blocks, block_tokens, &self.cfg.compress_ratios)?;
        *global::lock_cache(&self.global) = pool;
        Ok(())
    }

    /// Execute a step plan's block copies in the global-state pool (the copy-on-write of a
    /// forked sequence's last block), before any forward reads the copies.
    pub fn copy_global_blocks(&self, copies: &[deepinfer_kv::CopyOp]) -> Result<(), ModelError> {
        let mut g = global::lock_cache(&self.global);
        copies.iter().try_for_each(|c| g.copy_block(c.src, c.dst))
    }

    /// Positions per global-state block.
    pub fn global_block_tokens(&self) -> usize {
        global_block_tokens(&self.cfg.compress_ratios)
    }

    /// The model's paged global cache (compressed entries and indexer keys of all sequences).
    pub fn global_cache(&self) -> &SharedGlobalCache<B::Tensor> {
        &self.global
    }

    /// Count the token rows routed to each expert of each layer from now on (off by default:
    /// counting reads the routing indices back to the host every MoE layer).
    pub fn count_expert_load(&mut self, on: bool) {
        self.expert_load = on.then(|| {
            (0..self.cfg.num_layers)
                .map(|_| {
                    (0..self.cfg.n_routed_experts)
                        .map(|_| std::sync::atomic::AtomicU64::new(0))
                        .collect()
                })
                .collect()
        });
    }

    /// Token rows routed to each expert of each layer since counting was switched on
    /// (`[layer][expert]`; `None` when it is off). Drafter layers are not counted.
    pub fn expert_load(&self) -> Option<Vec<Vec<u64>>> {
        self.expert_load.as_ref().map(|l| {
            l.iter()
                .map(|e| {
                    e.iter()
                        .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
                        .collect()
                })
                .collect()
        })
    }

    /// Checkpoint tensors of parts the engine does not run (vision tower, aligner, image
    /// embeddings, V4's multi-token prediction, ...), skipped on load; see
    /// [`crate::weights::unused_part`].
    pub fn skipped_tensors(&self) -> &[String] {
        &self.w.skipped
    }

    /// A one-line summary of [`Model::skipped_tensors`] by part (`None` when none were).
    pub fn skipped_summary(&self) -> Option<String> {
        let mut by: std::collections::BTreeMap<&str, usize> = Default::default();
        for n in &self.w.skipped {
            *by.entry(crate::weights::unused_part(n).unwrap_or("other"))
                .or_default() += 1;
        }
        (!by.is_empty()).then(|| {
            let parts: Vec<String> = by.iter().map(|(p, n)| format!("{p}: {n}")).collect();
            format!(
                "skipped {} checkpoint tensor(s) of parts the engine does not run ({})",
                self.w.skipped.len(),
                parts.join(", ")
            )
        })
    }

    /// Whether this model has the DSpark drafter.
    pub fn has_drafter(&self) -> bool {
        self.w.dspark.is_some()
    }

    /// The model kind.
    pub fn kind(&self) -> ModelKind {
        self.cfg.kind
    }
}

fn load_token_map(dir: &Path, cfg: &ModelConfig) -> Result<Option<Vec<i64>>, ModelError> {
    if cfg.engram.is_none() {
        return Ok(None);
    }
    let p = dir.join("engram_token_map.json");
    let text = std::fs::read_to_string(&p).map_err(|e| {
        ModelError::Engram(EngramError::TokenMap(format!(
            "cannot read {}: {e}",
            p.display()
        )))
    })?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ModelError::Engram(EngramError::TokenMap(e.to_string())))?;
    let arr = v
        .get("token_map")
        .or(Some(&v))
        .and_then(|x| x.as_array())
        .ok_or_else(|| ModelError::Engram(EngramError::TokenMap("no `token_map` list".into())))?;
    arr.iter()
        .map(|x| {
            x.as_i64()
                .ok_or_else(|| ModelError::Engram(EngramError::TokenMap(format!("bad entry {x}"))))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

//! A sequence state as bytes, for the persistent cache tier.
//!
//! [`Model::encode_state`] writes everything a [`SeqState`] holds (position, token history,
//! window rows, open compressor rows, the global entries and indexer keys read through the
//! block table, the drafter's windows) with each tensor in its own dtype, so decoding gives
//! back the same values bit for bit. [`Model::decode_state`] checks every length and shape
//! against the model before it uploads anything: bytes from another model, a damaged file or
//! another format version are a [`StateFormatError`], never a wrong state.
//!
//! Layout (little-endian): magic `DISTATE1`, the caller's identity (u64), `pos` (u64), the
//! history (u64 count, u32 ids), the layer and drafter-stage counts (u32 each), then the
//! tensor slots in a fixed order, each a tag byte (0 absent, 1 f32, 2 bf16, 3 f16), a rank
//! byte, the dims (u64 each) and the values.

use super::global::GlobalPart;
use super::{Model, ModelError, SeqState};
use deepinfer_kernels::{Backend, DType, TensorInfo};

const MAGIC: &[u8; 8] = b"DISTATE1";

/// Why bytes could not be decoded into a state of this model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateFormatError {
    /// Not a state file of this format version.
    #[error("not a deepinfer state (bad magic)")]
    Magic,
    /// Written for another model, backend or cache format.
    #[error(
        "state written by another model or format (identity {found:#x}, expected {expected:#x})"
    )]
    Identity {
        /// Identity in the bytes.
        found: u64,
        /// Identity of this model.
        expected: u64,
    },
    /// The bytes end early.
    #[error("state truncated at byte {0}")]
    Truncated(usize),
    /// A count or shape that does not fit the model.
    #[error("state does not fit the model: {0}")]
    Shape(String),
    /// Bytes after the last slot.
    #[error("{0} trailing byte(s) after the state")]
    Trailing(usize),
}

impl From<StateFormatError> for ModelError {
    fn from(e: StateFormatError) -> Self {
        ModelError::Input(e.to_string())
    }
}

/// Bytes a state's tensors occupy (window, compressor rows, drafter windows, and the global
/// entries it references), for byte-bounded stores.
pub fn state_bytes<T: TensorInfo + Clone>(st: &SeqState<T>) -> u64 {
    fn size<T: TensorInfo>(t: &T) -> u64 {
        let elem = match t.dtype() {
            DType::F32 => 4,
            DType::BF16 | DType::F16 => 2,
            _ => 4,
        };
        (t.numel() * elem) as u64
    }
    let opt = |t: &Option<T>| t.as_ref().map_or(0, size);
    let pair = |p: &Option<(T, T)>| p.as_ref().map_or(0, |(a, b)| size(a) + size(b));
    let mut n = 0;
    n += st.window.iter().map(opt).sum::<u64>();
    n += st.dspark_window.iter().map(opt).sum::<u64>();
    for c in st.compressor.iter().chain(&st.index_compressor) {
        n += pair(&c.pending) + pair(&c.previous);
    }
    // Global rows are not at hand without a gather: count them at the window rows' width.
    let width = st
        .window
        .iter()
        .flatten()
        .next()
        .map_or(0, |t| size(t) / t.shape()[0].max(1) as u64);
    n += st.global_entries().iter().sum::<usize>() as u64 * width;
    n + 8 * st.history.len() as u64 + 64
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], StateFormatError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(StateFormatError::Truncated(self.at))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, StateFormatError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, StateFormatError> {
        let mut a = [0; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, StateFormatError> {
        let mut a = [0; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    /// A count that must fit in the bytes left at `unit` bytes each.
    fn count(&mut self, unit: usize) -> Result<usize, StateFormatError> {
        let at = self.at;
        let n = usize::try_from(self.u64()?).map_err(|_| StateFormatError::Truncated(at))?;
        if n.saturating_mul(unit.max(1)) > self.b.len() - self.at {
            return Err(StateFormatError::Truncated(at));
        }
        Ok(n)
    }
}

impl<B: Backend> Model<B>
where
    B::Tensor: Clone,
{
    /// `st` as bytes (see the module docs), tagged with `identity` (the caller's key for this
    /// model, backend and cache format).
    pub fn encode_state(
        &self,
        st: &SeqState<B::Tensor>,
        identity: u64,
    ) -> Result<Vec<u8>, ModelError> {
        let mut w = Writer(Vec::new());
        w.0.extend_from_slice(MAGIC);
        w.u64(identity);
        w.u64(st.pos as u64);
        w.u64(st.history.len() as u64);
        st.history.iter().for_each(|&t| w.u32(t));
        w.u32(st.window.len() as u32);
        w.u32(st.dspark_window.len() as u32);
        let mut slot = |t: Option<&B::Tensor>| self.write_tensor(&mut w, t);
        for l in 0..st.window.len() {
            slot(st.window[l].as_ref())?;
            for c in [&st.compressor[l], &st.index_compressor[l]] {
                for p in [&c.pending, &c.previous] {
                    slot(p.as_ref().map(|x| &x.0))?;
                    slot(p.as_ref().map(|x| &x.1))?;
                }
            }
            for part in [GlobalPart::Entries, GlobalPart::IndexKeys] {
                let rows = st.global.gather(&self.be, part, l)?;
                slot(rows.as_ref())?;
            }
        }
        for t in &st.dspark_window {
            slot(t.as_ref())?;
        }
        Ok(w.0)
    }

    fn write_tensor(&self, w: &mut Writer, t: Option<&B::Tensor>) -> Result<(), ModelError> {
        let Some(t) = t else {
            w.u8(0);
            return Ok(());
        };
        let tag = match t.dtype() {
            DType::F32 => 1,
            DType::BF16 => 2,
            DType::F16 => 3,
            d => return Err(ModelError::Input(format!("a state tensor of dtype {d:?}"))),
        };
        w.u8(tag);
        w.u8(t.shape().len() as u8);
        t.shape().iter().for_each(|&d| w.u64(d as u64));
        let vals = self.be.download_f32(t)?;
        match tag {
            1 => vals
                .iter()
                .for_each(|v| w.0.extend_from_slice(&v.to_le_bytes())),
            2 => vals.iter().for_each(|&v| {
                w.0.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes())
            }),
            _ => vals
                .iter()
                .for_each(|&v| w.0.extend_from_slice(&half::f16::from_f32(v).to_le_bytes())),
        }
        Ok(())
    }

    /// The state `bytes` hold, rebuilt on this model (its global rows in blocks of its own).
    /// Fails with [`ModelError::Input`] (from a [`StateFormatError`]) on bytes of another
    /// identity or format, or that do not fit this model.
    pub fn decode_state(
        &self,
        bytes: &[u8],
        identity: u64,
    ) -> Result<SeqState<B::Tensor>, ModelError> {
        let mut r = Reader { b: bytes, at: 0 };
        if r.take(8).ok() != Some(&MAGIC[..]) {
            return Err(StateFormatError::Magic.into());
        }
        let found = r.u64()?;
        if found != identity {
            return Err(StateFormatError::Identity {
                found,
                expected: identity,
            }
            .into());
        }
        let pos = r.u64()? as usize;
        let n = r.count(4)?;
        let history = (0..n).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?;
        let mut st = self.new_state();
        let (layers, stages) = (r.u32()? as usize, r.u32()? as usize);
        if layers != st.window.len() || stages != st.dspark_window.len() || pos > history.len() {
            return Err(StateFormatError::Shape(format!(
                "{layers} layers, {stages} drafter stages, position {pos} of {} tokens",
                history.len()
            ))
            .into());
        }
        st.pos = pos;
        st.history = history;
        let d = self.cfg.hidden_size.max(self.cfg.head_dim) * 64;
        for l in 0..layers {
            st.window[l] = self.read_tensor(&mut r, d)?;
            for c in [&mut st.compressor[l], &mut st.index_compressor[l]] {
                for p in [&mut c.pending, &mut c.previous] {
                    let a = self.read_tensor(&mut r, d)?;
                    let z = self.read_tensor(&mut r, d)?;
                    *p = match (a, z) {
                        (Some(a), Some(z)) => Some((a, z)),
                        (None, None) => None,
                        _ => {
                            return Err(
                                StateFormatError::Shape("half a compressor pair".into()).into()
                            );
                        }
                    };
                }
            }
            for part in [GlobalPart::Entries, GlobalPart::IndexKeys] {
                if let Some(rows) = self.read_tensor(&mut r, d)? {
                    st.global.append(&self.be, part, l, rows)?;
                }
            }
        }
        for s in 0..stages {
            st.dspark_window[s] = self.read_tensor(&mut r, d)?;
        }
        let left = bytes.len() - r.at;
        if left > 0 {
            return Err(StateFormatError::Trailing(left).into());
        }
        Ok(st)
    }

    /// One tensor slot; `max_width` bounds the last dimension (a sanity check, not a limit of
    /// any real state).
    fn read_tensor(
        &self,
        r: &mut Reader<'_>,
        max_width: usize,
    ) -> Result<Option<B::Tensor>, ModelError> {
        let tag = r.u8()?;
        if tag == 0 {
            return Ok(None);
        }
        let elem = match tag {
            1 => 4,
            2 | 3 => 2,
            t => return Err(StateFormatError::Shape(format!("tensor tag {t}")).into()),
        };
        let rank = r.u8()? as usize;
        if rank == 0 || rank > 4 {
            return Err(StateFormatError::Shape(format!("tensor of rank {rank}")).into());
        }
        let shape = (0..rank)
            .map(|_| r.u64().map(|d| d as usize))
            .collect::<Result<Vec<_>, _>>()?;
        if shape.last().is_some_and(|&w| w == 0 || w > max_width) {
            return Err(StateFormatError::Shape(format!("tensor shape {shape:?}")).into());
        }
        let numel = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| StateFormatError::Shape(format!("tensor shape {shape:?}")))?;
        let at = r.at;
        let raw = r.take(
            numel
                .checked_mul(elem)
                .ok_or(StateFormatError::Truncated(at))?,
        )?;
        let t = match tag {
            1 => {
                let v: Vec<f32> = raw
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                self.be.upload_f32(&v, &shape)?
            }
            2 => {
                let v: Vec<half::bf16> = raw
                    .chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]))
                    .collect();
                self.be.upload_bf16(&v, &shape)?
            }
            _ => {
                let v: Vec<half::f16> = raw
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]))
                    .collect();
                self.be.upload_f16(&v, &shape)?
            }
        };
        Ok(Some(t))
    }
}

/// Bumped whenever the bytes of a state or the meaning of a cached entry change.
const FORMAT_VERSION: u64 = 1;

impl<B: Backend> Model<B>
where
    B::Tensor: Clone,
{
    /// A key for "states of this model are interchangeable": the state format version, the
    /// config, the backend, the cache approximations in force, and the bits of the logits of
    /// a fixed 8-token probe (so two checkpoints with one config, or one checkpoint on
    /// numerically different backends, get different identities). Token ids, not text, key
    /// every cached state, so the tokenizer does not enter: a state depends on the ids and
    /// the model only. Costs one short forward.
    pub fn state_identity(&self) -> Result<u64, ModelError> {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&FORMAT_VERSION.to_le_bytes());
        h.update(format!("{:?}", self.cfg).as_bytes());
        h.update(self.be.name().as_bytes());
        h.update(&[
            u8::from(self.cache_round_trips),
            u8::from(self.decoder_replay),
            u8::from(self.fp8_activations),
        ]);
        let vocab = self.cfg.vocab_size.max(1) as u32;
        let probe: Vec<u32> = (0..8u32).map(|i| (i * 7919 + 11) % vocab).collect();
        let mut st = self.new_state();
        let logits = self.forward(
            &mut [super::BatchItem {
                state: &mut st,
                tokens: &probe,
            }],
            super::Logits::Last,
            None,
        )?;
        for row in &logits {
            row.iter()
                .for_each(|v| h.update(&v.to_bits().to_le_bytes()));
        }
        Ok(h.digest())
    }
}

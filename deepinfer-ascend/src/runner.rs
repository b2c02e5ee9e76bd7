//! Runs the kernels either in the CPU emulator or on a device; the mode is chosen explicitly
//! when the runner is built, and never changes behind the caller's back.

use half::bf16;

use crate::chip::ChipSpec;
use crate::emu::{self, AttentionInputs, GemvInputs, RmsNormOutput, RouterOutput};
use crate::error::{AscendError, Result};
use crate::kernels::{KernelSource, kernel};
use crate::mx::MX_BLOCK;
use crate::runtime::{AscendRuntime, DeviceBuffer, RuntimeOptions};
use crate::tiling::*;

/// Where kernels run.
#[derive(Debug)]
pub enum Mode {
    /// The CPU emulator of the tiled algorithms, planned for the given chip.
    Emulated(ChipSpec),
    /// A real NPU through AscendCL.
    Device(Box<AscendRuntime>),
}

/// Plans and runs the decode kernels in one explicit [`Mode`].
#[derive(Debug)]
pub struct KernelRunner {
    mode: Mode,
}

fn le_bytes<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

fn from_le<T, const N: usize>(b: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
    b.chunks_exact(N)
        .map(|c| f(c.try_into().unwrap_or([0; N])))
        .collect()
}

fn bf16_bytes(v: &[bf16]) -> Vec<u8> {
    le_bytes(v, |x| x.to_bits().to_le_bytes())
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    le_bytes(v, f32::to_le_bytes)
}

fn u32_bytes(v: &[u32]) -> Vec<u8> {
    le_bytes(v, u32::to_le_bytes)
}

fn registered(name: &str) -> Result<&'static KernelSource> {
    kernel(name).ok_or_else(|| AscendError::Unsupported(format!("kernel {name} not registered")))
}

impl KernelRunner {
    /// Emulate the kernels as planned for `chip` (no device involved, and none pretended).
    pub fn emulated(chip: ChipSpec) -> Self {
        Self {
            mode: Mode::Emulated(chip),
        }
    }

    /// Open a device; an error when AscendCL or the device is unavailable.
    pub fn device(opts: &RuntimeOptions) -> Result<Self> {
        Ok(Self {
            mode: Mode::Device(Box::new(AscendRuntime::open(opts)?)),
        })
    }

    /// The mode.
    pub fn mode(&self) -> &Mode {
        &self.mode
    }

    /// The chip tilings are planned for.
    pub fn chip(&self) -> ChipSpec {
        match &self.mode {
            Mode::Emulated(c) => *c,
            Mode::Device(rt) => rt.chip(),
        }
    }

    fn dev(&self) -> Option<&AscendRuntime> {
        match &self.mode {
            Mode::Device(rt) => Some(rt),
            Mode::Emulated(_) => None,
        }
    }

    fn launch<T: TilingAbi>(
        rt: &AscendRuntime,
        name: &str,
        t: &T,
        block_dim: u32,
        inputs: &[Vec<u8>],
        out_bytes: &[usize],
    ) -> Result<Vec<Vec<u8>>> {
        let k = registered(name)?;
        let ins: Vec<DeviceBuffer> = inputs.iter().map(|b| rt.upload(b)).collect::<Result<_>>()?;
        let outs: Vec<DeviceBuffer> = out_bytes
            .iter()
            .map(|&n| rt.alloc(n))
            .collect::<Result<_>>()?;
        let tiling = rt.upload(&t.to_bytes())?;
        let mut args: Vec<&DeviceBuffer> = ins.iter().chain(outs.iter()).collect();
        args.push(&tiling);
        rt.launch(k, block_dim, &args)?;
        outs.iter()
            .zip(out_bytes)
            .map(|(b, &n)| rt.download(b, n))
            .collect()
    }

    /// RMSNorm (+ MXFP8 quantisation when `shape.quant`).
    pub fn rmsnorm_quant(
        &self,
        shape: &RmsNormShape,
        x: &[bf16],
        w: &[f32],
    ) -> Result<RmsNormOutput> {
        let t = RmsNormTiling::plan(&self.chip(), shape)?;
        let Some(rt) = self.dev() else {
            return emu::rmsnorm_quant(&self.chip(), &t, x, w);
        };
        emu::check_len("rmsnorm_quant", "x", x.len(), shape.rows * shape.dim)?;
        emu::check_len("rmsnorm_quant", "weight", w.len(), shape.dim)?;
        let n = shape.rows * shape.dim;
        let qn = if shape.quant { n } else { 0 };
        let o = Self::launch(
            rt,
            "rmsnorm_quant",
            &t,
            t.block_dim,
            &[bf16_bytes(x), f32_bytes(w)],
            &[2 * n, qn, qn / MX_BLOCK],
        )?;
        Ok(RmsNormOutput {
            y: from_le(&o[0], |b| bf16::from_bits(u16::from_le_bytes(b))),
            q: o[1].clone(),
            scales: o[2].clone(),
        })
    }

    /// Partial interleaved RoPE (see [`emu::rope`]).
    pub fn rope(
        &self,
        shape: &RopeShape,
        x: &[bf16],
        pos: &[u32],
        cos: &[f32],
        sin: &[f32],
    ) -> Result<Vec<bf16>> {
        let t = RopeTiling::plan(&self.chip(), shape)?;
        let Some(rt) = self.dev() else {
            return emu::rope(&self.chip(), &t, x, pos, cos, sin);
        };
        emu::check_len(
            "rope",
            "x",
            x.len(),
            shape.rows * shape.heads * shape.head_dim,
        )?;
        if pos.len() != shape.rows || pos.iter().any(|&p| p as usize >= shape.table_len) {
            return Err(AscendError::Shape(
                "rope: positions do not fit the table".into(),
            ));
        }
        let o = Self::launch(
            rt,
            "rope",
            &t,
            t.block_dim,
            &[
                bf16_bytes(x),
                u32_bytes(pos),
                f32_bytes(cos),
                f32_bytes(sin),
            ],
            &[2 * x.len()],
        )?;
        Ok(from_le(&o[0], |b| bf16::from_bits(u16::from_le_bytes(b))))
    }

    /// GEMV `x · Wᵀ` (see [`emu::gemv`]).
    pub fn gemv(&self, shape: &GemvShape, inp: GemvInputs<'_>) -> Result<Vec<f32>> {
        let t = GemvTiling::plan(&self.chip(), shape)?;
        let Some(rt) = self.dev() else {
            return emu::gemv(&self.chip(), &t, inp);
        };
        let (m, n, k) = (shape.m, shape.n, shape.k);
        let ins = match inp {
            GemvInputs::Bf16 { x, w } => {
                emu::check_len("gemv", "x", x.len(), m * k)?;
                emu::check_len("gemv", "w", w.len(), n * k)?;
                vec![
                    bf16_bytes(x),
                    vec![0; 32],
                    bf16_bytes(w),
                    vec![0; 32],
                    f32_bytes(&gemv_lut()),
                ]
            }
            GemvInputs::Mx {
                format,
                x,
                x_scales,
                w,
                w_scales,
            } => {
                emu::check_len("gemv", "x", x.len(), m * k)?;
                emu::check_len("gemv", "w", w.len(), n * format.bytes(k))?;
                emu::check_len("gemv", "x_scales", x_scales.len(), m * k / MX_BLOCK)?;
                emu::check_len("gemv", "w_scales", w_scales.len(), n * k / MX_BLOCK)?;
                vec![
                    x.to_vec(),
                    x_scales.to_vec(),
                    w.to_vec(),
                    w_scales.to_vec(),
                    f32_bytes(&gemv_lut()),
                ]
            }
        };
        let o = Self::launch(rt, "gemv", &t, t.block_dim, &ins, &[4 * m * n])?;
        Ok(from_le(&o[0], f32::from_le_bytes))
    }

    /// MoE routing (see [`emu::router`]).
    pub fn router(
        &self,
        shape: &RouterShape,
        logits: &[f32],
        bias: &[f32],
    ) -> Result<RouterOutput> {
        let t = RouterTiling::plan(&self.chip(), shape)?;
        let Some(rt) = self.dev() else {
            return emu::router(&self.chip(), &t, logits, bias);
        };
        emu::check_len("router", "logits", logits.len(), shape.rows * shape.experts)?;
        emu::check_len("router", "bias", bias.len(), shape.experts)?;
        let nk = shape.rows * shape.top_k;
        let o = Self::launch(
            rt,
            "router",
            &t,
            t.block_dim,
            &[f32_bytes(logits), f32_bytes(bias)],
            &[4 * nk, 4 * nk],
        )?;
        Ok(RouterOutput {
            ids: from_le(&o[0], u32::from_le_bytes),
            weights: from_le(&o[1], f32::from_le_bytes),
        })
    }

    /// Hyper-connection merge (see [`emu::hc_mix`]).
    pub fn hc_mix(
        &self,
        shape: &HcMixShape,
        x: &[bf16],
        out: &[bf16],
        post: &[f32],
        comb: &[f32],
    ) -> Result<Vec<bf16>> {
        let t = HcMixTiling::plan(&self.chip(), shape)?;
        let Some(rt) = self.dev() else {
            return emu::hc_mix(&self.chip(), &t, x, out, post, comb);
        };
        let (r, ns, d) = (shape.rows, shape.streams, shape.dim);
        emu::check_len("hc_mix", "x", x.len(), r * ns * d)?;
        emu::check_len("hc_mix", "out", out.len(), r * d)?;
        emu::check_len("hc_mix", "post", post.len(), r * ns)?;
        emu::check_len("hc_mix", "comb", comb.len(), r * ns * ns)?;
        let o = Self::launch(
            rt,
            "hc_mix",
            &t,
            t.block_dim,
            &[
                bf16_bytes(x),
                bf16_bytes(out),
                f32_bytes(post),
                f32_bytes(comb),
            ],
            &[2 * x.len()],
        )?;
        Ok(from_le(&o[0], |b| bf16::from_bits(u16::from_le_bytes(b))))
    }

    /// Decode attention with sinks (see [`emu::attention`]).
    pub fn attention(&self, shape: &AttentionShape, a: AttentionInputs<'_>) -> Result<Vec<bf16>> {
        let t = AttentionTiling::plan(&self.chip(), shape)?;
        let Some(rt) = self.dev() else {
            return emu::attention(&self.chip(), &t, a);
        };
        let d = shape.head_dim;
        emu::check_len("attention", "q", a.q.len(), shape.heads * d)?;
        emu::check_len("attention", "window", a.window.len(), shape.n_window * d)?;
        emu::check_len("attention", "comp", a.comp.len(), shape.comp_rows * d)?;
        emu::check_len("attention", "sinks", a.sinks.len(), shape.heads)?;
        if a.comp_idx.len() != shape.n_comp
            || a.comp_idx.iter().any(|&i| i as usize >= shape.comp_rows)
        {
            return Err(AscendError::Shape(
                "attention: compressed indices out of range".into(),
            ));
        }
        let ins = [
            bf16_bytes(a.q),
            bf16_bytes(a.window),
            bf16_bytes(a.comp),
            u32_bytes(a.comp_idx),
            f32_bytes(a.sinks),
        ];
        let o = Self::launch(
            rt,
            "attention",
            &t,
            t.block_dim,
            &ins,
            &[2 * shape.heads * d],
        )?;
        Ok(from_le(&o[0], |b| bf16::from_bits(u16::from_le_bytes(b))))
    }

    /// Fixed-point CDF sampling (see [`emu::sampling`]).
    pub fn sampling(
        &self,
        shape: &SamplingShape,
        probs: &[f32],
        uniforms: &[u32],
    ) -> Result<Vec<u32>> {
        let t = SamplingTiling::plan(&self.chip(), shape)?;
        let Some(rt) = self.dev() else {
            return emu::sampling(&self.chip(), &t, probs, uniforms);
        };
        emu::check_len("sampling", "probs", probs.len(), shape.rows * shape.vocab)?;
        emu::check_len("sampling", "uniforms", uniforms.len(), shape.rows)?;
        let o = Self::launch(
            rt,
            "sampling",
            &t,
            t.block_dim,
            &[f32_bytes(probs), u32_bytes(uniforms)],
            &[4 * shape.rows],
        )?;
        Ok(from_le(&o[0], u32::from_le_bytes))
    }
}

//! [`deepinfer_kernels::Backend`] for Ascend: the decode ops with an Ascend kernel run through
//! a [`KernelRunner`] (emulated or on a device, chosen explicitly); every other op runs on the
//! CPU reference backend, host side. [`ASCEND_OPS`] lists which is which.
//!
//! Numerics of the Ascend ops are the kernels': activations enter as bf16 (f32 inputs are
//! rounded to nearest even first) and bf16 results are returned widened to f32.

use std::sync::Arc;

use deepinfer_kernels::{
    Backend, CpuBackend, DType, ExpertWeights, FakeQuant, HcMixes, KernelError, QuantFormat,
    QuantMatrix, RouteParams, RouteScore, ScaleFormat, TensorInfo, Unary,
};
use half::bf16;

use crate::chip::Chip;
use crate::emu::{AttentionInputs, GemvInputs};
use crate::error::AscendError;
use crate::mx::{self, MX_BLOCK, MxFormat};
use crate::runner::{KernelRunner, Mode};
use crate::runtime::RuntimeOptions;
use crate::tiling::*;

type KResult<T> = deepinfer_kernels::Result<T>;

/// Backend ops that run on Ascend kernels; all others run on the CPU reference.
pub const ASCEND_OPS: &[&str] = &[
    "rms_norm",
    "rope",
    "matmul",
    "sparse_attention",
    "hc_expand",
    "moe_route",
];

/// A host tensor, plus the quantised payload of an uploaded MX weight so GEMV can use it.
#[derive(Debug, Clone)]
pub struct AscendTensor {
    host: deepinfer_kernels::CpuTensor,
    quant: Option<Arc<QuantMatrix>>,
}

impl AscendTensor {
    fn plain(host: deepinfer_kernels::CpuTensor) -> Self {
        Self { host, quant: None }
    }
}

impl TensorInfo for AscendTensor {
    fn shape(&self) -> &[usize] {
        self.host.shape()
    }
    fn dtype(&self) -> DType {
        self.host.dtype()
    }
}

/// The Ascend backend. Build it with [`AscendBackend::emulated`] or [`AscendBackend::device`];
/// there is no silent fallback from one to the other.
#[derive(Debug)]
pub struct AscendBackend {
    runner: KernelRunner,
    cpu: CpuBackend,
}

fn kerr(op: &'static str) -> impl Fn(AscendError) -> KernelError {
    move |e| match e {
        AscendError::Shape(detail) => KernelError::Shape { op, detail },
        other => KernelError::Device(other.to_string()),
    }
}

fn to_bf16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

fn widen(v: &[bf16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}

/// E8M0 code of a power-of-two scale value.
fn e8m0_code(v: f32) -> u8 {
    let e = (v.to_bits() >> 23) & 0xff;
    if e == 0 { 0 } else { e as u8 }
}

impl AscendBackend {
    /// Kernels emulated on the CPU, planned for `chip`.
    pub fn emulated(chip: Chip) -> Self {
        Self {
            runner: KernelRunner::emulated(chip.spec()),
            cpu: CpuBackend::new(),
        }
    }

    /// Kernels on a real NPU; an error when AscendCL or the device is unavailable.
    pub fn device(opts: &RuntimeOptions) -> crate::Result<Self> {
        Ok(Self {
            runner: KernelRunner::device(opts)?,
            cpu: CpuBackend::new(),
        })
    }

    /// The kernel runner (its mode says emulated or device).
    pub fn runner(&self) -> &KernelRunner {
        &self.runner
    }

    fn f32s(&self, t: &AscendTensor) -> KResult<Vec<f32>> {
        self.cpu.download_f32(&t.host)
    }

    fn wrap(&self, data: &[f32], shape: &[usize]) -> KResult<AscendTensor> {
        Ok(AscendTensor::plain(self.cpu.upload_f32(data, shape)?))
    }

    fn wrap_all(&self, v: KResult<deepinfer_kernels::CpuTensor>) -> KResult<AscendTensor> {
        v.map(AscendTensor::plain)
    }

    fn mx_weight(q: &QuantMatrix) -> Option<(MxFormat, Vec<u8>)> {
        let f = match q.format() {
            QuantFormat::Mxfp4 => MxFormat::Fp4E2M1,
            QuantFormat::Fp8 {
                block_rows: 1,
                block_cols: 32,
                scale: ScaleFormat::Ue8m0,
            } => MxFormat::Fp8E4M3,
            _ => return None,
        };
        if q.tensor_scale() != 1.0 || !q.cols().is_multiple_of(MX_BLOCK) {
            return None;
        }
        let nb = q.cols() / MX_BLOCK;
        let scales = (0..q.rows())
            .flat_map(|r| (0..nb).map(move |b| (r, b)))
            .map(|(r, b)| e8m0_code(q.block_scale(r, b)))
            .collect();
        Some((f, scales))
    }
}

impl Backend for AscendBackend {
    type Tensor = AscendTensor;

    fn name(&self) -> String {
        match self.runner.mode() {
            Mode::Emulated(c) => format!("ascend-emulated:{}", c.chip.name()),
            Mode::Device(rt) => format!("ascend:{}", rt.soc_name()),
        }
    }

    fn upload_f32(&self, data: &[f32], shape: &[usize]) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.upload_f32(data, shape))
    }
    fn upload_bf16(&self, data: &[bf16], shape: &[usize]) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.upload_bf16(data, shape))
    }
    fn upload_f16(&self, data: &[half::f16], shape: &[usize]) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.upload_f16(data, shape))
    }
    fn upload_i32(&self, data: &[i32], shape: &[usize]) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.upload_i32(data, shape))
    }
    fn upload_i64(&self, data: &[i64], shape: &[usize]) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.upload_i64(data, shape))
    }
    fn upload_quant(&self, q: &QuantMatrix) -> KResult<AscendTensor> {
        Ok(AscendTensor {
            host: self.cpu.upload_quant(q)?,
            quant: Some(Arc::new(q.clone())),
        })
    }
    fn download_f32(&self, t: &AscendTensor) -> KResult<Vec<f32>> {
        self.cpu.download_f32(&t.host)
    }
    fn download_i32(&self, t: &AscendTensor) -> KResult<Vec<i32>> {
        self.cpu.download_i32(&t.host)
    }
    fn download_i64(&self, t: &AscendTensor) -> KResult<Vec<i64>> {
        self.cpu.download_i64(&t.host)
    }
    fn zeros(&self, shape: &[usize], dtype: DType) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.zeros(shape, dtype))
    }
    fn cast(&self, t: &AscendTensor, dtype: DType) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.cast(&t.host, dtype))
    }
    fn reshape(&self, t: &AscendTensor, shape: &[usize]) -> KResult<AscendTensor> {
        Ok(AscendTensor {
            host: self.cpu.reshape(&t.host, shape)?,
            quant: t.quant.clone(),
        })
    }
    fn narrow(
        &self,
        t: &AscendTensor,
        dim: usize,
        start: usize,
        len: usize,
    ) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.narrow(&t.host, dim, start, len))
    }
    fn concat(&self, ts: &[&AscendTensor], dim: usize) -> KResult<AscendTensor> {
        let hs: Vec<&deepinfer_kernels::CpuTensor> = ts.iter().map(|t| &t.host).collect();
        self.wrap_all(self.cpu.concat(&hs, dim))
    }
    fn transpose(&self, t: &AscendTensor, a: usize, b: usize) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.transpose(&t.host, a, b))
    }
    fn gather_rows(&self, table: &AscendTensor, idx: &AscendTensor) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.gather_rows(&table.host, &idx.host))
    }
    fn write_rows(&self, dst: &mut AscendTensor, row: usize, src: &AscendTensor) -> KResult<()> {
        dst.quant = None;
        self.cpu.write_rows(&mut dst.host, row, &src.host)
    }
    fn copy_blocks(&self, cache: &mut AscendTensor, pairs: &[(usize, usize)]) -> KResult<()> {
        cache.quant = None;
        self.cpu.copy_blocks(&mut cache.host, pairs)
    }
    fn add(&self, a: &AscendTensor, b: &AscendTensor) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.add(&a.host, &b.host))
    }
    fn mul(&self, a: &AscendTensor, b: &AscendTensor) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.mul(&a.host, &b.host))
    }
    fn affine(&self, a: &AscendTensor, s: f32, c: f32) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.affine(&a.host, s, c))
    }
    fn unary(&self, a: &AscendTensor, f: Unary) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.unary(&a.host, f))
    }
    fn swiglu(&self, gate: &AscendTensor, up: &AscendTensor, limit: f32) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.swiglu(&gate.host, &up.host, limit))
    }
    fn softmax(&self, a: &AscendTensor) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.softmax(&a.host))
    }

    /// Ascend `rmsnorm_quant` kernel (no quantised output): bf16 in, bf16 out, f32 math.
    fn rms_norm(
        &self,
        x: &AscendTensor,
        w: Option<&AscendTensor>,
        eps: f32,
    ) -> KResult<AscendTensor> {
        const OP: &str = "rms_norm";
        let shape = x.shape().to_vec();
        let dim = *shape.last().ok_or_else(|| KernelError::Shape {
            op: OP,
            detail: "scalar input".into(),
        })?;
        let rows = x.numel().checked_div(dim).unwrap_or(0);
        let wv = match w {
            Some(w) => self.f32s(w)?,
            None => vec![1.0; dim],
        };
        let xs = to_bf16(&self.f32s(x)?);
        let out = self
            .runner
            .rmsnorm_quant(
                &RmsNormShape {
                    rows,
                    dim,
                    eps,
                    quant: false,
                },
                &xs,
                &wv,
            )
            .map_err(kerr(OP))?;
        self.wrap(&widen(&out.y), &shape)
    }

    fn mean_axis1(&self, x: &AscendTensor) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.mean_axis1(&x.host))
    }
    fn argmax(&self, x: &AscendTensor) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.argmax(&x.host))
    }

    /// Ascend `gemv` kernel for bf16 weights and MX weights (MXFP8 with 1×32 UE8M0 blocks,
    /// MXFP4); activations are rounded to bf16, or quantised to MXFP8 for MX weights. Other
    /// weight dtypes run on the CPU reference.
    fn matmul(&self, x: &AscendTensor, w: &AscendTensor) -> KResult<AscendTensor> {
        const OP: &str = "matmul";
        let ws = w.shape().to_vec();
        let xs_shape = x.shape().to_vec();
        let mx = w
            .quant
            .as_ref()
            .and_then(|q| Self::mx_weight(q).map(|(f, s)| (q.clone(), f, s)));
        let bf16_w = w.dtype() == DType::BF16;
        if ws.len() != 2
            || xs_shape.last() != Some(&ws[1])
            || !(bf16_w || mx.is_some())
            || !ws[1].is_multiple_of(16)
        {
            return self.wrap_all(self.cpu.matmul(&x.host, &w.host));
        }
        let (n, k) = (ws[0], ws[1]);
        let m_total = x.numel().checked_div(k).unwrap_or(0);
        let xv = self.f32s(x)?;
        let wv = if bf16_w {
            to_bf16(&self.f32s(w)?)
        } else {
            Vec::new()
        };
        let mut y = Vec::with_capacity(m_total * n);
        for chunk in xv.chunks(GemvTiling::MAX_M * k) {
            let m = chunk.len() / k;
            let part = match &mx {
                None => {
                    let xb = to_bf16(chunk);
                    let shape = GemvShape {
                        m,
                        n,
                        k,
                        format: GemvFormat::Bf16,
                    };
                    self.runner
                        .gemv(&shape, GemvInputs::Bf16 { x: &xb, w: &wv })
                }
                Some((q, f, scales)) => {
                    let (xq, xsc) = mx::quantize(MxFormat::Fp8E4M3, chunk);
                    let shape = GemvShape {
                        m,
                        n,
                        k,
                        format: GemvFormat::Mx(*f),
                    };
                    let inp = GemvInputs::Mx {
                        format: *f,
                        x: &xq,
                        x_scales: &xsc,
                        w: q.data(),
                        w_scales: scales,
                    };
                    self.runner.gemv(&shape, inp)
                }
            }
            .map_err(kerr(OP))?;
            y.extend(part);
        }
        let mut out_shape = xs_shape[..xs_shape.len() - 1].to_vec();
        out_shape.push(n);
        self.wrap(&y, &out_shape)
    }

    fn bmm(&self, a: &AscendTensor, c: &AscendTensor) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.bmm(&a.host, &c.host))
    }
    fn grouped_matmul(&self, x: &AscendTensor, w: &AscendTensor) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.grouped_matmul(&x.host, &w.host))
    }

    /// Ascend `rope` kernel: one cos/sin table row per input row (angles in f64, stored f32).
    fn rope(
        &self,
        x: &AscendTensor,
        pos: &[i64],
        inv_freq: &[f64],
        inverse: bool,
    ) -> KResult<AscendTensor> {
        const OP: &str = "rope";
        let shape = x.shape().to_vec();
        let (rows, heads, d) = match shape.as_slice() {
            [s, d] => (*s, 1, *d),
            [s, h, d] => (*s, *h, *d),
            _ => {
                return Err(KernelError::Shape {
                    op: OP,
                    detail: format!("{shape:?} is not [S, d] or [S, H, d]"),
                });
            }
        };
        if pos.len() != rows {
            return Err(KernelError::Shape {
                op: OP,
                detail: format!("{} positions for {rows} rows", pos.len()),
            });
        }
        let (mut c, mut s) = (Vec::new(), Vec::new());
        for &p in pos {
            for fr in inv_freq {
                let a = p as f64 * fr;
                c.push(a.cos() as f32);
                s.push(a.sin() as f32);
            }
        }
        let idx: Vec<u32> = (0..rows as u32).collect();
        let rs = RopeShape {
            rows,
            heads,
            head_dim: d,
            rope_dim: 2 * inv_freq.len(),
            table_len: rows,
            inverse,
        };
        let xb = to_bf16(&self.f32s(x)?);
        let y = self.runner.rope(&rs, &xb, &idx, &c, &s).map_err(kerr(OP))?;
        self.wrap(&widen(&y), &shape)
    }

    /// Ascend `attention` kernel, one launch per query row; the row's keys are gathered from
    /// `kv` by `idx` (`-1` skipped).
    fn sparse_attention(
        &self,
        q: &AscendTensor,
        kv: &AscendTensor,
        idx: &AscendTensor,
        sink: &AscendTensor,
        scale: f32,
    ) -> KResult<AscendTensor> {
        const OP: &str = "sparse_attention";
        let qs = q.shape().to_vec();
        let [s, h, d] = qs[..] else {
            return Err(KernelError::Shape {
                op: OP,
                detail: format!("q {qs:?} is not [S, H, d]"),
            });
        };
        let kvs = kv.shape().to_vec();
        if kvs.len() != 2 || kvs[1] != d {
            return Err(KernelError::Shape {
                op: OP,
                detail: format!("kv {kvs:?} vs head_dim {d}"),
            });
        }
        let ids = self.cpu.download_i64(&idx.host)?;
        let kk = ids.len().checked_div(s).unwrap_or(0);
        if ids.len() != s * kk {
            return Err(KernelError::Shape {
                op: OP,
                detail: "idx rows do not match q".into(),
            });
        }
        let qv = to_bf16(&self.f32s(q)?);
        let kvv = to_bf16(&self.f32s(kv)?);
        let sinks = self.f32s(sink)?;
        let mut out = Vec::with_capacity(s * h * d);
        for r in 0..s {
            let sel: Vec<u32> = ids[r * kk..(r + 1) * kk]
                .iter()
                .filter(|&&i| i >= 0)
                .map(|&i| i as u32)
                .collect();
            let shape = AttentionShape {
                heads: h,
                head_dim: d,
                n_window: 0,
                n_comp: sel.len(),
                comp_rows: kvs[0],
                scale,
            };
            let a = AttentionInputs {
                q: &qv[r * h * d..(r + 1) * h * d],
                window: &[],
                comp: &kvv,
                comp_idx: &sel,
                sinks: &sinks,
            };
            out.extend(widen(&self.runner.attention(&shape, a).map_err(kerr(OP))?));
        }
        self.wrap(&out, &qs)
    }

    fn compress_pool(
        &self,
        a: &AscendTensor,
        z: &AscendTensor,
        ratio: usize,
        overlap: bool,
        first_is_context: bool,
    ) -> KResult<AscendTensor> {
        self.wrap_all(
            self.cpu
                .compress_pool(&a.host, &z.host, ratio, overlap, first_is_context),
        )
    }
    fn indexer_scores(
        &self,
        q: &AscendTensor,
        k: &AscendTensor,
        w: &AscendTensor,
        visible: &[usize],
        scale: f32,
    ) -> KResult<AscendTensor> {
        self.wrap_all(
            self.cpu
                .indexer_scores(&q.host, &k.host, &w.host, visible, scale),
        )
    }
    fn topk(&self, x: &AscendTensor, k: usize) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.topk(&x.host, k))
    }
    fn block_max(&self, x: &AscendTensor, block: usize) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.block_max(&x.host, block))
    }
    fn mask_neg_inf(&self, x: &AscendTensor, keep: &AscendTensor) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.mask_neg_inf(&x.host, &keep.host))
    }
    fn hc_mixes(
        &self,
        mix: &AscendTensor,
        scale: &AscendTensor,
        base: &AscendTensor,
        n: usize,
        eps: f32,
        sinkhorn_iters: usize,
    ) -> KResult<HcMixes<AscendTensor>> {
        let m = self
            .cpu
            .hc_mixes(&mix.host, &scale.host, &base.host, n, eps, sinkhorn_iters)?;
        Ok(HcMixes {
            pre: AscendTensor::plain(m.pre),
            post: AscendTensor::plain(m.post),
            comb: AscendTensor::plain(m.comb),
        })
    }
    fn hc_pre_only(
        &self,
        mix: &AscendTensor,
        scale: &AscendTensor,
        base: &AscendTensor,
        eps: f32,
    ) -> KResult<AscendTensor> {
        self.wrap_all(
            self.cpu
                .hc_pre_only(&mix.host, &scale.host, &base.host, eps),
        )
    }
    fn hc_collapse(&self, x: &AscendTensor, pre: &AscendTensor) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.hc_collapse(&x.host, &pre.host))
    }

    /// Ascend `hc_mix` kernel: bf16 streams, f32 math, bf16 result (widened to f32).
    fn hc_expand(
        &self,
        x: &AscendTensor,
        out: &AscendTensor,
        post: &AscendTensor,
        comb: &AscendTensor,
    ) -> KResult<AscendTensor> {
        const OP: &str = "hc_expand";
        let xs = x.shape().to_vec();
        let [rows, streams, dim] = xs[..] else {
            return Err(KernelError::Shape {
                op: OP,
                detail: format!("x {xs:?} is not [S, N, D]"),
            });
        };
        let shape = HcMixShape { rows, streams, dim };
        let y = self
            .runner
            .hc_mix(
                &shape,
                &to_bf16(&self.f32s(x)?),
                &to_bf16(&self.f32s(out)?),
                &self.f32s(post)?,
                &self.f32s(comb)?,
            )
            .map_err(kerr(OP))?;
        self.wrap(&widen(&y), &xs)
    }

    /// Ascend `router` kernel for softmax and sqrt-softplus scores; sigmoid scores run on the
    /// CPU reference.
    fn moe_route(
        &self,
        logits: &AscendTensor,
        bias: Option<&AscendTensor>,
        p: RouteParams,
    ) -> KResult<(AscendTensor, AscendTensor)> {
        const OP: &str = "moe_route";
        let score = match p.score {
            RouteScore::Softmax => ScoreFunc::Softmax,
            RouteScore::SqrtSoftplus => ScoreFunc::SqrtSoftplus,
            _ => {
                let (i, w) = self.cpu.moe_route(&logits.host, bias.map(|b| &b.host), p)?;
                return Ok((AscendTensor::plain(i), AscendTensor::plain(w)));
            }
        };
        let ls = logits.shape().to_vec();
        let [rows, experts] = ls[..] else {
            return Err(KernelError::Shape {
                op: OP,
                detail: format!("logits {ls:?} is not [S, E]"),
            });
        };
        let b = match bias {
            Some(b) => self.f32s(b)?,
            None => vec![0.0; experts],
        };
        let shape = RouterShape {
            rows,
            experts,
            top_k: p.top_k,
            score,
            temperature: 1.0,
            renorm: p.renormalize,
            route_scale: p.scale,
        };
        let r = self
            .runner
            .router(&shape, &self.f32s(logits)?, &b)
            .map_err(kerr(OP))?;
        let ids: Vec<i32> = r.ids.iter().map(|&i| i as i32).collect();
        Ok((
            AscendTensor::plain(self.cpu.upload_i32(&ids, &[rows, p.top_k])?),
            self.wrap(&r.weights, &[rows, p.top_k])?,
        ))
    }

    fn moe_route_hash(
        &self,
        logits: &AscendTensor,
        table: &AscendTensor,
        ids: &AscendTensor,
        p: RouteParams,
    ) -> KResult<(AscendTensor, AscendTensor)> {
        let (i, w) = self
            .cpu
            .moe_route_hash(&logits.host, &table.host, &ids.host, p)?;
        Ok((AscendTensor::plain(i), AscendTensor::plain(w)))
    }
    fn moe_experts(
        &self,
        x: &AscendTensor,
        indices: &AscendTensor,
        weights: &AscendTensor,
        experts: &[ExpertWeights<'_, AscendTensor>],
        limit: f32,
    ) -> KResult<AscendTensor> {
        let ex: Vec<ExpertWeights<'_, deepinfer_kernels::CpuTensor>> = experts
            .iter()
            .map(|e| ExpertWeights {
                gate: &e.gate.host,
                up: &e.up.host,
                down: &e.down.host,
            })
            .collect();
        self.wrap_all(
            self.cpu
                .moe_experts(&x.host, &indices.host, &weights.host, &ex, limit),
        )
    }
    fn fake_quant(&self, x: &AscendTensor, f: FakeQuant) -> KResult<AscendTensor> {
        self.wrap_all(self.cpu.fake_quant(&x.host, f))
    }
}

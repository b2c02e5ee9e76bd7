//! `impl Backend for CpuBackend`: argument checks, then the slice kernels.

use super::buf::Buf;
use std::sync::Arc;

use half::{bf16, f16};
use rayon::prelude::*;

use super::experts::swiglu_vec;
use super::gemm::{self, WeightRef};
use super::layout::{self, split_at_axis};
use super::tensor::{CpuTensor, Data, check_len, want_rank};
use super::{CpuBackend, attention, hc, moe};
use crate::DType;
use crate::backend::{Backend, ExpertWeights, HcMixes, RouteParams, TensorInfo, Unary};
use crate::error::{KernelError, Result, invalid, shape_err};
use crate::quant::{FakeQuant, QuantMatrix};

pub(super) fn f32t(data: Vec<f32>, shape: &[usize]) -> CpuTensor {
    CpuTensor::f32_unchecked(data, shape)
}

fn dtype_err(op: &'static str, t: &CpuTensor) -> KernelError {
    KernelError::DType {
        op,
        dtype: t.dtype(),
    }
}

/// The weight view of a rank-2 tensor: `(w, n, k)`.
pub(super) fn weight_ref<'a>(
    op: &'static str,
    w: &'a CpuTensor,
) -> Result<(WeightRef<'a>, usize, usize)> {
    want_rank(op, w, 2)?;
    let (n, k) = (w.shape[0], w.shape[1]);
    let r = match &w.data {
        Data::F32(v) => WeightRef::F32(v),
        Data::BF16(v) => WeightRef::BF16(v),
        Data::F16(v) => WeightRef::F16(v),
        Data::Quant(q) => WeightRef::Quant(q),
        _ => return Err(dtype_err(op, w)),
    };
    Ok((r, n, k))
}

pub(super) fn check_index(op: &'static str, idx: &[i64], bound: usize) -> Result<()> {
    if let Some(&bad) = idx.iter().find(|&&i| i < -1 || i >= bound as i64) {
        return Err(invalid(op, format!("index {bad} out of range 0..{bound}")));
    }
    Ok(())
}

/// Elementwise binary op with suffix broadcasting of `b`.
fn binary(
    op: &'static str,
    a: &CpuTensor,
    b: &CpuTensor,
    f: impl Fn(f32, f32) -> f32 + Sync,
) -> Result<CpuTensor> {
    let sa = &a.shape;
    let sb = &b.shape;
    if sb.len() > sa.len() || sa[sa.len() - sb.len()..] != sb[..] {
        return Err(shape_err(
            op,
            format!("{sb:?} does not broadcast to {sa:?}"),
        ));
    }
    let av = a.to_f32(op)?;
    let bv = b.to_f32(op)?;
    let nb = bv.len();
    let mut out = vec![0.0f32; av.len()];
    if nb > 0 {
        out.par_chunks_mut(nb)
            .zip(av.par_chunks(nb))
            .for_each(|(o, x)| {
                for ((o, &x), &y) in o.iter_mut().zip(x).zip(bv.iter()) {
                    *o = f(x, y);
                }
            });
    }
    Ok(f32t(out, sa))
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;

    fn name(&self) -> String {
        if self.config.batch_invariant {
            "cpu (batch-invariant)".into()
        } else {
            "cpu".into()
        }
    }

    fn upload_f32(&self, data: &[f32], shape: &[usize]) -> Result<CpuTensor> {
        check_len("upload_f32", data.len(), shape)?;
        Ok(f32t(data.to_vec(), shape))
    }

    fn upload_bf16(&self, data: &[bf16], shape: &[usize]) -> Result<CpuTensor> {
        check_len("upload_bf16", data.len(), shape)?;
        Ok(CpuTensor {
            shape: shape.to_vec(),
            data: Data::BF16(Buf::owned(data.to_vec())),
        })
    }

    fn upload_f16(&self, data: &[f16], shape: &[usize]) -> Result<CpuTensor> {
        check_len("upload_f16", data.len(), shape)?;
        Ok(CpuTensor {
            shape: shape.to_vec(),
            data: Data::F16(Buf::owned(data.to_vec())),
        })
    }

    fn upload_i32(&self, data: &[i32], shape: &[usize]) -> Result<CpuTensor> {
        check_len("upload_i32", data.len(), shape)?;
        Ok(CpuTensor::i32_unchecked(data.to_vec(), shape))
    }

    fn upload_i64(&self, data: &[i64], shape: &[usize]) -> Result<CpuTensor> {
        check_len("upload_i64", data.len(), shape)?;
        Ok(CpuTensor {
            shape: shape.to_vec(),
            data: Data::I64(Buf::owned(data.to_vec())),
        })
    }

    fn upload_quant(&self, q: &QuantMatrix) -> Result<CpuTensor> {
        Ok(CpuTensor {
            shape: vec![q.rows(), q.cols()],
            data: Data::Quant(Arc::new(q.clone())),
        })
    }

    fn upload_shared(
        &self,
        bytes: crate::SharedBytes,
        start: usize,
        dtype: DType,
        shape: &[usize],
    ) -> Result<CpuTensor> {
        let n: usize = shape.iter().product();
        let view = cfg!(target_endian = "little").then(|| match dtype {
            DType::F32 => Buf::view(bytes.clone(), start, n).map(Data::F32),
            DType::BF16 => Buf::view(bytes.clone(), start, n).map(Data::BF16),
            DType::F16 => Buf::view(bytes.clone(), start, n).map(Data::F16),
            d => Err(invalid("upload_shared", format!("dtype {d:?}"))),
        });
        match view {
            Some(Ok(data)) => Ok(CpuTensor {
                shape: shape.to_vec(),
                data,
            }),
            // Misaligned (or a big-endian host): decode a copy.
            _ => crate::backend::upload_shared_copy(self, bytes, start, dtype, shape),
        }
    }

    fn download_f32(&self, t: &CpuTensor) -> Result<Vec<f32>> {
        Ok(t.to_f32("download_f32")?.into_owned())
    }

    fn download_i32(&self, t: &CpuTensor) -> Result<Vec<i32>> {
        match &t.data {
            Data::I32(v) => Ok(v.to_vec()),
            Data::I64(v) => v
                .iter()
                .map(|&x| {
                    i32::try_from(x)
                        .map_err(|_| invalid("download_i32", format!("{x} overflows i32")))
                })
                .collect(),
            _ => Err(dtype_err("download_i32", t)),
        }
    }

    fn download_i64(&self, t: &CpuTensor) -> Result<Vec<i64>> {
        Ok(t.to_i64("download_i64")?.into_owned())
    }

    fn zeros(&self, shape: &[usize], dtype: DType) -> Result<CpuTensor> {
        let n: usize = shape.iter().product();
        let data = match dtype {
            DType::F32 => Data::F32(Buf::owned(vec![0.0; n])),
            DType::BF16 => Data::BF16(Buf::owned(vec![bf16::ZERO; n])),
            DType::F16 => Data::F16(Buf::owned(vec![f16::ZERO; n])),
            DType::I32 => Data::I32(Buf::owned(vec![0; n])),
            DType::I64 => Data::I64(Buf::owned(vec![0; n])),
            other => {
                return Err(KernelError::DType {
                    op: "zeros",
                    dtype: other,
                });
            }
        };
        Ok(CpuTensor {
            shape: shape.to_vec(),
            data,
        })
    }

    fn cast(&self, t: &CpuTensor, dtype: DType) -> Result<CpuTensor> {
        const OP: &str = "cast";
        if !t.dtype().is_float() {
            return Err(dtype_err(OP, t));
        }
        let v = t.to_f32(OP)?;
        let data = match dtype {
            DType::F32 => Data::F32(Buf::owned(v.into_owned())),
            DType::BF16 => Data::BF16(Buf::owned(v.iter().map(|&x| bf16::from_f32(x)).collect())),
            DType::F16 => Data::F16(Buf::owned(v.iter().map(|&x| f16::from_f32(x)).collect())),
            other => {
                return Err(KernelError::DType {
                    op: OP,
                    dtype: other,
                });
            }
        };
        Ok(CpuTensor {
            shape: t.shape.clone(),
            data,
        })
    }

    fn reshape(&self, t: &CpuTensor, shape: &[usize]) -> Result<CpuTensor> {
        if let Data::Quant(_) = t.data {
            return Err(dtype_err("reshape", t));
        }
        check_len("reshape", t.numel(), shape)?;
        Ok(CpuTensor {
            shape: shape.to_vec(),
            data: t.data.clone(),
        })
    }

    fn narrow(&self, t: &CpuTensor, dim: usize, start: usize, len: usize) -> Result<CpuTensor> {
        const OP: &str = "narrow";
        if dim >= t.shape.len() || start + len > t.shape[dim] {
            return Err(shape_err(
                OP,
                format!("{start}+{len} on axis {dim} of {:?}", t.shape),
            ));
        }
        let mut shape = t.shape.clone();
        shape[dim] = len;
        let data = match &t.data {
            Data::F32(v) => Data::F32(Buf::owned(layout::narrow(v, &t.shape, dim, start, len))),
            Data::BF16(v) => Data::BF16(Buf::owned(layout::narrow(v, &t.shape, dim, start, len))),
            Data::F16(v) => Data::F16(Buf::owned(layout::narrow(v, &t.shape, dim, start, len))),
            Data::I32(v) => Data::I32(Buf::owned(layout::narrow(v, &t.shape, dim, start, len))),
            Data::I64(v) => Data::I64(Buf::owned(layout::narrow(v, &t.shape, dim, start, len))),
            Data::Quant(_) => return Err(dtype_err(OP, t)),
        };
        Ok(CpuTensor { shape, data })
    }

    fn concat(&self, ts: &[&CpuTensor], dim: usize) -> Result<CpuTensor> {
        const OP: &str = "concat";
        let first = ts.first().ok_or_else(|| invalid(OP, "no tensors"))?;
        if dim >= first.shape.len() {
            return Err(shape_err(OP, format!("axis {dim} of {:?}", first.shape)));
        }
        for t in ts {
            let ok = t.shape.len() == first.shape.len()
                && t.dtype() == first.dtype()
                && t.shape
                    .iter()
                    .zip(&first.shape)
                    .enumerate()
                    .all(|(i, (a, b))| i == dim || a == b);
            if !ok {
                return Err(shape_err(OP, format!("{:?} vs {:?}", t.shape, first.shape)));
            }
        }
        let (outer, _, inner) = split_at_axis(&first.shape, dim);
        let mut shape = first.shape.clone();
        shape[dim] = ts.iter().map(|t| t.shape[dim]).sum();
        macro_rules! cat {
            ($var:ident) => {{
                let parts: Vec<(&[_], usize)> = ts
                    .iter()
                    .map(|t| match &t.data {
                        Data::$var(v) => Ok((v.as_slice(), t.shape[dim])),
                        _ => Err(dtype_err(OP, t)),
                    })
                    .collect::<Result<_>>()?;
                Data::$var(Buf::owned(layout::concat(&parts, outer, inner)))
            }};
        }
        let data = match &first.data {
            Data::F32(_) => cat!(F32),
            Data::BF16(_) => cat!(BF16),
            Data::F16(_) => cat!(F16),
            Data::I32(_) => cat!(I32),
            Data::I64(_) => cat!(I64),
            Data::Quant(_) => return Err(dtype_err(OP, first)),
        };
        Ok(CpuTensor { shape, data })
    }

    fn transpose(&self, t: &CpuTensor, a: usize, b: usize) -> Result<CpuTensor> {
        const OP: &str = "transpose";
        let rank = t.shape.len();
        if a >= rank || b >= rank {
            return Err(shape_err(OP, format!("axes {a},{b} of {:?}", t.shape)));
        }
        let mut shape = t.shape.clone();
        shape.swap(a, b);
        let data = match &t.data {
            Data::F32(v) => Data::F32(Buf::owned(layout::transpose(v, &t.shape, a, b))),
            Data::BF16(v) => Data::BF16(Buf::owned(layout::transpose(v, &t.shape, a, b))),
            Data::F16(v) => Data::F16(Buf::owned(layout::transpose(v, &t.shape, a, b))),
            Data::I32(v) => Data::I32(Buf::owned(layout::transpose(v, &t.shape, a, b))),
            Data::I64(v) => Data::I64(Buf::owned(layout::transpose(v, &t.shape, a, b))),
            Data::Quant(_) => return Err(dtype_err(OP, t)),
        };
        Ok(CpuTensor { shape, data })
    }

    fn gather_rows(&self, table: &CpuTensor, idx: &CpuTensor) -> Result<CpuTensor> {
        super::rows::gather_rows(table, idx)
    }

    fn write_rows(&self, dst: &mut CpuTensor, row: usize, src: &CpuTensor) -> Result<()> {
        super::rows::write_rows(dst, row, src)
    }

    fn copy_blocks(&self, cache: &mut CpuTensor, pairs: &[(usize, usize)]) -> Result<()> {
        super::rows::copy_blocks(cache, pairs)
    }

    fn add(&self, a: &CpuTensor, b: &CpuTensor) -> Result<CpuTensor> {
        self.run(|| binary("add", a, b, |x, y| x + y))
    }

    fn mul(&self, a: &CpuTensor, b: &CpuTensor) -> Result<CpuTensor> {
        self.run(|| binary("mul", a, b, |x, y| x * y))
    }

    fn affine(&self, a: &CpuTensor, s: f32, c: f32) -> Result<CpuTensor> {
        let v = a.to_f32("affine")?;
        Ok(f32t(v.iter().map(|x| x * s + c).collect(), &a.shape))
    }

    fn unary(&self, a: &CpuTensor, f: Unary) -> Result<CpuTensor> {
        let v = a.to_f32("unary")?;
        let g = |x: f32| -> f32 {
            match f {
                Unary::Silu => x / (1.0 + (-x).exp()),
                Unary::Sigmoid => 1.0 / (1.0 + (-x).exp()),
                Unary::Softplus => moe::softplus(x as f64) as f32,
                Unary::SqrtSoftplus => moe::softplus(x as f64).sqrt() as f32,
                Unary::Relu => x.max(0.0),
                Unary::Exp => x.exp(),
                Unary::Neg => -x,
                Unary::SignedSqrtSigmoid => {
                    let t = (x.abs().max(1e-6) as f64).sqrt().copysign(x as f64);
                    (1.0 / (1.0 + (-t).exp())) as f32
                }
            }
        };
        Ok(f32t(v.iter().map(|&x| g(x)).collect(), &a.shape))
    }

    fn swiglu(&self, gate: &CpuTensor, up: &CpuTensor, limit: f32) -> Result<CpuTensor> {
        if gate.shape != up.shape {
            return Err(shape_err(
                "swiglu",
                format!("{:?} vs {:?}", gate.shape, up.shape),
            ));
        }
        let g = gate.to_f32("swiglu")?;
        let u = up.to_f32("swiglu")?;
        Ok(f32t(swiglu_vec(&g, &u, limit), &gate.shape))
    }

    fn softmax(&self, a: &CpuTensor) -> Result<CpuTensor> {
        let v = a.to_f32("softmax")?;
        let n = a.last();
        let mut out = v.into_owned();
        if n > 0 {
            self.run(|| {
                out.par_chunks_mut(n).for_each(|row| {
                    let mx = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                    if mx == f32::NEG_INFINITY {
                        row.fill(0.0);
                        return;
                    }
                    let mut sum = 0.0f32;
                    for x in row.iter_mut() {
                        *x = (*x - mx).exp();
                        sum += *x;
                    }
                    for x in row.iter_mut() {
                        *x /= sum;
                    }
                })
            });
        }
        Ok(f32t(out, &a.shape))
    }

    fn rms_norm(&self, x: &CpuTensor, w: Option<&CpuTensor>, eps: f32) -> Result<CpuTensor> {
        const OP: &str = "rms_norm";
        let d = x.last();
        let wv = match w {
            Some(w) => {
                if w.numel() != d {
                    return Err(shape_err(
                        OP,
                        format!("weight {:?} for rows of {d}", w.shape),
                    ));
                }
                Some(w.to_f32(OP)?)
            }
            None => None,
        };
        let mut out = x.to_f32(OP)?.into_owned();
        if d > 0 {
            self.run(|| {
                out.par_chunks_mut(d).for_each(|row| {
                    let ms = gemm::dot(row, row) / d as f32;
                    let inv = 1.0 / (ms + eps).sqrt();
                    match &wv {
                        Some(w) => {
                            for (v, g) in row.iter_mut().zip(w.iter()) {
                                *v = *v * inv * g;
                            }
                        }
                        None => {
                            for v in row.iter_mut() {
                                *v *= inv;
                            }
                        }
                    }
                })
            });
        }
        Ok(f32t(out, &x.shape))
    }

    fn mean_axis1(&self, x: &CpuTensor) -> Result<CpuTensor> {
        want_rank("mean_axis1", x, 3)?;
        let (s, n, d) = (x.shape[0], x.shape[1], x.shape[2]);
        let v = x.to_f32("mean_axis1")?;
        let pre = vec![1.0 / n as f32; s * n];
        Ok(f32t(hc::collapse(&v, s, n, d, &pre), &[s, d]))
    }

    fn argmax(&self, x: &CpuTensor) -> Result<CpuTensor> {
        let v = x.to_f32("argmax")?;
        let n = x.last();
        let rows = x.rows();
        let out: Vec<i32> = (0..rows)
            .map(|r| {
                let row = &v[r * n..(r + 1) * n];
                let mut best = 0usize;
                for (i, &val) in row.iter().enumerate() {
                    if val > row[best] || (row[best].is_nan() && !val.is_nan()) {
                        best = i;
                    }
                }
                best as i32
            })
            .collect();
        Ok(CpuTensor::i32_unchecked(
            out,
            &x.shape[..x.shape.len().saturating_sub(1)],
        ))
    }

    fn matmul(&self, x: &CpuTensor, w: &CpuTensor) -> Result<CpuTensor> {
        const OP: &str = "matmul";
        let (wr, n, k) = weight_ref(OP, w)?;
        if x.last() != k || x.shape.is_empty() {
            return Err(shape_err(OP, format!("x {:?} · w {:?}ᵀ", x.shape, w.shape)));
        }
        let xv = x.to_f32(OP)?;
        let m = x.rows();
        let out = self.run(|| gemm::linear(&xv, m, k, wr, n, self.config.batch_invariant));
        let mut shape = x.shape.clone();
        *shape.last_mut().expect("rank checked") = n;
        Ok(f32t(out, &shape))
    }

    fn bmm(&self, a: &CpuTensor, c: &CpuTensor) -> Result<CpuTensor> {
        const OP: &str = "bmm";
        want_rank(OP, a, 3)?;
        want_rank(OP, c, 3)?;
        let (b, m, k) = (a.shape[0], a.shape[1], a.shape[2]);
        let n = c.shape[1];
        if c.shape[0] != b || c.shape[2] != k {
            return Err(shape_err(OP, format!("{:?} · {:?}ᵀ", a.shape, c.shape)));
        }
        let av = a.to_f32(OP)?;
        let cv = c.to_f32(OP)?;
        let mut out = Vec::with_capacity(b * m * n);
        for i in 0..b {
            let wr = WeightRef::F32(&cv[i * n * k..(i + 1) * n * k]);
            out.extend(self.run(|| {
                gemm::linear(
                    &av[i * m * k..(i + 1) * m * k],
                    m,
                    k,
                    wr,
                    n,
                    self.config.batch_invariant,
                )
            }));
        }
        Ok(f32t(out, &[b, m, n]))
    }

    fn grouped_matmul(&self, x: &CpuTensor, w: &CpuTensor) -> Result<CpuTensor> {
        const OP: &str = "grouped_matmul";
        want_rank(OP, x, 3)?;
        want_rank(OP, w, 3)?;
        let (s, g, i) = (x.shape[0], x.shape[1], x.shape[2]);
        let r = w.shape[1];
        if w.shape[0] != g || w.shape[2] != i {
            return Err(shape_err(OP, format!("x {:?}, w {:?}", x.shape, w.shape)));
        }
        let xv = x.to_f32(OP)?;
        let wv = w.to_f32(OP)?;
        let mut out = vec![0.0f32; s * g * r];
        for gi in 0..g {
            let xg: Vec<f32> = (0..s)
                .flat_map(|si| xv[(si * g + gi) * i..(si * g + gi + 1) * i].iter().copied())
                .collect();
            let wr = WeightRef::F32(&wv[gi * r * i..(gi + 1) * r * i]);
            let y = self.run(|| gemm::linear(&xg, s, i, wr, r, self.config.batch_invariant));
            for si in 0..s {
                out[(si * g + gi) * r..(si * g + gi + 1) * r]
                    .copy_from_slice(&y[si * r..(si + 1) * r]);
            }
        }
        Ok(f32t(out, &[s, g, r]))
    }

    fn rope(
        &self,
        x: &CpuTensor,
        pos: &[i64],
        inv_freq: &[f64],
        inverse: bool,
    ) -> Result<CpuTensor> {
        const OP: &str = "rope";
        if x.shape.len() < 2 || x.shape[0] != pos.len() {
            return Err(shape_err(
                OP,
                format!("x {:?} with {} positions", x.shape, pos.len()),
            ));
        }
        let d = x.last();
        if 2 * inv_freq.len() > d {
            return Err(shape_err(
                OP,
                format!("{} rotary dims > {d}", 2 * inv_freq.len()),
            ));
        }
        let mut v = x.to_f32(OP)?.into_owned();
        self.run(|| attention::rope(&mut v, x.shape[0], d, pos, inv_freq, inverse));
        Ok(f32t(v, &x.shape))
    }

    fn sparse_attention(
        &self,
        q: &CpuTensor,
        kv: &CpuTensor,
        idx: &CpuTensor,
        sink: &CpuTensor,
        scale: f32,
    ) -> Result<CpuTensor> {
        const OP: &str = "sparse_attention";
        want_rank(OP, q, 3)?;
        want_rank(OP, kv, 2)?;
        want_rank(OP, idx, 2)?;
        let (s, h, d) = (q.shape[0], q.shape[1], q.shape[2]);
        if kv.shape[1] != d || idx.shape[0] != s || sink.numel() != h {
            return Err(shape_err(
                OP,
                format!(
                    "q {:?}, kv {:?}, idx {:?}, sink {:?}",
                    q.shape, kv.shape, idx.shape, sink.shape
                ),
            ));
        }
        let ids = idx.to_i64(OP)?;
        check_index(OP, &ids, kv.shape[0])?;
        let (qv, kvv, sv) = (q.to_f32(OP)?, kv.to_f32(OP)?, sink.to_f32(OP)?);
        let out = self.run(|| {
            attention::sparse_attention(&qv, s, h, d, &kvv, &ids, idx.shape[1], &sv, scale)
        });
        Ok(f32t(out, &[s, h, d]))
    }

    fn compress_pool(
        &self,
        a: &CpuTensor,
        z: &CpuTensor,
        ratio: usize,
        overlap: bool,
        first_is_context: bool,
    ) -> Result<CpuTensor> {
        const OP: &str = "compress_pool";
        want_rank(OP, a, 2)?;
        if a.shape != z.shape
            || ratio == 0
            || !a.shape[0].is_multiple_of(ratio)
            || (overlap && !a.shape[1].is_multiple_of(2))
        {
            return Err(shape_err(
                OP,
                format!(
                    "a {:?}, z {:?}, ratio {ratio}, overlap {overlap}",
                    a.shape, z.shape
                ),
            ));
        }
        let groups = a.shape[0] / ratio;
        let width = a.shape[1];
        let c = if overlap { width / 2 } else { width };
        let (av, zv) = (a.to_f32(OP)?, z.to_f32(OP)?);
        let out = self.run(|| {
            attention::compress_pool(&av, &zv, groups, ratio, width, overlap, first_is_context)
        });
        let n_out = groups.saturating_sub(usize::from(first_is_context));
        Ok(f32t(out, &[n_out, c]))
    }

    fn indexer_scores(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        w: &CpuTensor,
        visible: &[usize],
        scale: f32,
    ) -> Result<CpuTensor> {
        const OP: &str = "indexer_scores";
        want_rank(OP, q, 3)?;
        want_rank(OP, k, 2)?;
        let (s, hi, di) = (q.shape[0], q.shape[1], q.shape[2]);
        let t = k.shape[0];
        if k.shape[1] != di || w.shape != [s, hi] || visible.len() != s {
            return Err(shape_err(
                OP,
                format!(
                    "q {:?}, k {:?}, w {:?}, {} visible",
                    q.shape,
                    k.shape,
                    w.shape,
                    visible.len()
                ),
            ));
        }
        let (qv, kv, wv) = (q.to_f32(OP)?, k.to_f32(OP)?, w.to_f32(OP)?);
        let out =
            self.run(|| attention::indexer_scores(&qv, s, hi, di, &kv, t, &wv, visible, scale));
        Ok(f32t(out, &[s, t]))
    }

    fn topk(&self, x: &CpuTensor, k: usize) -> Result<CpuTensor> {
        let v = x.to_f32("topk")?;
        let t = x.last();
        let out = self.run(|| attention::topk(&v, t, k));
        let mut shape = x.shape.clone();
        if let Some(l) = shape.last_mut() {
            *l = k;
        }
        let rows = x.rows();
        if out.len() != rows * k {
            return Ok(CpuTensor::i32_unchecked(vec![-1; rows * k], &shape));
        }
        Ok(CpuTensor::i32_unchecked(out, &shape))
    }

    fn block_max(&self, x: &CpuTensor, block: usize) -> Result<CpuTensor> {
        if block == 0 {
            return Err(invalid("block_max", "zero block"));
        }
        let v = x.to_f32("block_max")?;
        let t = x.last();
        let mut shape = x.shape.clone();
        if let Some(l) = shape.last_mut() {
            *l = t.div_ceil(block);
        }
        Ok(f32t(attention::block_max(&v, t, block), &shape))
    }

    fn mask_neg_inf(&self, x: &CpuTensor, keep: &CpuTensor) -> Result<CpuTensor> {
        if x.shape != keep.shape {
            return Err(shape_err(
                "mask_neg_inf",
                format!("{:?} vs {:?}", x.shape, keep.shape),
            ));
        }
        let v = x.to_f32("mask_neg_inf")?;
        let m = keep.to_i64("mask_neg_inf")?;
        Ok(f32t(
            v.iter()
                .zip(m.iter())
                .map(|(&a, &k)| if k == 0 { f32::NEG_INFINITY } else { a })
                .collect(),
            &x.shape,
        ))
    }

    fn hc_mixes(
        &self,
        mix: &CpuTensor,
        scale: &CpuTensor,
        base: &CpuTensor,
        n: usize,
        eps: f32,
        sinkhorn_iters: usize,
    ) -> Result<HcMixes<CpuTensor>> {
        const OP: &str = "hc_mixes";
        want_rank(OP, mix, 2)?;
        let width = (2 + n) * n;
        if mix.shape[1] != width || scale.numel() < 3 || base.numel() != width {
            return Err(shape_err(
                OP,
                format!(
                    "mix {:?}, scale {:?}, base {:?}, n {n}",
                    mix.shape, scale.shape, base.shape
                ),
            ));
        }
        let s = mix.shape[0];
        let (mv, sv, bv) = (mix.to_f32(OP)?, scale.to_f32(OP)?, base.to_f32(OP)?);
        let (pre, post, comb) = hc::hc_mixes(&mv, s, n, &sv, &bv, eps, sinkhorn_iters);
        Ok(HcMixes {
            pre: f32t(pre, &[s, n]),
            post: f32t(post, &[s, n]),
            comb: f32t(comb, &[s, n, n]),
        })
    }

    fn hc_pre_only(
        &self,
        mix: &CpuTensor,
        scale: &CpuTensor,
        base: &CpuTensor,
        eps: f32,
    ) -> Result<CpuTensor> {
        const OP: &str = "hc_pre_only";
        want_rank(OP, mix, 2)?;
        let n = mix.shape[1];
        if base.numel() != n || scale.numel() < 1 {
            return Err(shape_err(
                OP,
                format!(
                    "mix {:?}, scale {:?}, base {:?}",
                    mix.shape, scale.shape, base.shape
                ),
            ));
        }
        let (mv, sv, bv) = (mix.to_f32(OP)?, scale.to_f32(OP)?, base.to_f32(OP)?);
        Ok(f32t(hc::hc_pre_only(&mv, n, sv[0], &bv, eps), &mix.shape))
    }

    fn hc_collapse(&self, x: &CpuTensor, pre: &CpuTensor) -> Result<CpuTensor> {
        const OP: &str = "hc_collapse";
        want_rank(OP, x, 3)?;
        let (s, n, d) = (x.shape[0], x.shape[1], x.shape[2]);
        if pre.shape != [s, n] {
            return Err(shape_err(
                OP,
                format!("x {:?}, pre {:?}", x.shape, pre.shape),
            ));
        }
        let (xv, pv) = (x.to_f32(OP)?, pre.to_f32(OP)?);
        Ok(f32t(hc::collapse(&xv, s, n, d, &pv), &[s, d]))
    }

    fn hc_expand(
        &self,
        x: &CpuTensor,
        out: &CpuTensor,
        post: &CpuTensor,
        comb: &CpuTensor,
    ) -> Result<CpuTensor> {
        const OP: &str = "hc_expand";
        want_rank(OP, x, 3)?;
        let (s, n, d) = (x.shape[0], x.shape[1], x.shape[2]);
        if out.shape != [s, d] || post.shape != [s, n] || comb.shape != [s, n, n] {
            return Err(shape_err(
                OP,
                format!(
                    "x {:?}, out {:?}, post {:?}, comb {:?}",
                    x.shape, out.shape, post.shape, comb.shape
                ),
            ));
        }
        let (xv, ov, pv, cv) = (
            x.to_f32(OP)?,
            out.to_f32(OP)?,
            post.to_f32(OP)?,
            comb.to_f32(OP)?,
        );
        Ok(f32t(hc::expand(&xv, s, n, d, &ov, &pv, &cv), &[s, n, d]))
    }

    fn moe_route(
        &self,
        logits: &CpuTensor,
        bias: Option<&CpuTensor>,
        p: RouteParams,
    ) -> Result<(CpuTensor, CpuTensor)> {
        const OP: &str = "moe_route";
        want_rank(OP, logits, 2)?;
        let (s, e) = (logits.shape[0], logits.shape[1]);
        let bv = match bias {
            Some(b) if b.numel() != e => {
                return Err(shape_err(OP, format!("bias {:?} for {e} experts", b.shape)));
            }
            Some(b) => Some(b.to_f32(OP)?),
            None => None,
        };
        let lv = logits.to_f32(OP)?;
        let (idx, wts) = moe::route(&lv, e, bv.as_deref(), p);
        Ok((
            CpuTensor::i32_unchecked(idx, &[s, p.top_k]),
            f32t(wts, &[s, p.top_k]),
        ))
    }

    fn moe_route_hash(
        &self,
        logits: &CpuTensor,
        table: &CpuTensor,
        ids: &CpuTensor,
        p: RouteParams,
    ) -> Result<(CpuTensor, CpuTensor)> {
        const OP: &str = "moe_route_hash";
        want_rank(OP, logits, 2)?;
        want_rank(OP, table, 2)?;
        let (s, e) = (logits.shape[0], logits.shape[1]);
        let k = table.shape[1];
        let tok = ids.to_i64(OP)?;
        if tok.len() != s {
            return Err(shape_err(OP, format!("{} ids for {s} rows", tok.len())));
        }
        check_index(OP, &tok, table.shape[0])?;
        let tv = table.to_i64(OP)?;
        check_index(OP, &tv, e)?;
        let lv = logits.to_f32(OP)?;
        let mut idx = vec![-1i32; s * k];
        let mut wts = vec![0.0f32; s * k];
        for r in 0..s {
            let t = tok[r];
            if t < 0 {
                return Err(invalid(OP, "negative token id"));
            }
            for j in 0..k {
                idx[r * k + j] = tv[t as usize * k + j] as i32;
            }
            let sc = moe::scores(&lv[r * e..(r + 1) * e], p.score);
            moe::pick_weights(
                &sc,
                &idx[r * k..(r + 1) * k],
                p,
                &mut wts[r * k..(r + 1) * k],
            );
        }
        Ok((CpuTensor::i32_unchecked(idx, &[s, k]), f32t(wts, &[s, k])))
    }

    fn moe_experts(
        &self,
        x: &CpuTensor,
        indices: &CpuTensor,
        weights: &CpuTensor,
        experts: &[ExpertWeights<'_, CpuTensor>],
        limit: f32,
    ) -> Result<CpuTensor> {
        super::experts::moe_experts(self, x, indices, weights, experts, limit)
    }

    fn fake_quant(&self, x: &CpuTensor, f: FakeQuant) -> Result<CpuTensor> {
        const OP: &str = "fake_quant";
        let b = f.block();
        if b == 0 || !x.last().is_multiple_of(b) {
            return Err(shape_err(
                OP,
                format!("last axis {} not a multiple of {b}", x.last()),
            ));
        }
        let mut v = x.to_f32(OP)?.into_owned();
        self.run(|| v.par_chunks_mut(b).for_each(|g| f.apply_block(g)));
        Ok(f32t(v, &x.shape))
    }
}

impl CpuBackend {
    /// Quantises an f32 tensor `[rows, cols]` into a weight format (host-side helper).
    pub fn quantize(&self, w: &CpuTensor, format: crate::quant::QuantFormat) -> Result<CpuTensor> {
        want_rank("quantize", w, 2)?;
        let v = w.to_f32("quantize")?;
        let q = QuantMatrix::quantize(&v, w.shape[0], w.shape[1], format)?;
        self.upload_quant(&q)
    }
}

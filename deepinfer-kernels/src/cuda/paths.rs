//! The two paths of the trait operations on [`CudaBackend`]: the device helpers
//! (`*_dev`, each `None` or an error when its kernel does not fit the input) and the host
//! round trip (`host`, `device`) that runs the held [`CpuBackend`] instead.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg, ValidAsZeroBits};
use half::{bf16, f16};

use super::{CudaBackend, dev, grid1};
use crate::DType;
use crate::backend::{Backend, ExpertWeights, TensorInfo};
use crate::cpu::{CpuBackend, CpuConfig, CpuTensor};
use crate::error::{KernelError, Result};

use super::impl_backend::{Buf, CudaTensor, all_f32, check_len};

impl CudaBackend {
    /// The CPU backend that runs the operations without a device kernel.
    pub fn host_backend(&self) -> &CpuBackend {
        &self.cpu
    }

    /// Opens device `ordinal` with explicit options for the host path (and batch-invariant
    /// GEMMs on the device when `cpu.batch_invariant` is set).
    pub fn with_cpu_config(ordinal: usize, cpu: CpuConfig) -> Result<Self> {
        let mut b = Self::new(ordinal)?;
        b.cpu = CpuBackend::with_config(cpu)?;
        Ok(b)
    }

    pub(super) fn batch_invariant(&self) -> bool {
        self.cpu.config().batch_invariant
    }

    /// Uploads `data`, padding an empty slice to one element (see [`CudaTensor`]).
    pub(super) fn put<T: DeviceRepr + Default>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        if data.is_empty() {
            self.upload(&[T::default()])
        } else {
            self.upload(data)
        }
    }

    /// Uploads `data` (checked to fill `shape`) into the buffer variant `wrap`.
    pub(super) fn upload_as<T: DeviceRepr + Default>(
        &self,
        op: &'static str,
        data: &[T],
        shape: &[usize],
        wrap: fn(Arc<CudaSlice<T>>) -> Buf,
    ) -> Result<CudaTensor> {
        check_len(op, data.len(), shape)?;
        Ok(CudaTensor {
            shape: shape.to_vec(),
            buf: wrap(Arc::new(self.put(data)?)),
        })
    }

    pub(super) fn get<T: DeviceRepr>(&self, s: &CudaSlice<T>, numel: usize) -> Result<Vec<T>> {
        let mut v = self.download(s)?;
        v.truncate(numel);
        Ok(v)
    }

    /// Downloads a tensor into a CPU tensor (quantised weights as their dequantised f32).
    pub(super) fn host(&self, t: &CudaTensor) -> Result<CpuTensor> {
        let n = t.numel();
        let c = &self.cpu;
        match &t.buf {
            Buf::F32(s) => c.upload_f32(&self.get(s, n)?, &t.shape),
            Buf::BF16(s) => {
                let v: Vec<bf16> = self.get(s, n)?.into_iter().map(bf16::from_bits).collect();
                c.upload_bf16(&v, &t.shape)
            }
            Buf::F16(s) => {
                let v: Vec<f16> = self.get(s, n)?.into_iter().map(f16::from_bits).collect();
                c.upload_f16(&v, &t.shape)
            }
            Buf::I32(s) => c.upload_i32(&self.get(s, n)?, &t.shape),
            Buf::I64(s) => c.upload_i64(&self.get(s, n)?, &t.shape),
            Buf::Quant(q) => c.upload_f32(&self.get(&self.dequantize(q)?, n)?, &t.shape),
        }
    }

    /// Uploads a CPU tensor (the host path's result).
    pub(super) fn device(&self, t: &CpuTensor) -> Result<CudaTensor> {
        let c = &self.cpu;
        let shape = t.shape();
        match t.dtype() {
            DType::F32 => self.upload_f32(&c.download_f32(t)?, shape),
            // Exact: every bf16 / f16 value is an f32 value.
            DType::BF16 => {
                let v: Vec<bf16> = c.download_f32(t)?.into_iter().map(bf16::from_f32).collect();
                self.upload_bf16(&v, shape)
            }
            DType::F16 => {
                let v: Vec<f16> = c.download_f32(t)?.into_iter().map(f16::from_f32).collect();
                self.upload_f16(&v, shape)
            }
            DType::I32 => self.upload_i32(&c.download_i32(t)?, shape),
            DType::I64 => self.upload_i64(&c.download_i64(t)?, shape),
            d => Err(KernelError::DType {
                op: "cuda host path",
                dtype: d,
            }),
        }
    }

    pub(super) fn binary(
        &self,
        entry: &'static str,
        a: &CudaTensor,
        b: &CudaTensor,
    ) -> Result<Option<CudaTensor>> {
        let (sa, sb) = (&a.shape, &b.shape);
        if sb.len() > sa.len() || sa[sa.len() - sb.len()..] != sb[..] {
            return Ok(None);
        }
        let Some([av, bv]) = all_f32([a, b]) else {
            return Ok(None);
        };
        let (n, nb) = (a.numel() as u64, b.numel() as u64);
        // (a, b, y, n, nb) as `add_bcast` / `mul_bcast` take them.
        let y = elementwise!(self, entry, a.numel(), y, [av, bv, &mut y, &n, &nb]);
        Ok(Some(CudaTensor::f32(sa, y)))
    }

    /// A copy of `buf` this tensor owns alone (copy-on-write before an in-place op).
    pub(super) fn own<T: DeviceRepr>(&self, s: &mut Arc<CudaSlice<T>>) -> Result<()> {
        if Arc::get_mut(s).is_none() {
            *s = Arc::new(self.stream.clone_dtod(&**s).map_err(dev("copy"))?);
        }
        Ok(())
    }

    pub(super) fn write_rows_dev<T: DeviceRepr>(
        &self,
        dst: &mut Arc<CudaSlice<T>>,
        src: &CudaSlice<T>,
        at: usize,
        len: usize,
    ) -> Result<()> {
        self.own(dst)?;
        let d = Arc::get_mut(dst).ok_or_else(|| KernelError::Device("shared buffer".into()))?;
        self.stream
            .memcpy_dtod(&src.slice(..len), &mut d.slice_mut(at..at + len))
            .map_err(dev("write_rows"))
    }

    pub(super) fn copy_blocks_dev<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        cache: &mut Arc<CudaSlice<T>>,
        block: usize,
        pairs: &[(usize, usize)],
    ) -> Result<()> {
        self.own(cache)?;
        let c = Arc::get_mut(cache).ok_or_else(|| KernelError::Device("shared buffer".into()))?;
        // Stage every source first so a block that is both a source and a destination is
        // read before it is overwritten (the trait's contract).
        let mut stage = self
            .stream
            .alloc_zeros::<T>(pairs.len() * block)
            .map_err(dev("alloc"))?;
        for (i, &(s, _)) in pairs.iter().enumerate() {
            self.stream
                .memcpy_dtod(
                    &c.slice(s * block..(s + 1) * block),
                    &mut stage.slice_mut(i * block..(i + 1) * block),
                )
                .map_err(dev("copy_blocks stage"))?;
        }
        for (i, &(_, d)) in pairs.iter().enumerate() {
            self.stream
                .memcpy_dtod(
                    &stage.slice(i * block..(i + 1) * block),
                    &mut c.slice_mut(d * block..(d + 1) * block),
                )
                .map_err(dev("copy_blocks commit"))?;
        }
        Ok(())
    }

    pub(super) fn concat_dev<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        parts: &[(&CudaSlice<T>, usize)],
    ) -> Result<CudaSlice<T>> {
        let total: usize = parts.iter().map(|p| p.1).sum();
        let mut out = self.stream.alloc_zeros::<T>(total).map_err(dev("alloc"))?;
        let mut at = 0;
        for &(s, n) in parts {
            self.stream
                .memcpy_dtod(&s.slice(..n), &mut out.slice_mut(at..at + n))
                .map_err(dev("concat"))?;
            at += n;
        }
        Ok(out)
    }

    /// An index tensor as host i64 values.
    pub(super) fn host_ids(&self, t: &CudaTensor) -> Result<Option<Vec<i64>>> {
        let n = t.numel();
        Ok(match &t.buf {
            Buf::I64(s) => Some(self.get(s, n)?),
            Buf::I32(s) => Some(self.get(s, n)?.into_iter().map(i64::from).collect()),
            _ => None,
        })
    }

    /// `hc.cu`'s `hc_mixes` for `mix[s_len, (2+n)n]` (`n <= 8`, the kernel's limit).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn hc_mixes_dev(
        &self,
        mix: &CudaSlice<f32>,
        scale: &CudaSlice<f32>,
        base: &CudaSlice<f32>,
        s_len: usize,
        n: usize,
        eps: f32,
        iters: usize,
    ) -> Result<[CudaSlice<f32>; 3]> {
        let z = |len| self.stream.alloc_zeros::<f32>(len).map_err(dev("alloc"));
        let (mut pre, mut post, mut comb) = (z(s_len * n)?, z(s_len * n)?, z(s_len * n * n)?);
        let (si, ni, it) = (s_len as i32, n as i32, iters.min(i32::MAX as usize) as i32);
        // SAFETY: (mix, scale, base, pre, post, comb, s_len, n, eps, iters) matches `hc_mixes`;
        // the caller checked mix = s_len*(2+n)*n, scale >= 3, base = (2+n)*n floats and
        // n <= 8; one thread per row.
        launch!(
            self,
            "hc",
            "hc_mixes",
            grid1(s_len),
            [
                mix, scale, base, &mut pre, &mut post, &mut comb, &si, &ni, &eps, &it
            ]
        )?;
        Ok([pre, post, comb])
    }

    /// Routed experts on the device: per used expert, gather its rows, run gate / up / SwiGLU /
    /// down with the device `matmul`, copy each result row into its `(row, slot)` place, then
    /// `moe.cu`'s `moe_combine` sums the slots in order. `None`: something needs the host path.
    pub(super) fn moe_experts_dev(
        &self,
        x: &CudaTensor,
        indices: &CudaTensor,
        weights: &CudaTensor,
        experts: &[ExpertWeights<'_, CudaTensor>],
        limit: f32,
    ) -> Result<Option<CudaTensor>> {
        if x.shape.len() != 2 || indices.shape.len() != 2 || weights.shape != indices.shape {
            return Ok(None);
        }
        let (s, d, k) = (x.shape[0], x.shape[1], indices.shape[1]);
        let (Some([xv, wv]), Some(ids)) = (all_f32([x, weights]), self.host_ids(indices)?) else {
            return Ok(None);
        };
        if indices.shape[0] != s || ids.iter().any(|&e| e < -1 || e >= experts.len() as i64) {
            return Ok(None);
        }
        let mut per_expert: Vec<Vec<usize>> = vec![Vec::new(); experts.len()];
        for (p, &e) in ids.iter().enumerate() {
            if e >= 0 {
                per_expert[e as usize].push(p);
            }
        }
        // One row per (row, slot); slots with no expert stay zero (and are skipped anyway).
        let mut y = self
            .stream
            .alloc_zeros::<f32>(s * k * d)
            .map_err(dev("alloc"))?;
        for (e, pairs) in per_expert.iter().enumerate() {
            if pairs.is_empty() {
                continue;
            }
            let ew = experts[e];
            if ew.gate.shape != ew.up.shape || ew.down.shape.first() != Some(&d) {
                return Ok(None);
            }
            let rows: Vec<i64> = pairs.iter().map(|&p| (p / k) as i64).collect();
            let xe = self.gather_rows_f32(xv, d, &self.upload(&rows)?)?;
            let xe = CudaTensor::f32(&[pairs.len(), d], xe);
            let Some(g) = self.matmul_dev(&xe, ew.gate)? else {
                return Ok(None);
            };
            let Some(u) = self.matmul_dev(&xe, ew.up)? else {
                return Ok(None);
            };
            let (Some(gv), Some(uv)) = (g.as_f32(), u.as_f32()) else {
                return Ok(None);
            };
            let a = CudaTensor::f32(&g.shape, CudaBackend::swiglu(self, gv, uv, limit)?);
            let Some(o) = self.matmul_dev(&a, ew.down)? else {
                return Ok(None);
            };
            let Some(ov) = o.as_f32() else {
                return Ok(None);
            };
            for (i, &p) in pairs.iter().enumerate() {
                self.stream
                    .memcpy_dtod(
                        &ov.slice(i * d..(i + 1) * d),
                        &mut y.slice_mut(p * d..(p + 1) * d),
                    )
                    .map_err(dev("moe_experts scatter"))?;
            }
        }
        let idx: Vec<i32> = ids.iter().map(|&e| e as i32).collect();
        let idx = self.upload(&idx)?;
        let mut out = self
            .stream
            .alloc_zeros::<f32>(s * d)
            .map_err(dev("alloc"))?;
        let (si, ki, di) = (s as i32, k as i32, d as i32);
        // SAFETY: (y, idx, wts, out, s_len, k, d) matches `moe_combine`; y holds s*k*d floats,
        // idx and wts s*k, out s*d; one thread per output.
        launch!(
            self,
            "moe",
            "moe_combine",
            grid1(s * d),
            [&y, &idx, wv, &mut out, &si, &ki, &di]
        )?;
        Ok(Some(CudaTensor::f32(&[s, d], out)))
    }

    /// `hc.cu`'s `hc_collapse`: `y[s] = Σ_n pre[s, n] x[s, n]` → `[s, d]`.
    pub(super) fn collapse_dev(
        &self,
        xv: &CudaSlice<f32>,
        pv: &CudaSlice<f32>,
        s: usize,
        n: usize,
        d: usize,
    ) -> Result<CudaTensor> {
        let (si, ni, di) = (s as i32, n as i32, d as i32);
        let mut y = self
            .stream
            .alloc_zeros::<f32>(s * d)
            .map_err(dev("alloc"))?;
        // SAFETY: (x, pre, y, s_len, n, d) matches `hc_collapse`; the callers checked that x
        // holds s*n*d floats and pre s*n; y holds s*d; one thread per output.
        launch!(
            self,
            "hc",
            "hc_collapse",
            grid1(s * d),
            [xv, pv, &mut y, &si, &ni, &di]
        )?;
        Ok(CudaTensor::f32(&[s, d], y))
    }

    pub(super) fn matmul_dev(&self, x: &CudaTensor, w: &CudaTensor) -> Result<Option<CudaTensor>> {
        if w.shape.len() != 2 || x.shape.last() != Some(&w.shape[1]) || w.numel() == 0 {
            return Ok(None);
        }
        let Some([xv]) = all_f32([x]) else {
            return Ok(None);
        };
        let (n, k) = (w.shape[0], w.shape[1]);
        let m = x.numel() / k;
        let small = self.batch_invariant() || m == 1;
        let y = match &w.buf {
            Buf::F32(ws) if small => self.gemv_f32(xv, ws, m, n, k)?,
            Buf::F32(ws) => self.gemm_f32(xv, ws, m, n, k)?,
            Buf::BF16(ws) if small => self.gemv_bf16(xv, ws, m, n, k)?,
            Buf::BF16(ws) => self.gemm_bf16(xv, ws, m, n, k)?,
            Buf::Quant(q) => self.gemv_quant(xv, q, m)?,
            _ => return Ok(None),
        };
        let mut shape = x.shape.clone();
        if let Some(l) = shape.last_mut() {
            *l = n;
        }
        Ok(Some(CudaTensor::f32(&shape, y)))
    }
}

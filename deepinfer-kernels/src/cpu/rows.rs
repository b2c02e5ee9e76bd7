//! Row and block movement on CPU tensors: gathering table rows, writing rows in place,
//! copying cache blocks (copy-on-write).

use half::{bf16, f16};

use super::buf::Buf;
use super::tensor::{CpuTensor, Data};
use crate::backend::TensorInfo;
use crate::error::{KernelError, Result, invalid, shape_err};

pub(super) fn gather_rows(table: &CpuTensor, idx: &CpuTensor) -> Result<CpuTensor> {
    const OP: &str = "gather_rows";
    if table.shape.is_empty() {
        return Err(shape_err(OP, "table must have rank >= 1"));
    }
    let ids = idx.to_i64(OP)?;
    let v = table.shape[0];
    if let Some(&bad) = ids.iter().find(|&&i| i < 0 || i >= v as i64) {
        return Err(invalid(OP, format!("index {bad} out of range 0..{v}")));
    }
    let row: usize = table.shape[1..].iter().product();
    let mut shape = idx.shape.clone();
    shape.extend_from_slice(&table.shape[1..]);
    macro_rules! gather {
        ($src:expr) => {{
            let mut out = Vec::with_capacity(ids.len() * row);
            for &i in ids.iter() {
                out.extend_from_slice(&$src[i as usize * row..(i as usize + 1) * row]);
            }
            out
        }};
    }
    let data = match &table.data {
        Data::I32(t) => Data::I32(Buf::owned(gather!(t))),
        Data::I64(t) => Data::I64(Buf::owned(gather!(t))),
        Data::F32(t) => Data::F32(Buf::owned(gather!(t))),
        Data::BF16(t) => Data::F32(Buf::owned(gather!(t).iter().map(|x| x.to_f32()).collect())),
        Data::F16(t) => Data::F32(Buf::owned(gather!(t).iter().map(|x| x.to_f32()).collect())),
        Data::Quant(q) => {
            let mut out = vec![0.0f32; ids.len() * row];
            for (o, &i) in out.chunks_mut(row.max(1)).zip(ids.iter()) {
                q.dequantize_row(i as usize, o);
            }
            Data::F32(Buf::owned(out))
        }
    };
    Ok(CpuTensor { shape, data })
}

pub(super) fn write_rows(dst: &mut CpuTensor, row: usize, src: &CpuTensor) -> Result<()> {
    const OP: &str = "write_rows";
    if dst.shape.is_empty() || src.shape.is_empty() || dst.shape[1..] != src.shape[1..] {
        return Err(shape_err(
            OP,
            format!("{:?} into {:?}", src.shape, dst.shape),
        ));
    }
    if row + src.shape[0] > dst.shape[0] {
        return Err(shape_err(
            OP,
            format!("rows {row}+{} past {}", src.shape[0], dst.shape[0]),
        ));
    }
    let inner: usize = dst.shape[1..].iter().product();
    let at = row * inner;
    match &mut dst.data {
        Data::F32(d) => {
            let s = src.to_f32(OP)?;
            d.make_mut()[at..at + s.len()].copy_from_slice(&s);
        }
        Data::BF16(d) => {
            let s = src.to_f32(OP)?;
            for (o, v) in d.make_mut()[at..at + s.len()].iter_mut().zip(s.iter()) {
                *o = bf16::from_f32(*v);
            }
        }
        Data::F16(d) => {
            let s = src.to_f32(OP)?;
            for (o, v) in d.make_mut()[at..at + s.len()].iter_mut().zip(s.iter()) {
                *o = f16::from_f32(*v);
            }
        }
        Data::I32(d) => {
            let s = src.to_i64(OP)?;
            for (o, v) in d.make_mut()[at..at + s.len()].iter_mut().zip(s.iter()) {
                *o = i32::try_from(*v).map_err(|_| invalid(OP, "value overflows i32"))?;
            }
        }
        Data::I64(d) => {
            let s = src.to_i64(OP)?;
            d.make_mut()[at..at + s.len()].copy_from_slice(&s);
        }
        Data::Quant(_) => {
            return Err(KernelError::DType {
                op: OP,
                dtype: dst.dtype(),
            });
        }
    }
    Ok(())
}

pub(super) fn copy_blocks(cache: &mut CpuTensor, pairs: &[(usize, usize)]) -> Result<()> {
    const OP: &str = "copy_blocks";
    let nblocks = *cache
        .shape
        .first()
        .ok_or_else(|| shape_err(OP, "cache must have rank >= 1"))?;
    if let Some(&(s, d)) = pairs.iter().find(|&&(s, d)| s >= nblocks || d >= nblocks) {
        return Err(invalid(
            OP,
            format!("pair ({s}, {d}) out of range 0..{nblocks}"),
        ));
    }
    let inner: usize = cache.shape[1..].iter().product();
    fn apply<T: Copy>(v: &mut [T], inner: usize, pairs: &[(usize, usize)]) {
        // Sources are read before any write, so chains like (a→b, b→c) copy old b.
        let saved: Vec<Vec<T>> = pairs
            .iter()
            .map(|&(s, _)| v[s * inner..(s + 1) * inner].to_vec())
            .collect();
        for (blk, &(_, d)) in saved.iter().zip(pairs) {
            v[d * inner..(d + 1) * inner].copy_from_slice(blk);
        }
    }
    match &mut cache.data {
        Data::F32(v) => apply(v.make_mut().as_mut_slice(), inner, pairs),
        Data::BF16(v) => apply(v.make_mut().as_mut_slice(), inner, pairs),
        Data::F16(v) => apply(v.make_mut().as_mut_slice(), inner, pairs),
        Data::I32(v) => apply(v.make_mut().as_mut_slice(), inner, pairs),
        Data::I64(v) => apply(v.make_mut().as_mut_slice(), inner, pairs),
        Data::Quant(_) => {
            return Err(KernelError::DType {
                op: OP,
                dtype: cache.dtype(),
            });
        }
    }
    Ok(())
}

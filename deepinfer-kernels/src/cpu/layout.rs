//! Shape plumbing on typed buffers: narrow, concat, transpose, gather.

/// `[outer, dim, inner]` view of a shape around axis `dim`.
pub(crate) fn split_at_axis(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    (outer, shape[dim], inner)
}

pub(crate) fn narrow<T: Copy>(
    v: &[T],
    shape: &[usize],
    dim: usize,
    start: usize,
    len: usize,
) -> Vec<T> {
    let (outer, n, inner) = split_at_axis(shape, dim);
    let mut out = Vec::with_capacity(outer * len * inner);
    for o in 0..outer {
        let base = o * n * inner;
        out.extend_from_slice(&v[base + start * inner..base + (start + len) * inner]);
    }
    out
}

pub(crate) fn concat<T: Copy>(parts: &[(&[T], usize)], outer: usize, inner: usize) -> Vec<T> {
    let total: usize = parts.iter().map(|p| p.1).sum();
    let mut out = Vec::with_capacity(outer * total * inner);
    for o in 0..outer {
        for (v, n) in parts {
            out.extend_from_slice(&v[o * n * inner..(o + 1) * n * inner]);
        }
    }
    out
}

/// Swaps axes `a < b` of a row-major buffer.
pub(crate) fn transpose<T: Copy + Default>(v: &[T], shape: &[usize], a: usize, b: usize) -> Vec<T> {
    let rank = shape.len();
    let mut strides = vec![1usize; rank];
    for i in (0..rank.saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    let mut new_shape = shape.to_vec();
    new_shape.swap(a, b);
    let mut src_strides = strides.clone();
    src_strides.swap(a, b);
    let n: usize = shape.iter().product();
    let mut out = vec![T::default(); n];
    let mut idx = vec![0usize; rank];
    for o in out.iter_mut() {
        let off: usize = idx.iter().zip(&src_strides).map(|(i, s)| i * s).sum();
        *o = v[off];
        for ax in (0..rank).rev() {
            idx[ax] += 1;
            if idx[ax] < new_shape[ax] {
                break;
            }
            idx[ax] = 0;
        }
    }
    out
}

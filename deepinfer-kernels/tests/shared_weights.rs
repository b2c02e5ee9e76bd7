//! `Backend::upload_shared`: weights read in place from shared bytes (a memory-mapped
//! checkpoint) multiply exactly like uploaded copies; a misaligned range falls back to a copy;
//! a range outside the bytes is an error.

use deepinfer_kernels::{Backend, CpuBackend, DType, SharedBytes, TensorInfo};
use half::bf16;
use std::sync::Arc;

fn values(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
        .collect()
}

/// `pad` bytes, then the little-endian values (f32 or, with `half`, bf16).
fn bytes(v: &[f32], pad: usize, half: bool) -> SharedBytes {
    let mut b = vec![0u8; pad];
    for &x in v {
        if half {
            b.extend_from_slice(&bf16::from_f32(x).to_le_bytes());
        } else {
            b.extend_from_slice(&x.to_le_bytes());
        }
    }
    Arc::new(b)
}

#[test]
fn shared_weights_multiply_like_copies_in_both_formats() {
    let be = CpuBackend::new();
    let (n, k) = (24, 40);
    let w = values(n * k);
    let x = be.upload_f32(&values(3 * k), &[3, k]).unwrap();
    // f32 at an aligned offset.
    let shared = be
        .upload_shared(bytes(&w, 64, false), 64, DType::F32, &[n, k])
        .unwrap();
    assert!(shared.is_view());
    let copy = be.upload_f32(&w, &[n, k]).unwrap();
    assert_eq!(
        be.download_f32(&be.matmul(&x, &shared).unwrap()).unwrap(),
        be.download_f32(&be.matmul(&x, &copy).unwrap()).unwrap()
    );
    // bf16.
    let wb: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
    let shared = be
        .upload_shared(bytes(&w, 8, true), 8, DType::BF16, &[n, k])
        .unwrap();
    assert!(shared.is_view());
    assert_eq!(shared.dtype(), DType::BF16);
    let copy = be.upload_bf16(&wb, &[n, k]).unwrap();
    assert_eq!(
        be.download_f32(&be.matmul(&x, &shared).unwrap()).unwrap(),
        be.download_f32(&be.matmul(&x, &copy).unwrap()).unwrap()
    );
    // Rows gathered from a shared table (an embedding) equal those of a copy.
    let idx = be.upload_i64(&[3, 0, 23, 3], &[4]).unwrap();
    assert_eq!(
        be.download_f32(&be.gather_rows(&shared, &idx).unwrap())
            .unwrap(),
        be.download_f32(&be.gather_rows(&copy, &idx).unwrap())
            .unwrap()
    );
}

#[test]
fn a_misaligned_range_is_copied_and_a_range_outside_is_an_error() {
    let be = CpuBackend::new();
    let w = values(12);
    let t = be
        .upload_shared(bytes(&w, 1, false), 1, DType::F32, &[3, 4])
        .unwrap();
    assert!(!t.is_view(), "byte 1 is misaligned for f32");
    assert_eq!(be.download_f32(&t).unwrap(), w);
    assert!(
        be.upload_shared(bytes(&w, 0, false), 8, DType::F32, &[3, 4])
            .is_err()
    );
    assert!(
        be.upload_shared(bytes(&w, 0, false), 0, DType::I32, &[3, 4])
            .is_err()
    );
}

#[test]
fn writing_into_a_shared_tensor_copies_it_and_leaves_the_bytes_alone() {
    let be = CpuBackend::new();
    let w = values(8);
    let src = bytes(&w, 0, false);
    let mut t = be
        .upload_shared(src.clone(), 0, DType::F32, &[2, 4])
        .unwrap();
    let row = be.upload_f32(&[9.0; 4], &[1, 4]).unwrap();
    be.write_rows(&mut t, 1, &row).unwrap();
    assert!(!t.is_view());
    assert_eq!(&be.download_f32(&t).unwrap()[4..], &[9.0; 4]);
    let again = be.upload_shared(src, 0, DType::F32, &[2, 4]).unwrap();
    assert_eq!(be.download_f32(&again).unwrap(), w);
}

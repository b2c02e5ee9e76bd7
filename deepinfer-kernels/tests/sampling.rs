//! The sampling kernel picks exactly what `deepinfer-sample` picks (dev-dependency cross-check).

mod common;

use common::Rng;
use deepinfer_kernels::sampling::{self, DrawKind, SampleRow};
use deepinfer_kernels::{Backend, CpuBackend};
use deepinfer_sample::{SampleRequest, SamplingParams};
use proptest::prelude::*;

#[test]
fn philox_known_answers_match_sample_crate() {
    for (ctr, key) in [
        ([0u32; 4], [0u32; 2]),
        ([u32::MAX; 4], [u32::MAX; 2]),
        (
            [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
            [0xa409_3822, 0x299f_31d0],
        ),
    ] {
        assert_eq!(
            sampling::philox4x32_10(ctr, key),
            deepinfer_sample::philox4x32_10(ctr, key)
        );
    }
    assert_eq!(
        sampling::philox4x32_10([0; 4], [0; 2]),
        [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
    );
    let mut a = sampling::Philox::for_draw(77, 5, DrawKind::Coin);
    let mut b = deepinfer_sample::PhiloxStream::for_draw(77, 5, deepinfer_sample::DrawKind::Coin);
    for _ in 0..9 {
        assert_eq!(a.next_u64(), b.next_u64());
    }
}

#[test]
fn exp_and_weights_match_sample_crate() {
    for i in 0..2000 {
        let x = -(i as f32) * 0.05;
        assert_eq!(
            sampling::det_exp(x).to_bits(),
            deepinfer_sample::fixed_point::det_exp(x).to_bits()
        );
    }
    let w = [3u64, 0, 5, 1];
    for pos in 0..50 {
        assert_eq!(
            sampling::draw_index(&w, 9, pos, DrawKind::Sample),
            deepinfer_sample::sampler::draw_index(&w, 9, pos, deepinfer_sample::DrawKind::Sample)
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn same_token_as_sample_crate(seed in any::<u64>(), position in 0u64..1_000_000, temp in prop_oneof![Just(0.0f32), 0.05f32..2.0], vocab in 1usize..300, data_seed in any::<u64>()) {
        let mut rng = Rng::new(data_seed);
        let logits = rng.vec(vocab, 6.0);
        let params = SamplingParams { temperature: temp, seed, ..SamplingParams::default() };
        let req = SampleRequest { logits: &logits, mask: None, history: &[], position, params: &params };
        let want = deepinfer_sample::sample(&req).unwrap().token as i32;
        let b = CpuBackend::new();
        let row = SampleRow { seed, position, temperature: temp };
        let got = b.download_i32(&b.sample(&b.upload_f32(&logits, &[1, vocab]).unwrap(), &[row]).unwrap()).unwrap();
        prop_assert_eq!(got, vec![want]);
    }
}

#[test]
fn batch_rows_are_independent_and_bad_input_errors() {
    let b = CpuBackend::new();
    let mut rng = Rng::new(5);
    let logits = rng.vec(4 * 50, 3.0);
    let rows: Vec<SampleRow> = (0..4)
        .map(|i| SampleRow {
            seed: 100 + i,
            position: i * 7,
            temperature: 0.8,
        })
        .collect();
    let all = b
        .download_i32(
            &b.sample(&b.upload_f32(&logits, &[4, 50]).unwrap(), &rows)
                .unwrap(),
        )
        .unwrap();
    for (i, r) in rows.iter().enumerate() {
        let one = b
            .download_i32(
                &b.sample(
                    &b.upload_f32(&logits[i * 50..(i + 1) * 50], &[1, 50])
                        .unwrap(),
                    &[*r],
                )
                .unwrap(),
            )
            .unwrap();
        assert_eq!(one[0], all[i]);
    }
    // Greedy picks the argmax.
    let g = b
        .sample(
            &b.upload_f32(&[0.0, 5.0, 1.0], &[1, 3]).unwrap(),
            &[SampleRow {
                seed: 1,
                position: 0,
                temperature: 0.0,
            }],
        )
        .unwrap();
    assert_eq!(b.download_i32(&g).unwrap(), vec![1]);
    assert!(
        b.sample(
            &b.upload_f32(&[f32::NAN, 1.0], &[1, 2]).unwrap(),
            &[rows[0]]
        )
        .is_err()
    );
    assert!(
        b.sample(&b.upload_f32(&[1.0, 1.0], &[1, 2]).unwrap(), &rows)
            .is_err()
    );
}

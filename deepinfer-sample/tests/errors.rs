//! Bad input is a typed error, never a panic.

use deepinfer_sample::{
    SampleError, SampleRequest, SamplingParams, VerifyMode, VerifyRequest, sample, verify,
};

fn run(logits: &[f32], mask: Option<&[u32]>, params: &SamplingParams) -> Result<u32, SampleError> {
    sample(&SampleRequest {
        logits,
        mask,
        history: &[],
        position: 0,
        params,
    })
    .map(|o| o.token)
}

#[test]
fn non_finite_logits() {
    let p = SamplingParams::default();
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut l = vec![0.0f32; 100];
        l[67] = bad;
        assert!(matches!(
            run(&l, None, &p),
            Err(SampleError::NonFiniteLogit { token: 67, .. })
        ));
        // Same in the slow (masked) path, and ignored when the token is masked.
        let mut mask = vec![u32::MAX; 4];
        mask[0] = 0xFFFF_FFFE;
        assert!(matches!(
            run(&l, Some(&mask), &p),
            Err(SampleError::NonFiniteLogit { token: 67, .. })
        ));
        mask[2] &= !(1 << 3);
        assert!(run(&l, Some(&mask), &p).is_ok());
    }
}

#[test]
fn bad_parameters() {
    let l = [0.0f32, 1.0];
    let with = |f: &dyn Fn(&mut SamplingParams)| {
        let mut p = SamplingParams::default();
        f(&mut p);
        run(&l, None, &p)
    };
    assert_eq!(
        with(&|p| p.temperature = -0.1),
        Err(SampleError::InvalidTemperature(-0.1))
    );
    assert!(matches!(
        with(&|p| p.temperature = f32::NAN),
        Err(SampleError::InvalidTemperature(_))
    ));
    assert!(with(&|p| p.temperature = 0.0).is_ok());
    for tp in [0.0f32, -0.5, 1.5, f32::NAN] {
        assert!(matches!(
            with(&|p| p.top_p = tp),
            Err(SampleError::TopPOutOfRange(_))
        ));
    }
    assert!(matches!(
        with(&|p| p.min_p = 1.5),
        Err(SampleError::MinPOutOfRange(_))
    ));
    assert!(matches!(
        with(&|p| p.repetition_penalty = 0.0),
        Err(SampleError::InvalidPenalty { .. })
    ));
    assert!(matches!(
        with(&|p| p.presence_penalty = f32::NAN),
        Err(SampleError::InvalidPenalty { .. })
    ));
    assert!(matches!(
        with(&|p| p.logit_bias = vec![(0, f32::NEG_INFINITY)]),
        Err(SampleError::InvalidBias { .. })
    ));
    assert!(matches!(
        with(&|p| p.logit_bias = vec![(2, 1.0)]),
        Err(SampleError::TokenOutOfRange { token: 2, vocab: 2 })
    ));
}

#[test]
fn bad_masks_and_vocab() {
    let p = SamplingParams::default();
    let l = vec![0.0f32; 40];
    assert_eq!(run(&l, Some(&[0, 0]), &p), Err(SampleError::MaskForbidsAll));
    // Bits past the vocabulary do not count as allowed tokens.
    assert_eq!(
        run(&l, Some(&[0, 0xFFFF_FF00]), &p),
        Err(SampleError::MaskForbidsAll)
    );
    assert_eq!(
        run(&l, Some(&[u32::MAX]), &p),
        Err(SampleError::MaskSizeMismatch {
            expected: 2,
            got: 1,
            vocab: 40
        })
    );
    assert_eq!(run(&[], None, &p), Err(SampleError::BadVocab(0)));
}

#[test]
fn draft_length_mismatches() {
    const V: usize = 8;
    let t = vec![0.0f32; 3 * V];
    let q = vec![1.0f32 / V as f32; 2 * V];
    let p = SamplingParams::default();
    let req = VerifyRequest {
        target_logits: &t,
        vocab: V,
        draft_tokens: &[1, 2],
        draft_probs: Some(&q),
        masks: None,
        history: &[],
        position: 0,
        params: &p,
        mode: VerifyMode::Stochastic,
    };
    assert!(verify(&req).is_ok());
    let short = VerifyRequest {
        target_logits: &t[..2 * V],
        ..req
    };
    assert!(matches!(
        verify(&short),
        Err(SampleError::DraftLengthMismatch {
            what: "target logits",
            ..
        })
    ));
    let three = VerifyRequest {
        draft_tokens: &[1, 2, 3],
        ..req
    };
    assert!(matches!(
        verify(&three),
        Err(SampleError::DraftLengthMismatch { .. })
    ));
    let no_q = VerifyRequest {
        draft_probs: None,
        ..req
    };
    assert!(matches!(
        verify(&no_q),
        Err(SampleError::DraftLengthMismatch {
            what: "draft probabilities",
            ..
        })
    ));
    let short_q = VerifyRequest {
        draft_probs: Some(&q[..V]),
        ..req
    };
    assert!(matches!(
        verify(&short_q),
        Err(SampleError::DraftLengthMismatch { .. })
    ));
    let masks = vec![u32::MAX; 2];
    let bad_masks = VerifyRequest {
        masks: Some(&masks),
        ..req
    };
    assert!(matches!(
        verify(&bad_masks),
        Err(SampleError::DraftLengthMismatch { what: "masks", .. })
    ));
    let oob = VerifyRequest {
        draft_tokens: &[1, 9],
        ..req
    };
    assert!(matches!(
        verify(&oob),
        Err(SampleError::TokenOutOfRange { token: 9, .. })
    ));
    let mut bad_q = q.clone();
    bad_q[1] = f32::NAN;
    let nan_q = VerifyRequest {
        draft_probs: Some(&bad_q),
        ..req
    };
    assert!(matches!(
        verify(&nan_q),
        Err(SampleError::InvalidDraftProbability { .. })
    ));
}

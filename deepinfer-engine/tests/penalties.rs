//! The sampler's penalties read exactly the request's generated tokens. Through the engine
//! (alone, in a batch, with drafts, and as the samples of `n = 2`), decoding with
//! repetition, presence and frequency penalties equals a reference loop that feeds the model
//! one token at a time and samples each position with the tokens generated so far as its
//! history.

use deepinfer_engine::runtime::{Engine, EngineConfig, GenParams, Request, load_default};
use deepinfer_engine::{BatchItem, Logits, Model};
use deepinfer_kernels::CpuBackend;
use deepinfer_sample::{SampleRequest, sample_batch};

const NEW: usize = 20;

fn params(seed: u64, temperature: f32) -> GenParams {
    let mut p = GenParams::greedy(NEW);
    p.stop_at_eos = false;
    p.sampling.temperature = temperature;
    p.sampling.seed = seed;
    p.sampling.repetition_penalty = 1.3;
    p.sampling.presence_penalty = 0.8;
    p.sampling.frequency_penalty = 0.4;
    p
}

/// The tokens the sampler picks, position by position, with the generated ones as history.
fn reference(model: &Model<CpuBackend>, prompt: &[u32], p: &GenParams) -> Vec<u32> {
    let mut st = model.new_state();
    let mut generated: Vec<u32> = Vec::new();
    let mut input = prompt.to_vec();
    while generated.len() < p.max_tokens {
        let mut it = [BatchItem {
            state: &mut st,
            tokens: &input,
        }];
        let logits = model
            .forward(&mut it, Logits::Last, None)
            .unwrap()
            .remove(0);
        let row = SampleRequest {
            logits: &logits,
            mask: None,
            history: &generated,
            position: st.pos as u64,
            params: &p.sampling,
        };
        let t = sample_batch(&[row]).remove(0).unwrap().token;
        generated.push(t);
        input = vec![t];
    }
    generated
}

fn engine(spec_drafts: usize) -> Engine<CpuBackend> {
    let model = load_default(CpuBackend::batch_invariant()).unwrap();
    Engine::new(
        model,
        EngineConfig {
            spec_drafts,
            ..EngineConfig::default()
        },
    )
    .unwrap()
}

fn prompt(i: u32) -> Vec<u32> {
    // A repetitive prompt, so the repetition penalty has prompt tokens to avoid too.
    (0..24).map(|k| 1000 + 17 * ((k * (i + 3)) % 7)).collect()
}

#[test]
fn penalised_decoding_equals_the_reference_loop() {
    let model = load_default(CpuBackend::batch_invariant()).unwrap();
    let cases = [(0u32, 0.0f32), (1, 0.0), (2, 0.9)];
    let want: Vec<Vec<u32>> = cases
        .iter()
        .map(|&(i, t)| reference(&model, &prompt(i), &params(u64::from(i), t)))
        .collect();
    // Penalties change what greedy picks (else this test would not see them).
    let mut plain = params(0, 0.0);
    plain.sampling.repetition_penalty = 1.0;
    plain.sampling.presence_penalty = 0.0;
    plain.sampling.frequency_penalty = 0.0;
    assert_ne!(reference(&model, &prompt(0), &plain), want[0]);
    for drafts in [0, 3] {
        let mut e = engine(drafts);
        let reqs: Vec<Request> = cases
            .iter()
            .map(|&(i, t)| Request::new(u64::from(i), prompt(i), params(u64::from(i), t)))
            .collect();
        let got: Vec<Vec<u32>> = e
            .generate(reqs)
            .unwrap()
            .into_iter()
            .map(|o| o.token_ids)
            .collect();
        assert_eq!(got, want, "{drafts} drafts");
    }
}

#[test]
fn each_sample_of_n_penalises_its_own_tokens() {
    let model = load_default(CpuBackend::batch_invariant()).unwrap();
    let mut p = params(5, 0.9);
    p.n = 2;
    let outs = engine(0)
        .generate(vec![Request::new(9, prompt(4), p.clone())])
        .unwrap();
    assert_eq!(outs.len(), 2);
    // Sample 0 draws from the request's seed; each sample's history is its own tokens only.
    let mut one = p.clone();
    one.n = 1;
    let want = reference(&model, &prompt(4), &one);
    assert_eq!(outs[0].token_ids, want);
    assert_eq!(outs[1].token_ids.len(), NEW);
}

//! The expert-parallel forward over in-process ranks: each rank runs its own sequences and
//! the ranks exchange token rows at every MoE layer; with batch-invariant kernels every
//! rank's logits equal the single-rank forward of its sequences bit for bit, a rank without
//! sequences still serves its experts, and bad set-ups are errors.

mod common;
use common::*;
use deepinfer_engine::model::{ExpertParallel, contiguous_owners};
use deepinfer_engine::{BatchItem, Logits, Model};
use deepinfer_kernels::{CpuBackend, LocalGroup};
use std::time::Duration;

fn prompt(seed: u64, len: usize, vocab: u32) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % u64::from(vocab - 3)) as u32 + 3
        })
        .collect()
}

/// Per rank, per step: the logits of its sequences (prefill, then two decode steps).
type Logs = Vec<Vec<Vec<f32>>>;

/// The prompts of each rank (`prompts[r]`, possibly none), run prefill + 2 decode steps.
fn single(m: &Model<CpuBackend>, prompts: &[Vec<u32>]) -> Logs {
    if prompts.is_empty() {
        return vec![Vec::new(); 3];
    }
    let mut states: Vec<_> = prompts.iter().map(|_| m.new_state()).collect();
    let mut steps = Vec::new();
    let mut inputs: Vec<Vec<u32>> = prompts.to_vec();
    for _ in 0..3 {
        let mut items: Vec<BatchItem<'_, _>> = states
            .iter_mut()
            .zip(&inputs)
            .map(|(state, t)| BatchItem { state, tokens: t })
            .collect();
        let out = m.forward(&mut items, Logits::Last, None).unwrap();
        inputs = out.iter().map(|l| vec![argmax(l) as u32]).collect();
        steps.push(out);
    }
    steps
}

fn ep_run(m: &Model<CpuBackend>, per_rank: &[Vec<Vec<u32>>]) -> Vec<Logs> {
    let world = per_rank.len();
    let owners = contiguous_owners(m.cfg.n_routed_experts, world);
    let comms = LocalGroup::ranks(world, Duration::from_secs(60));
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .zip(per_rank)
            .map(|(mut comm, prompts)| {
                let owners = &owners;
                s.spawn(move || {
                    let mut ep = ExpertParallel {
                        comm: &mut comm,
                        owners,
                    };
                    let mut states: Vec<_> = prompts.iter().map(|_| m.new_state()).collect();
                    let mut inputs: Vec<Vec<u32>> = prompts.clone();
                    let mut steps = Vec::new();
                    for _ in 0..3 {
                        let mut items: Vec<BatchItem<'_, _>> = states
                            .iter_mut()
                            .zip(&inputs)
                            .map(|(state, t)| BatchItem { state, tokens: t })
                            .collect();
                        let out = m.forward_ep(&mut items, Logits::Last, &mut ep).unwrap();
                        inputs = out.iter().map(|l| vec![argmax(l) as u32]).collect();
                        steps.push(out);
                    }
                    steps
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn every_rank_gets_its_single_rank_logits_bit_for_bit() {
    for dir in ["v41-tiny-dev", "v4-tiny-dev"] {
        let m = Model::load(&data(dir), CpuBackend::batch_invariant()).unwrap();
        let v = m.cfg.vocab_size as u32;
        for world in [2usize, 3] {
            // Rank 1 of the three-rank group has no sequences of its own.
            let per_rank: Vec<Vec<Vec<u32>>> = (0..world)
                .map(|r| {
                    if world == 3 && r == 1 {
                        Vec::new()
                    } else {
                        (0..r + 1)
                            .map(|i| prompt((r * 10 + i) as u64, 5 + 7 * i + r, v))
                            .collect()
                    }
                })
                .collect();
            let got = ep_run(&m, &per_rank);
            for (r, prompts) in per_rank.iter().enumerate() {
                assert_eq!(
                    got[r],
                    single(&m, prompts),
                    "{dir}, world {world}, rank {r}"
                );
            }
        }
    }
}

#[test]
fn bad_set_ups_are_errors() {
    let m = Model::load(&data("v41-tiny-dev"), CpuBackend::batch_invariant()).unwrap();
    let mut comms = LocalGroup::ranks(1, Duration::from_secs(5));
    let toks = [3u32, 4, 5];
    let mut st = m.new_state();
    let mut run = |owners: &[usize]| {
        let mut ep = ExpertParallel {
            comm: &mut comms[0],
            owners,
        };
        let mut items = [BatchItem {
            state: &mut st,
            tokens: &toks,
        }];
        m.forward_ep(&mut items, Logits::Last, &mut ep)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    assert!(run(&[0; 3]).contains("experts"), "too few owners");
    let e = run(&vec![1; m.cfg.n_routed_experts]);
    assert!(e.contains("outside a group of 1"), "{e}");
}

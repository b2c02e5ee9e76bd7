//! The expert-parallel forward over in-process ranks: each rank runs its own sequences and
//! the ranks exchange token rows at every MoE layer; with batch-invariant kernels every
//! rank's logits equal the single-rank forward of its sequences bit for bit, a rank without
//! sequences still serves its experts, and bad set-ups are errors.

mod common;
use common::*;
use deepinfer_engine::model::{ExpertParallel, ExpertPlacement};
use deepinfer_engine::{BatchItem, Logits, Model};
use deepinfer_kernels::{CpuBackend, LocalGroup};
use std::time::Duration;

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

fn ep_run(
    m: &Model<CpuBackend>,
    per_rank: &[Vec<Vec<u32>>],
    placement: &ExpertPlacement,
) -> Vec<Logs> {
    let world = per_rank.len();
    let comms = LocalGroup::ranks(world, Duration::from_secs(60));
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .zip(per_rank)
            .map(|(mut comm, prompts)| {
                s.spawn(move || {
                    let mut ep = ExpertParallel {
                        comm: &mut comm,
                        placement,
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
        for world in [2usize, 3] {
            // Rank 1 of the three-rank group has no sequences of its own.
            let per_rank: Vec<Vec<Vec<u32>>> = (0..world)
                .map(|r| {
                    if world == 3 && r == 1 {
                        Vec::new()
                    } else {
                        (0..r + 1)
                            .map(|i| prompt((r * 10 + i) as u64, 5 + 7 * i + r))
                            .collect()
                    }
                })
                .collect();
            let (layers, experts) = (m.cfg.num_layers, m.cfg.n_routed_experts);
            let contiguous = ExpertPlacement::contiguous(layers, experts, world);
            // Replicas: expert e of layer l on rank (e + l) mod N and, for even e, also on
            // the next rank.
            let replicated = ExpertPlacement::from_replicas(
                world,
                (0..layers)
                    .map(|l| {
                        (0..experts)
                            .map(|e| {
                                let r = (e + l) % world;
                                if e % 2 == 0 {
                                    vec![r, (r + 1) % world]
                                } else {
                                    vec![r]
                                }
                            })
                            .collect()
                    })
                    .collect(),
            )
            .unwrap();
            for placement in [&contiguous, &replicated] {
                let got = ep_run(&m, &per_rank, placement);
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
}

#[test]
fn bad_set_ups_are_errors() {
    let m = Model::load(&data("v41-tiny-dev"), CpuBackend::batch_invariant()).unwrap();
    let mut comms = LocalGroup::ranks(1, Duration::from_secs(5));
    let toks = [3u32, 4, 5];
    let mut st = m.new_state();
    let mut run = |placement: &ExpertPlacement| {
        let mut ep = ExpertParallel {
            comm: &mut comms[0],
            placement,
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
    let (layers, experts) = (m.cfg.num_layers, m.cfg.n_routed_experts);
    let e = run(&ExpertPlacement::contiguous(layers, 3, 1));
    assert!(e.contains("experts"), "{e}");
    let e = run(&ExpertPlacement::contiguous(layers, experts, 2));
    assert!(e.contains("group of 1"), "{e}");
    assert!(ExpertPlacement::from_replicas(2, vec![vec![vec![0], vec![]]]).is_err());
    assert!(ExpertPlacement::from_replicas(2, vec![vec![vec![2]]]).is_err());
    assert!(ExpertPlacement::from_replicas(2, vec![vec![vec![0]], vec![]]).is_err());
}

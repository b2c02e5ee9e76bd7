//! The cost of expert parallelism over in-process CPU ranks on the embedded default model:
//! 16 sequences (64-token prompts, then 16 decode steps) on one rank, and split over 2 and 4
//! ranks that exchange rows at every MoE layer (`Model::forward_ep`). All ranks share the
//! machine's cores (one rayon pool), so the ratio is the exchange's overhead, not a speed-up.
//! Each configuration runs back to back in this process; the best of three is reported.
//!
//! `cargo bench -p deepinfer-engine --bench expert_parallel`

mod common;
use deepinfer_engine::model::{ExpertParallel, ExpertPlacement};
use deepinfer_engine::runtime::load_default;
use deepinfer_engine::{BatchItem, Logits, Model};
use deepinfer_kernels::{CpuBackend, LocalGroup};
use std::time::{Duration, Instant};

const SEQS: usize = 16;
const PROMPT: usize = 64;
const DECODE: usize = 16;

fn prompts() -> Vec<Vec<u32>> {
    (0..SEQS as u64)
        .map(|s| common::tokens(s, PROMPT))
        .collect()
}

/// Prefill then `DECODE` greedy steps of `prompts` on one rank (`ep: None`) or as a rank.
fn steps(m: &Model<CpuBackend>, prompts: &[Vec<u32>], mut ep: Option<&mut ExpertParallel<'_>>) {
    let mut states: Vec<_> = prompts.iter().map(|_| m.new_state()).collect();
    let mut inputs = prompts.to_vec();
    for _ in 0..=DECODE {
        let mut items: Vec<BatchItem<'_, _>> = states
            .iter_mut()
            .zip(&inputs)
            .map(|(state, tokens)| BatchItem { state, tokens })
            .collect();
        let out = match ep.as_deref_mut() {
            Some(ep) => m.forward_ep(&mut items, Logits::Last, ep),
            None => m.forward(&mut items, Logits::Last, None),
        }
        .expect("forward");
        inputs = out
            .iter()
            .map(|l| {
                let best = l
                    .iter()
                    .enumerate()
                    .fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b });
                vec![best.0 as u32]
            })
            .collect();
    }
}

fn run(m: &Model<CpuBackend>, world: usize) -> f64 {
    let all = prompts();
    let t = Instant::now();
    if world == 1 {
        steps(m, &all, None);
    } else {
        let placement =
            ExpertPlacement::contiguous(m.cfg.num_layers, m.cfg.n_routed_experts, world);
        let comms = LocalGroup::ranks(world, Duration::from_secs(600));
        std::thread::scope(|s| {
            for (r, mut comm) in comms.into_iter().enumerate() {
                let mine: Vec<Vec<u32>> = all.iter().skip(r).step_by(world).cloned().collect();
                let placement = &placement;
                s.spawn(move || {
                    let mut ep = ExpertParallel {
                        comm: &mut comm,
                        placement,
                    };
                    steps(m, &mine, Some(&mut ep));
                });
            }
        });
    }
    t.elapsed().as_secs_f64()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let m = load_default(CpuBackend::new()).expect("the embedded default model");
    let tokens = (SEQS * (PROMPT + DECODE)) as f64;
    println!("{SEQS} sequences, {PROMPT}-token prompts + {DECODE} decode steps, embedded default:");
    println!("| ranks | best of 3, s | tok/s | vs 1 rank |");
    println!("|---|---|---|---|");
    let mut base = 0.0;
    for world in [1usize, 2, 4] {
        let best = (0..3).map(|_| run(&m, world)).fold(f64::MAX, f64::min);
        if world == 1 {
            base = best;
        }
        println!(
            "| {world} | {best:.3} | {:.0} | {:.2} |",
            tokens / best,
            base / best
        );
    }
}

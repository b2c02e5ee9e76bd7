//! Prefill (1,024-token prompt) and batch-1 decode throughput of the tiny V4 and V4.1
//! fixtures and of a peer-sized V4 (hidden 256, 6 layers, 8 experts top-2, vocab 129,280;
//! random bf16 weights written to a temporary directory from `benches/v4-peer-sized.json`)
//! on the CPU backend, 2 threads. Each forward runs inside one 2-thread rayon pool with the backend on
//! the calling pool, as `deepinfer forward-bench` does. Short runs: the machine is shared.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use deepinfer_engine::model::{RandomDtype, write_random_checkpoint};
use deepinfer_engine::{BatchItem, Logits, Model};
use deepinfer_kernels::{CpuBackend, CpuConfig};
use std::path::PathBuf;
use std::time::Duration;

fn model(dir: &std::path::Path) -> Model<CpuBackend> {
    let be = CpuBackend::with_config(CpuConfig {
        batch_invariant: false,
        threads: None, // the pool the bench runs in
    })
    .expect("backend");
    Model::load(dir, be).expect("model")
}

fn prompt(n: usize, vocab: usize) -> Vec<u32> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("forward");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("pool");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let peer = tempfile::tempdir().expect("tempdir");
    write_random_checkpoint(
        &root.join("benches/v4-peer-sized.json"),
        peer.path(),
        0,
        RandomDtype::Bf16,
    )
    .expect("random checkpoint");
    let dirs = [
        ("v4-tiny-dev", root.join("tests/data/v4-tiny-dev")),
        ("v41-tiny-dev", root.join("tests/data/v41-tiny-dev")),
        ("v4-peer-sized-bf16", peer.path().to_path_buf()),
    ];
    for (name, dir) in &dirs {
        let m = model(dir);
        let ids = prompt(1024, m.cfg.vocab_size);
        g.throughput(Throughput::Elements(ids.len() as u64));
        g.bench_function(BenchmarkId::new("prefill_1024", name), |b| {
            b.iter(|| {
                pool.install(|| {
                    let mut st = m.new_state();
                    let mut it = [BatchItem {
                        state: &mut st,
                        tokens: &ids,
                    }];
                    m.forward(&mut it, Logits::Last, None).expect("forward")
                })
            })
        });
        let mut ctx = m.new_state();
        let mut it = [BatchItem {
            state: &mut ctx,
            tokens: &ids,
        }];
        pool.install(|| m.forward(&mut it, Logits::Last, None).expect("prefill"));
        g.throughput(Throughput::Elements(16));
        g.bench_function(BenchmarkId::new("decode_b1_16_steps", name), |b| {
            b.iter(|| pool.install(|| decode16(&m, &ctx)))
        });
    }
    g.finish();
}

fn decode16(
    m: &Model<CpuBackend>,
    ctx: &deepinfer_engine::SeqState<deepinfer_kernels::CpuTensor>,
) -> u32 {
    let mut st = ctx.clone();
    let mut tok = 7u32;
    for _ in 0..16 {
        let mut it = [BatchItem {
            state: &mut st,
            tokens: std::slice::from_ref(&tok),
        }];
        let l = m.forward(&mut it, Logits::Last, None).expect("decode");
        tok = l[0]
            .iter()
            .enumerate()
            .fold(0, |b, (i, &v)| if v > l[0][b] { i } else { b }) as u32;
    }
    tok
}

criterion_group!(benches, bench);
criterion_main!(benches);

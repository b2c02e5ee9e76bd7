//! Prefill (1,024-token prompt) and batch-1 decode throughput of the tiny V4 and V4.1
//! fixtures on the CPU backend, 2 threads. Short runs: the machine is shared.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use deepinfer_engine::{BatchItem, Logits, Model};
use deepinfer_kernels::{CpuBackend, CpuConfig};
use std::path::PathBuf;
use std::time::Duration;

fn model(name: &str) -> Model<CpuBackend> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    let be = CpuBackend::with_config(CpuConfig {
        batch_invariant: false,
        threads: Some(2),
    })
    .expect("backend");
    Model::load(&dir, be).expect("model")
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
    for name in ["v4-tiny-dev", "v41-tiny-dev"] {
        let m = model(name);
        let ids = prompt(1024, m.cfg.vocab_size);
        g.throughput(Throughput::Elements(ids.len() as u64));
        g.bench_function(BenchmarkId::new("prefill_1024", name), |b| {
            b.iter(|| {
                let mut st = m.new_state();
                let mut it = [BatchItem {
                    state: &mut st,
                    tokens: &ids,
                }];
                m.forward(&mut it, Logits::Last, None).expect("forward")
            })
        });
        let mut ctx = m.new_state();
        let mut it = [BatchItem {
            state: &mut ctx,
            tokens: &ids,
        }];
        m.forward(&mut it, Logits::Last, None).expect("prefill");
        g.throughput(Throughput::Elements(16));
        g.bench_function(BenchmarkId::new("decode_b1_16_steps", name), |b| {
            b.iter(|| {
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
                        .fold(0, |b, (i, &v)| if v > l[0][b] { i } else { b })
                        as u32;
                }
                tok
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

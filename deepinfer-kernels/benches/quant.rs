//! Quantise / dequantise throughput per core, in bytes of f32 values per second of the
//! calling thread's CPU time.
//!
//!   cargo bench -p deepinfer-kernels --bench quant
//!
//! The kernels run on one thread, so CPU time is the per-core figure; measuring it instead of
//! wall time keeps the result meaningful on a machine shared with other jobs (time spent
//! descheduled is not counted; cache pollution by the neighbours still is). On non-Unix
//! targets it falls back to wall time.

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use deepinfer_kernels::quant::reference::quantize_reference;
use deepinfer_kernels::{QuantFormat, QuantMatrix, ScaleFormat};

mod common;
use common::data;

/// Nanoseconds of CPU time consumed by the calling thread.
#[cfg(unix)]
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID needs no other state.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(not(unix))]
fn thread_cpu_ns() -> u64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static T0: OnceLock<Instant> = OnceLock::new();
    T0.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Criterion measurement: the thread's CPU time, in nanoseconds.
struct ThreadCpuTime;

struct NsFormatter;

impl ValueFormatter for NsFormatter {
    fn scale_values(&self, typical: f64, values: &mut [f64]) -> &'static str {
        let (f, unit) = if typical < 1e3 {
            (1.0, "ns cpu")
        } else if typical < 1e6 {
            (1e-3, "µs cpu")
        } else if typical < 1e9 {
            (1e-6, "ms cpu")
        } else {
            (1e-9, "s cpu")
        };
        values.iter_mut().for_each(|v| *v *= f);
        unit
    }

    fn scale_throughputs(&self, _typical: f64, t: &Throughput, values: &mut [f64]) -> &'static str {
        let (amount, unit) = match *t {
            Throughput::Bytes(b) | Throughput::BytesDecimal(b) => (b as f64, "GB/s per core"),
            Throughput::Elements(e) | Throughput::ElementsAndBytes { elements: e, .. } => {
                (e as f64, "G/s per core")
            }
            Throughput::Bits(b) => (b as f64, "Gbit/s per core"),
        };
        // amount per ns is amount·1e9 per s, i.e. amount per ns in G per second.
        values.iter_mut().for_each(|v| *v = amount / *v);
        unit
    }

    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

impl Measurement for ThreadCpuTime {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, i: u64) -> u64 {
        thread_cpu_ns().saturating_sub(i)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &NsFormatter
    }
}

fn quant(c: &mut Criterion<ThreadCpuTime>) {
    let (rows, cols) = (512usize, 4096usize);
    let x = data(rows * cols, 7);
    let mut g = c.benchmark_group("quant_8MiB_f32");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500));
    g.throughput(Throughput::Bytes((rows * cols * 4) as u64));
    let formats = [
        ("fp8_128x128_f32", QuantFormat::FP8_128_F32),
        (
            "fp8_1x32_ue8m0",
            QuantFormat::Fp8 {
                block_rows: 1,
                block_cols: 32,
                scale: ScaleFormat::Ue8m0,
            },
        ),
        ("mxfp4", QuantFormat::Mxfp4),
        ("nvfp4", QuantFormat::Nvfp4),
    ];
    // A single-threaded copy of the same bytes: what one core moves when it does no work.
    let mut copy = vec![0.0f32; rows * cols];
    g.bench_function("copy_baseline", |bch| {
        bch.iter(|| {
            copy.copy_from_slice(black_box(&x));
            black_box(copy[0])
        })
    });
    for (name, f) in formats {
        g.bench_function(format!("quantize_{name}"), |bch| {
            bch.iter(|| black_box(QuantMatrix::quantize(&x, rows, cols, f).unwrap()))
        });
        // The per-element reference the fast path is tested against, bit for bit.
        g.bench_function(format!("quantize_reference_{name}"), |bch| {
            bch.iter(|| black_box(quantize_reference(&x, rows, cols, f).unwrap()))
        });
        let q = QuantMatrix::quantize(&x, rows, cols, f).unwrap();
        // Into a reused buffer: the kernel's throughput, not the page faults of a fresh
        // 8 MiB allocation.
        let mut out = vec![0.0f32; rows * cols];
        g.bench_function(format!("dequantize_{name}"), |bch| {
            bch.iter(|| {
                q.dequantize_into(&mut out).unwrap();
                black_box(out[0])
            })
        });
    }
    g.finish();
}

fn config() -> Criterion<ThreadCpuTime> {
    Criterion::default().with_measurement(ThreadCpuTime)
}

criterion_group! {
    name = benches;
    config = config();
    targets = quant
}
criterion_main!(benches);

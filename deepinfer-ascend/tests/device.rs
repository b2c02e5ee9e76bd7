//! Device tests: each kernel on a real NPU against the emulator. They need CANN and an Ascend
//! 950 or 910B, so they are ignored by default. On a CANN host:
//!
//! ```text
//! source /usr/local/Ascend/ascend-toolkit/set_env.sh
//! cargo test -p deepinfer-ascend --test device -- --ignored --test-threads=1
//! ```
//!
//! Agreement expected: sampling and routing ids exactly; bf16 outputs within one bf16 ulp of
//! the emulator (the device's reduction trees and transcendental functions may differ from
//! the emulator's); f32 GEMV within 1e-5 of Σ|x·w|.

mod common;

use common::Rng;
use deepinfer_ascend::emu::{AttentionInputs, GemvInputs};
use deepinfer_ascend::mx::{self, MxFormat};
use deepinfer_ascend::runtime::RuntimeOptions;
use deepinfer_ascend::tiling::*;
use deepinfer_ascend::{KernelRunner, Mode};

fn pair() -> (KernelRunner, KernelRunner) {
    let dev = KernelRunner::device(&RuntimeOptions::default()).expect("an Ascend device with CANN");
    let emu = KernelRunner::emulated(dev.chip());
    assert!(matches!(dev.mode(), Mode::Device(_)));
    (dev, emu)
}

fn close_bf16(a: &[half::bf16], b: &[half::bf16]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let (x, y) = (x.to_f32(), y.to_f32());
        assert!(
            (x - y).abs() <= y.abs() * 2f32.powi(-7) + 1e-6,
            "[{i}] device {x} vs emulator {y}"
        );
    }
}

#[test]
#[ignore = "needs an Ascend NPU and CANN"]
fn device_rmsnorm_quant() {
    let (dev, emu) = pair();
    let mut rng = Rng::new(1);
    let shape = RmsNormShape {
        rows: 7,
        dim: 5120,
        eps: 1e-6,
        quant: true,
    };
    let x = rng.bf16s(7 * 5120, -3.0, 3.0);
    let w = rng.vec(5120, 0.5, 1.5);
    let d = dev.rmsnorm_quant(&shape, &x, &w).unwrap();
    let e = emu.rmsnorm_quant(&shape, &x, &w).unwrap();
    close_bf16(&d.y, &e.y);
    assert_eq!(d.scales.len(), e.scales.len());
}

#[test]
#[ignore = "needs an Ascend NPU and CANN"]
fn device_rope() {
    let (dev, emu) = pair();
    let mut rng = Rng::new(2);
    let shape = RopeShape {
        rows: 3,
        heads: 64,
        head_dim: 512,
        rope_dim: 64,
        table_len: 16,
        inverse: false,
    };
    let x = rng.bf16s(3 * 64 * 512, -2.0, 2.0);
    let c = rng.vec(16 * 32, -1.0, 1.0);
    let s = rng.vec(16 * 32, -1.0, 1.0);
    let pos = [0, 5, 15];
    close_bf16(
        &dev.rope(&shape, &x, &pos, &c, &s).unwrap(),
        &emu.rope(&shape, &x, &pos, &c, &s).unwrap(),
    );
}

#[test]
#[ignore = "needs an Ascend NPU and CANN"]
fn device_gemv_all_formats() {
    let (dev, emu) = pair();
    let mut rng = Rng::new(3);
    let (m, n, k) = (4, 1000, 5120);
    let x = rng.bf16s(m * k, -1.0, 1.0);
    let w = rng.bf16s(n * k, -1.0, 1.0);
    let shape = GemvShape {
        m,
        n,
        k,
        format: GemvFormat::Bf16,
    };
    let d = dev.gemv(&shape, GemvInputs::Bf16 { x: &x, w: &w }).unwrap();
    let e = emu.gemv(&shape, GemvInputs::Bf16 { x: &x, w: &w }).unwrap();
    for (a, b) in d.iter().zip(&e) {
        assert!((a - b).abs() <= 1e-5 * k as f32);
    }
    for f in [MxFormat::Fp8E4M3, MxFormat::Fp4E2M1] {
        let xf = rng.vec(m * k, -1.0, 1.0);
        let wf = rng.vec(n * k, -1.0, 1.0);
        let (xq, xs) = mx::quantize(MxFormat::Fp8E4M3, &xf);
        let (wq, ws) = mx::quantize(f, &wf);
        let inp = GemvInputs::Mx {
            format: f,
            x: &xq,
            x_scales: &xs,
            w: &wq,
            w_scales: &ws,
        };
        let shape = GemvShape {
            m,
            n,
            k,
            format: GemvFormat::Mx(f),
        };
        let d = dev.gemv(&shape, inp).unwrap();
        let e = emu.gemv(&shape, inp).unwrap();
        for (a, b) in d.iter().zip(&e) {
            assert!((a - b).abs() <= 1e-5 * k as f32, "{f:?}");
        }
    }
}

#[test]
#[ignore = "needs an Ascend NPU and CANN"]
fn device_router_hc_attention_sampling() {
    let (dev, emu) = pair();
    let mut rng = Rng::new(4);
    let rs = RouterShape {
        rows: 9,
        experts: 384,
        top_k: 6,
        score: ScoreFunc::SqrtSoftplus,
        temperature: 1.0,
        renorm: true,
        route_scale: 1.5,
    };
    let l = rng.vec(9 * 384, -4.0, 4.0);
    let b = rng.vec(384, -0.1, 0.1);
    assert_eq!(
        dev.router(&rs, &l, &b).unwrap().ids,
        emu.router(&rs, &l, &b).unwrap().ids
    );

    let hs = HcMixShape {
        rows: 3,
        streams: 4,
        dim: 5120,
    };
    let x = rng.bf16s(3 * 4 * 5120, -2.0, 2.0);
    let o = rng.bf16s(3 * 5120, -2.0, 2.0);
    let p = rng.vec(12, 0.0, 2.0);
    let c = rng.vec(48, 0.0, 1.0);
    close_bf16(
        &dev.hc_mix(&hs, &x, &o, &p, &c).unwrap(),
        &emu.hc_mix(&hs, &x, &o, &p, &c).unwrap(),
    );

    let a = AttentionShape {
        heads: 64,
        head_dim: 512,
        n_window: 128,
        n_comp: 64,
        comp_rows: 256,
        scale: 0.044,
    };
    let q = rng.bf16s(64 * 512, -1.0, 1.0);
    let win = rng.bf16s(128 * 512, -1.0, 1.0);
    let comp = rng.bf16s(256 * 512, -1.0, 1.0);
    let idx: Vec<u32> = (0..64).map(|i| i * 3).collect();
    let sinks = rng.vec(64, -1.0, 1.0);
    let inp = AttentionInputs {
        q: &q,
        window: &win,
        comp: &comp,
        comp_idx: &idx,
        sinks: &sinks,
    };
    close_bf16(
        &dev.attention(&a, inp).unwrap(),
        &emu.attention(&a, inp).unwrap(),
    );

    let ss = SamplingShape {
        rows: 4,
        vocab: 129_280,
    };
    let raw = rng.vec(4 * 129_280, 0.0, 1.0);
    let mut probs = Vec::new();
    for r in raw.chunks(129_280) {
        let sum: f32 = r.iter().sum();
        probs.extend(r.iter().map(|v| v / sum));
    }
    let us: Vec<u32> = (0..4).map(|_| rng.next_u64() as u32).collect();
    assert_eq!(
        dev.sampling(&ss, &probs, &us).unwrap(),
        emu.sampling(&ss, &probs, &us).unwrap()
    );
}

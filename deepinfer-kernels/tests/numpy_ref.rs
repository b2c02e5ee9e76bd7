//! The CPU backend against outputs of the NumPy model references (tests/data/numpy_ref.json,
//! made by tests/data/gen_fixtures.py): same inputs, the references compute in f64.

mod common;

use common::assert_close;
use deepinfer_kernels::{
    Backend, CpuBackend, CpuTensor, ExpertWeights, FakeQuant, RopeParams, RouteParams, RouteScore,
    YarnParams,
};
use serde_json::Value;

fn fixture() -> Value {
    serde_json::from_str(include_str!("data/numpy_ref.json")).expect("fixture parses")
}

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().unwrap_or(f64::NEG_INFINITY))
        .collect()
}

fn f32s(v: &Value) -> Vec<f32> {
    f64s(v).iter().map(|&x| x as f32).collect()
}

fn us(v: &Value) -> usize {
    v.as_u64().expect("integer") as usize
}

fn up(b: &CpuBackend, v: &Value, shape: &[usize]) -> CpuTensor {
    b.upload_f32(&f32s(v), shape).expect("upload")
}

#[test]
fn rope_and_yarn_match_reference() {
    let f = &fixture()["rope"];
    let b = CpuBackend::new();
    let p = RopeParams {
        theta: f["theta"].as_f64().unwrap(),
        dims: us(&f["dims"]),
        yarn: Some(YarnParams {
            factor: f["factor"].as_f64().unwrap(),
            original_max_position_embeddings: f["orig"].as_f64().unwrap(),
            beta_fast: f["beta_fast"].as_f64().unwrap(),
            beta_slow: f["beta_slow"].as_f64().unwrap(),
        }),
    };
    let inv = p.inv_freq();
    for (a, w) in inv.iter().zip(f64s(&f["inv_freq"])) {
        assert!((a - w).abs() <= 1e-15 * w.abs(), "yarn inv_freq {a} vs {w}");
    }
    let plain = RopeParams { yarn: None, ..p }.inv_freq();
    for (a, w) in plain.iter().zip(f64s(&f["inv_freq_plain"])) {
        assert!((a - w).abs() <= 1e-15 * w.abs());
    }
    let (s, h, d) = (us(&f["S"]), us(&f["H"]), us(&f["d"]));
    let x = up(&b, &f["x"], &[s, h, d]);
    let pos: Vec<i64> = f["pos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    let y = b
        .download_f32(&b.rope(&x, &pos, &inv, false).unwrap())
        .unwrap();
    assert_close("rope", &y, &f64s(&f["y"]), 1e-6, 1e-6);
    let yi = b
        .download_f32(&b.rope(&x, &pos, &inv, true).unwrap())
        .unwrap();
    assert_close("rope inverse", &yi, &f64s(&f["y_inv"]), 1e-6, 1e-6);
}

#[test]
fn hyper_connections_match_reference() {
    let f = &fixture()["hc"];
    let b = CpuBackend::new();
    let (s, n, d) = (us(&f["S"]), us(&f["N"]), us(&f["D"]));
    let x = up(&b, &f["X"], &[s, n, d]);
    let fnw = up(&b, &f["fn"], &[(2 + n) * n, n * d]);
    let mix = b
        .matmul(
            &b.rms_norm(&b.reshape(&x, &[s, n * d]).unwrap(), None, 1e-6)
                .unwrap(),
            &fnw,
        )
        .unwrap();
    assert_close(
        "mix",
        &b.download_f32(&mix).unwrap(),
        &f64s(&f["mix"]),
        1e-5,
        1e-5,
    );
    let scale = up(&b, &f["scale"], &[3]);
    let base = up(&b, &f["base"], &[(2 + n) * n]);
    let hm = b
        .hc_mixes(&mix, &scale, &base, n, 1e-6, us(&f["iters"]))
        .unwrap();
    assert_close(
        "pre",
        &b.download_f32(&hm.pre).unwrap(),
        &f64s(&f["pre"]),
        1e-5,
        1e-5,
    );
    assert_close(
        "post",
        &b.download_f32(&hm.post).unwrap(),
        &f64s(&f["post"]),
        1e-5,
        1e-5,
    );
    assert_close(
        "comb",
        &b.download_f32(&hm.comb).unwrap(),
        &f64s(&f["comb"]),
        1e-5,
        1e-5,
    );
    // collapse / merge from the reference's own coefficients, to test those ops alone.
    let pre = up(&b, &f["pre"], &[s, n]);
    let post = up(&b, &f["post"], &[s, n]);
    let comb = up(&b, &f["comb"], &[s, n, n]);
    let out = up(&b, &f["out"], &[s, d]);
    let c = b.hc_collapse(&x, &pre).unwrap();
    assert_close(
        "collapse",
        &b.download_f32(&c).unwrap(),
        &f64s(&f["collapsed"]),
        1e-5,
        1e-5,
    );
    let m = b.hc_expand(&x, &out, &post, &comb).unwrap();
    assert_close(
        "merge",
        &b.download_f32(&m).unwrap(),
        &f64s(&f["merged"]),
        1e-5,
        1e-5,
    );
}

#[test]
fn compressor_matches_reference() {
    let f = &fixture()["compress"];
    let b = CpuBackend::new();
    let (s, dm, c, ratio) = (us(&f["S"]), us(&f["D"]), us(&f["c"]), us(&f["ratio"]));
    let inv = RopeParams {
        theta: f["rope_theta"].as_f64().unwrap(),
        dims: us(&f["rope_dims"]),
        yarn: None,
    }
    .inv_freq();
    let x = up(&b, &f["x"], &[s, dm]);
    for (pfx, overlap, key) in [("ov", true, "ent_overlap"), ("pl", false, "ent_plain")] {
        let cd = if overlap { 2 * c } else { c };
        let a = b
            .matmul(&x, &up(&b, &f[format!("{pfx}.kv_proj.weight")], &[cd, dm]))
            .unwrap();
        let z = b
            .matmul(
                &x,
                &up(&b, &f[format!("{pfx}.gate_proj.weight")], &[cd, dm]),
            )
            .unwrap();
        let zb = b.reshape(&z, &[s / ratio, ratio, cd]).unwrap();
        let zb = b
            .add(
                &zb,
                &up(&b, &f[format!("{pfx}.position_bias")], &[ratio, cd]),
            )
            .unwrap();
        let zb = b.reshape(&zb, &[s, cd]).unwrap();
        let e = b.compress_pool(&a, &zb, ratio, overlap, false).unwrap();
        let e = b
            .rms_norm(
                &e,
                Some(&up(&b, &f[format!("{pfx}.kv_norm.weight")], &[c])),
                1e-6,
            )
            .unwrap();
        let pos: Vec<i64> = (0..(s / ratio) as i64).map(|w| w * ratio as i64).collect();
        let e = b.rope(&e, &pos, &inv, false).unwrap();
        assert_close(
            key,
            &b.download_f32(&e).unwrap(),
            &f64s(&f[key]),
            1e-5,
            1e-5,
        );
    }
}

#[test]
fn indexer_and_topk_match_reference() {
    let f = &fixture()["indexer"];
    let b = CpuBackend::new();
    let (s, hi, di, t, k) = (
        us(&f["S"]),
        us(&f["Hi"]),
        us(&f["di"]),
        us(&f["T"]),
        us(&f["k"]),
    );
    let vis: Vec<usize> = f["visible"].as_array().unwrap().iter().map(us).collect();
    let sc = b
        .indexer_scores(
            &up(&b, &f["q"], &[s, hi, di]),
            &up(&b, &f["K"], &[t, di]),
            &up(&b, &f["w"], &[s, hi]),
            &vis,
            f["scale"].as_f64().unwrap() as f32,
        )
        .unwrap();
    assert_close(
        "scores",
        &b.download_f32(&sc).unwrap(),
        &f64s(&f["score"]),
        1e-5,
        1e-5,
    );
    let top = b.download_i32(&b.topk(&sc, k).unwrap()).unwrap();
    let want: Vec<i32> = f["topk"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_i64().unwrap() as i32)
        })
        .collect();
    assert_eq!(top, want);
}

#[test]
fn sink_attention_matches_reference() {
    let f = &fixture()["attention"];
    let b = CpuBackend::new();
    let (s, h, d, j) = (us(&f["S"]), us(&f["H"]), us(&f["d"]), us(&f["J"]));
    let allow: Vec<i64> = f["allow"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    let mut idx = vec![-1i32; s * j];
    for r in 0..s {
        let mut slot = 0;
        for c in 0..j {
            if allow[r * j + c] != 0 {
                idx[r * j + slot] = c as i32;
                slot += 1;
            }
        }
    }
    let o = b
        .sparse_attention(
            &up(&b, &f["q"], &[s, h, d]),
            &up(&b, &f["kv"], &[j, d]),
            &b.upload_i32(&idx, &[s, j]).unwrap(),
            &up(&b, &f["sink"], &[h]),
            1.0 / (d as f32).sqrt(),
        )
        .unwrap();
    assert_close(
        "attention",
        &b.download_f32(&o).unwrap(),
        &f64s(&f["o"]),
        1e-5,
        1e-5,
    );
}

#[test]
fn moe_matches_reference() {
    let f = &fixture()["moe"];
    let b = CpuBackend::new();
    let (s, dm, e, i, k) = (
        us(&f["S"]),
        us(&f["D"]),
        us(&f["E"]),
        us(&f["I"]),
        us(&f["k"]),
    );
    let limit = f["limit"].as_f64().unwrap() as f32;
    let x = up(&b, &f["x"], &[s, dm]);
    let ids: Vec<i64> = f["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    let ids = b.upload_i64(&ids, &[s]).unwrap();
    let p = RouteParams {
        score: RouteScore::SqrtSoftplus,
        top_k: k,
        renormalize: true,
        scale: f["scale"].as_f64().unwrap() as f32,
    };
    for li in 0..2 {
        let w = |key: &str, shape: &[usize]| up(&b, &f[format!("l{li}.{key}")], shape);
        let logits = b.matmul(&x, &w("gate.weight", &[e, dm])).unwrap();
        let (idx, wts) = if li == 0 {
            b.moe_route(&logits, Some(&w("gate.e_score_correction_bias", &[e])), p)
                .unwrap()
        } else {
            let tab: Vec<i64> = f["l1.tid2eid"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_i64().unwrap())
                .collect();
            let tab = b.upload_i64(&tab, &[tab.len() / k, k]).unwrap();
            b.moe_route_hash(&logits, &tab, &ids, p).unwrap()
        };
        let gu = w("experts.gate_up_proj", &[e, 2 * i, dm]);
        let dn = w("experts.down_proj", &[e, dm, i]);
        let mut mats = Vec::new();
        for ex in 0..e {
            let g = b
                .reshape(&b.narrow(&gu, 0, ex, 1).unwrap(), &[2 * i, dm])
                .unwrap();
            mats.push((
                b.narrow(&g, 0, 0, i).unwrap(),
                b.narrow(&g, 0, i, i).unwrap(),
                b.reshape(&b.narrow(&dn, 0, ex, 1).unwrap(), &[dm, i])
                    .unwrap(),
            ));
        }
        let experts: Vec<ExpertWeights<'_, CpuTensor>> = mats
            .iter()
            .map(|(g, u, d)| ExpertWeights {
                gate: g,
                up: u,
                down: d,
            })
            .collect();
        let routed = b.moe_experts(&x, &idx, &wts, &experts, limit).unwrap();
        let sg = b
            .matmul(&x, &w("shared_experts.gate_proj.weight", &[i, dm]))
            .unwrap();
        let su = b
            .matmul(&x, &w("shared_experts.up_proj.weight", &[i, dm]))
            .unwrap();
        let sh = b
            .matmul(
                &b.swiglu(&sg, &su, limit).unwrap(),
                &w("shared_experts.down_proj.weight", &[dm, i]),
            )
            .unwrap();
        let out = b.add(&routed, &sh).unwrap();
        assert_close(
            &format!("moe layer {li}"),
            &b.download_f32(&out).unwrap(),
            &f64s(&f[format!("out{li}")]),
            1e-5,
            1e-5,
        );
    }
}

#[test]
fn qat_round_trips_match_reference() {
    let f = &fixture()["qat"];
    let b = CpuBackend::new();
    let (r, c) = (us(&f["rows"]), us(&f["cols"]));
    let x = up(&b, &f["x"], &[r, c]);
    for (fq, key) in [
        (FakeQuant::Fp8 { block: 32 }, "fp8_32"),
        (FakeQuant::Mxfp4 { block: 32 }, "mxfp4_32"),
        (FakeQuant::Nvfp4 { block: 16 }, "nvfp4_16"),
    ] {
        let y = b.download_f32(&b.fake_quant(&x, fq).unwrap()).unwrap();
        assert_close(key, &y, &f64s(&f[key]), 0.0, 1e-7);
    }
    let g = &fixture()["round"];
    let xs = f32s(&g["x"]);
    let e4: Vec<f32> = xs
        .iter()
        .map(|&v| deepinfer_kernels::quant::fp8::round_e4m3(v))
        .collect();
    assert_close("round_e4m3", &e4, &f64s(&g["e4m3"]), 0.0, 0.0);
    let e2: Vec<f32> = xs
        .iter()
        .map(|&v| deepinfer_kernels::quant::fp4::round_e2m1(v.clamp(-6.0, 6.0)))
        .collect();
    assert_close("round_e2m1", &e2, &f64s(&g["e2m1"]), 0.0, 0.0);
}

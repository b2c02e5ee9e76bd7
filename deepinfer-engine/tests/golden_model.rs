//! Golden checks of both model graphs against the oracle fixtures (tests/data): one-shot
//! prefill, chunked prefill, prefill + token-by-token decode with greedy continuations, and
//! a layer-by-layer trace that names the first diverging stage.

mod common;
use common::*;
use deepinfer_engine::{BatchItem, Logits, Trace};

const TOL: f64 = 1e-4;

fn prompts(g: &std::collections::HashMap<String, G>) -> Vec<(String, Vec<u32>)> {
    (0..)
        .map(|i| format!("p{i}"))
        .take_while(|p| g.contains_key(&format!("{p}.input_ids")))
        .map(|p| {
            let ids = g[&format!("{p}.input_ids")].ids();
            (p, ids)
        })
        .collect()
}

fn check_prefill(dir: &str) {
    let m = load(dir);
    let g = golden(dir);
    let ps = prompts(&g);
    assert_eq!(ps.len(), 4);
    for (p, ids) in &ps {
        let got = chunked(&m, ids, ids.len());
        let d = max_diff(&got, &g[&format!("{p}.logits")].v);
        eprintln!("{dir} {p} len={} one-shot max|diff| = {d:.3e}", ids.len());
        assert!(d < TOL, "{dir} {p}: one-shot prefill differs by {d:.3e}");
    }
}

fn check_chunked(dir: &str) {
    let m = load(dir);
    let g = golden(dir);
    for (p, ids) in prompts(&g) {
        for chunk in [1usize, 5, 16, 128] {
            let got = chunked(&m, &ids, chunk);
            let d = max_diff(&got, &g[&format!("{p}.logits")].v);
            eprintln!("{dir} {p} chunk={chunk} max|diff| = {d:.3e}");
            assert!(d < TOL, "{dir} {p} chunk {chunk}: differs by {d:.3e}");
        }
    }
}

fn check_decode(dir: &str) {
    let m = load(dir);
    let g = golden(dir);
    let v = m.cfg.vocab_size;
    for (p, ids) in prompts(&g) {
        let greedy = g[&format!("{p}.greedy_ids")].ids();
        let gl = &g[&format!("{p}.greedy_logits")];
        let (produced, logits) = greedy_decode(&m, &ids, greedy.len());
        let mut worst = 0.0f64;
        for (step, last) in logits.iter().enumerate() {
            assert_eq!(last.len(), v);
            worst = worst.max(max_diff(last, gl.row(step)));
        }
        eprintln!("{dir} {p} decode max|diff| = {worst:.3e}");
        assert_eq!(produced, greedy, "{dir} {p}: greedy continuation differs");
        assert!(
            worst < TOL,
            "{dir} {p}: decode logits differ by {worst:.3e}"
        );
    }
}

/// Compare the trace of p2 stage by stage, in forward order; name the first divergence.
fn check_trace(dir: &str, stages: &[(&str, &str)], tol: f64) {
    let m = load(dir);
    let g = golden(dir);
    let ids = g["p2.input_ids"].ids();
    let mut st = m.new_state();
    let mut tr = Trace::default();
    let mut items = [BatchItem {
        state: &mut st,
        tokens: &ids,
    }];
    m.forward(&mut items, Logits::All, Some(&mut tr)).unwrap();
    let mut checked = 0;
    let mut order: Vec<String> = vec!["embed".into()];
    for l in 0..m.cfg.num_layers {
        for (ours, _) in stages {
            order.push(format!("l{l}.{ours}"));
        }
    }
    order.push("hc_head.out".into());
    order.push("final_norm.out".into());
    for name in order {
        let (layer, stage) = name.split_once('.').unwrap_or(("", &name));
        let gname = stages
            .iter()
            .find(|(o, _)| *o == stage)
            .map(|(_, gn)| format!("trace.{layer}.{gn}"))
            .unwrap_or_else(|| format!("trace.{name}"));
        let (Some(want), Some((shape, got))) = (g.get(&gname), tr.tensors.get(&name)) else {
            continue;
        };
        let n: usize = want.shape.iter().product();
        assert_eq!(
            shape.iter().product::<usize>(),
            n,
            "{name}: shape {shape:?} vs golden {:?}",
            want.shape
        );
        let d = max_diff(got, &want.v);
        assert!(
            d < tol,
            "{dir}: first divergence at {name} (golden {gname}): max|diff| {d:.3e}"
        );
        checked += 1;
    }
    eprintln!("{dir}: {checked} trace tensors match");
    assert!(checked > 20, "too few trace tensors compared ({checked})");
}

#[test]
fn v41_prefill_matches_golden() {
    check_prefill("v41-tiny-dev");
}

#[test]
fn v41_chunked_prefill_matches_golden() {
    check_chunked("v41-tiny-dev");
}

#[test]
fn v41_decode_and_greedy_match_golden() {
    check_decode("v41-tiny-dev");
}

#[test]
fn v41_trace_layer_by_layer() {
    check_trace(
        "v41-tiny-dev",
        &[
            ("engram.gate", "engram.gate"),
            ("attn_hc.pre", "attn_hc.pre"),
            ("attn_hc.post", "attn_hc.post"),
            ("attn_hc.comb", "attn_hc.comb"),
            ("attn.in", "attn.in"),
            ("compressor.entries", "compressor.entries"),
            ("indexer.keys", "indexer.keys"),
            ("attn.out", "attn.out"),
            ("ffn_hc.pre", "ffn_hc.pre"),
            ("ffn_hc.post", "ffn_hc.post"),
            ("ffn_hc.comb", "ffn_hc.comb"),
            ("ffn.in", "ffn.in"),
            ("router.indices", "router.indices"),
            ("ffn.out", "ffn.out"),
            ("out_streams", "out_streams"),
        ],
        1e-4,
    );
}

#[test]
fn v4_prefill_matches_golden() {
    check_prefill("v4-tiny-dev");
}

#[test]
fn v4_chunked_prefill_matches_golden() {
    check_chunked("v4-tiny-dev");
}

#[test]
fn v4_decode_and_greedy_match_golden() {
    check_decode("v4-tiny-dev");
}

#[test]
fn v4_trace_layer_by_layer() {
    check_trace(
        "v4-tiny-dev",
        &[
            ("attn_hc.collapsed", "attn_hc.collapsed"),
            ("attn_hc.post", "attn_hc.post"),
            ("attn_hc.comb", "attn_hc.comb"),
            ("attn.in", "attn.in"),
            ("compressor.entries", "compressor.entries"),
            ("indexer.keys", "indexer.entries"),
            ("attn.out", "attn.out"),
            ("ffn_hc.collapsed", "ffn_hc.collapsed"),
            ("ffn_hc.post", "ffn_hc.post"),
            ("ffn_hc.comb", "ffn_hc.comb"),
            ("ffn.in", "mlp.in"),
            ("router.logits", "router.logits"),
            ("router.indices", "router.indices"),
            ("ffn.out", "mlp.out"),
            ("out_streams", "out_streams"),
        ],
        1e-4,
    );
}

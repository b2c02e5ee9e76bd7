//! `deepinfer score`: the binary writes `<name>.logits` f32 [len, V] matching the golden
//! logits (and log-softmax with --logprobs); bad input is one error line and exit code 1.
#![cfg(feature = "cli")]

mod common;
use common::*;
use safetensors::SafeTensors;
use std::process::Command;

#[test]
fn score_writes_golden_logits_and_logprobs() {
    let g = golden("v4-tiny-dev");
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("ids.json");
    let p1 = g["p1.input_ids"].ids();
    let p2 = g["p2.input_ids"].ids();
    std::fs::write(&input, serde_json::json!({"a": p1, "b": p2}).to_string()).unwrap();
    for logprobs in [false, true] {
        let out = dir.path().join(format!("out{logprobs}.safetensors"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_deepinfer"));
        cmd.args(["score", "--model"])
            .arg(data("v4-tiny-dev"))
            .arg("--input")
            .arg(&input)
            .arg("--output")
            .arg(&out)
            .args(["--chunk", "16", "--threads", "2"]);
        if logprobs {
            cmd.arg("--logprobs");
        }
        let st = cmd.status().unwrap();
        assert!(st.success());
        let bytes = std::fs::read(&out).unwrap();
        let t = SafeTensors::deserialize(&bytes).unwrap();
        for (name, p) in [("a", "p1"), ("b", "p2")] {
            let v = t.tensor(&format!("{name}.logits")).unwrap();
            assert_eq!(v.shape(), &[g[&format!("{p}.input_ids")].v.len(), 512]);
            let got: Vec<f32> = v
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let want = &g[&format!("{p}.logits")].v;
            if logprobs {
                for (r, row) in got.chunks(512).enumerate() {
                    let s: f64 = row.iter().map(|&x| (x as f64).exp()).sum();
                    assert!((s - 1.0).abs() < 1e-4, "row {r} sums to {s}");
                    // log-softmax preserves differences between logits
                    let w = &want[r * 512..(r + 1) * 512];
                    let d = (row[7] - row[3]) as f64 - (w[7] - w[3]);
                    assert!(d.abs() < 2e-4);
                }
            } else {
                assert!(max_diff(&got, want) < 1e-4);
            }
        }
    }
}

#[test]
fn score_reports_bad_input_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("ids.json");
    std::fs::write(&input, r#"{"a": [1, 2, "x"]}"#).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_deepinfer"))
        .args(["score", "--model"])
        .arg(data("v4-tiny-dev"))
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(dir.path().join("o.safetensors"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("non-token value"), "{err}");
    // a token id outside the vocabulary is an input error too
    std::fs::write(&input, r#"{"a": [1, 99999]}"#).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_deepinfer"))
        .args(["score", "--model"])
        .arg(data("v4-tiny-dev"))
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(dir.path().join("o.safetensors"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("outside the vocabulary"));
}

#[test]
fn score_with_expert_parallel_ranks_writes_the_same_logits() {
    let g = golden("v41-tiny-dev");
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("ids.json");
    std::fs::write(
        &input,
        serde_json::json!({"a": g["p1.input_ids"].ids()}).to_string(),
    )
    .unwrap();
    let run = |ep: &str| {
        let out = dir.path().join(format!("ep{ep}.safetensors"));
        let o = Command::new(env!("CARGO_BIN_EXE_deepinfer"))
            .args(["score", "--model"])
            .arg(data("v41-tiny-dev"))
            .arg("--input")
            .arg(&input)
            .arg("--output")
            .arg(&out)
            .args(["--chunk", "7", "--expert-parallel", ep])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read(&out).unwrap()
    };
    assert_eq!(run("1"), run("3"));
    let o = Command::new(env!("CARGO_BIN_EXE_deepinfer"))
        .args(["score", "--model"])
        .arg(data("v41-tiny-dev"))
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(dir.path().join("x.safetensors"))
        .args(["--expert-parallel", "99"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--expert-parallel"));
}

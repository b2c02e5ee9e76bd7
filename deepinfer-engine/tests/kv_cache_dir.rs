//! The persistent prefix cache (`EngineConfig::kv_cache_dir`) across engines, as two
//! processes would use it: the second finds the first's prefix states on disk and gives the
//! same tokens; damaged files and another model's files are misses, never wrong data.
#![cfg(feature = "runtime")]

mod common;
use common::prompt;
use deepinfer_engine::Model;
use deepinfer_engine::model::{RandomDtype, write_random_checkpoint};
use deepinfer_engine::runtime::{Engine, EngineConfig, GenParams, Metrics, Output, Request};
use deepinfer_kernels::CpuBackend;
use deepinfer_sample::SamplingParams;
use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/v41-tiny-dev")
}

fn engine(model_dir: &Path, dir: &Path) -> Engine<CpuBackend> {
    let model = Model::load(model_dir, CpuBackend::batch_invariant()).expect("model loads");
    Engine::new(
        model,
        EngineConfig {
            block_size: 8,
            kv_cache_dir: Some(dir.to_path_buf()),
            ..EngineConfig::default()
        },
    )
    .expect("engine")
}

/// Four requests over one shared 48-token prefix: two greedy, two seeded.
fn requests() -> Vec<Request> {
    let shared = prompt(11, 48);
    (0..4u64)
        .map(|i| {
            let mut p = shared.clone();
            p.extend(prompt(100 + i, 13));
            let params = if i % 2 == 0 {
                GenParams::greedy(8)
            } else {
                GenParams {
                    sampling: SamplingParams {
                        temperature: 0.8,
                        top_k: 40,
                        seed: i,
                        ..SamplingParams::default()
                    },
                    max_tokens: 8,
                    logprobs: true,
                    ..GenParams::default()
                }
            };
            Request::new(i, p, params)
        })
        .collect()
}

/// Runs the requests one at a time (so later ones could hit in-process too) and returns the
/// outputs and metrics; the engine is dropped, which writes its queued states.
fn run(model_dir: &Path, dir: &Path) -> (Vec<Output>, Metrics) {
    let mut e = engine(model_dir, dir);
    let mut outs = Vec::new();
    for r in requests() {
        outs.extend(e.generate(vec![r]).expect("generate"));
    }
    (outs, e.metrics())
}

fn state_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "kvb"))
        .collect()
}

fn same(a: &[Output], b: &[Output]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.token_ids, y.token_ids, "request {}", x.id);
        assert_eq!(x.logprobs, y.logprobs, "request {}", x.id);
    }
}

#[test]
fn a_second_engine_loads_prefix_states_from_disk_and_gives_the_same_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let (first, m1) = run(&fixture(), tmp.path());
    assert_eq!(m1.cached_disk_tokens, 0, "{m1:?}");
    assert!(m1.disk_writes > 0, "{m1:?}");
    assert!(!state_files(tmp.path()).is_empty());

    let (second, m2) = run(&fixture(), tmp.path());
    same(&first, &second);
    // The first request of the second run has nothing in memory: its prefix comes from disk.
    assert_eq!(
        second[0].usage.cached_tokens, 40,
        "61 − 8 − 6 rounded to blocks of 8"
    );
    assert!(m2.cached_disk_tokens >= 40, "{m2:?}");
    assert!(
        m2.cached_prompt_tokens > m1.cached_prompt_tokens,
        "{m1:?} {m2:?}"
    );
    assert_eq!(m2.disk_rejected, 0);
}

#[test]
fn damaged_state_files_are_recomputed_with_the_same_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let (first, _) = run(&fixture(), tmp.path());
    let files = state_files(tmp.path());
    assert!(!files.is_empty());
    for (i, f) in files.iter().enumerate() {
        let mut b = std::fs::read(f).unwrap();
        if i % 2 == 0 {
            // A flipped byte in the payload: the checksum fails.
            let k = b.len() - 1;
            b[k] ^= 0x5a;
        } else {
            // Truncated.
            b.truncate(b.len() / 2);
        }
        std::fs::write(f, b).unwrap();
    }
    let (second, m2) = run(&fixture(), tmp.path());
    same(&first, &second);
    assert_eq!(m2.cached_disk_tokens, 0, "{m2:?}");
    assert_eq!(second[0].usage.cached_tokens, 0);
}

#[test]
fn another_model_with_the_same_config_gets_no_disk_hit() {
    let tmp = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    write_random_checkpoint(
        &fixture().join("config.json"),
        other.path(),
        0xD1FF,
        RandomDtype::F32,
    )
    .unwrap();
    let map = other.path().join("engram_token_map.json");
    if !map.exists() {
        std::fs::copy(fixture().join("engram_token_map.json"), &map).unwrap();
    }
    let (_, m1) = run(&fixture(), tmp.path());
    assert!(m1.disk_writes > 0);
    let (outs, m2) = run(other.path(), tmp.path());
    assert_eq!(m2.cached_disk_tokens, 0, "{m2:?}");
    assert_eq!(outs[0].usage.cached_tokens, 0);
}

#[test]
fn a_state_round_trips_through_bytes_and_bad_bytes_are_errors() {
    use deepinfer_engine::{BatchItem, Logits};
    let m = Model::load(&fixture(), CpuBackend::batch_invariant()).unwrap();
    let toks = prompt(3, 37);
    let mut st = m.new_state();
    m.forward(
        &mut [BatchItem {
            state: &mut st,
            tokens: &toks,
        }],
        Logits::Last,
        None,
    )
    .unwrap();
    let id = m.state_identity().unwrap();
    let bytes = m.encode_state(&st, id).unwrap();
    let mut back = m.decode_state(&bytes, id).unwrap();
    assert_eq!(m.encode_state(&back, id).unwrap(), bytes);
    assert_eq!(back.global_entries(), st.global_entries());
    // Both continue to the same logits, bit for bit.
    let next = [7u32, 8, 9];
    let a = m
        .forward(
            &mut [BatchItem {
                state: &mut st,
                tokens: &next,
            }],
            Logits::Last,
            None,
        )
        .unwrap();
    let b = m
        .forward(
            &mut [BatchItem {
                state: &mut back,
                tokens: &next,
            }],
            Logits::Last,
            None,
        )
        .unwrap();
    assert_eq!(a, b);

    assert!(m.decode_state(&bytes, id ^ 1).is_err(), "other identity");
    assert!(
        m.decode_state(&bytes[..bytes.len() - 3], id).is_err(),
        "truncated"
    );
    let mut long = bytes.clone();
    long.push(0);
    assert!(m.decode_state(&long, id).is_err(), "trailing bytes");
    assert!(m.decode_state(b"not a state", id).is_err(), "magic");
    // Every truncation point is an error, never a panic.
    for cut in (0..bytes.len()).step_by(97) {
        assert!(m.decode_state(&bytes[..cut], id).is_err());
    }
    assert_eq!(m.state_identity().unwrap(), id, "identity is stable");
}

//! Batch invariance (bit-identical rows alone and in mixed batches) and the DSpark drafter
//! (golden drafts; greedy speculative decoding equals plain greedy decoding).

mod common;
use common::*;
use deepinfer_engine::{BatchItem, Logits, Model};
use deepinfer_kernels::CpuBackend;

fn run_alone(m: &Model<CpuBackend>, prefix: &[u32], chunk: &[u32]) -> Vec<f32> {
    let mut st = m.new_state();
    if !prefix.is_empty() {
        let mut it = [BatchItem {
            state: &mut st,
            tokens: prefix,
        }];
        m.forward(&mut it, Logits::All, None).unwrap();
    }
    let mut it = [BatchItem {
        state: &mut st,
        tokens: chunk,
    }];
    m.forward(&mut it, Logits::All, None).unwrap().remove(0)
}

fn check_batch_invariance(dir: &str) {
    let m = load(dir);
    let g = golden(dir);
    let p3 = g["p3.input_ids"].ids();
    let p2 = g["p2.input_ids"].ids();
    // (prefix already in the cache, chunk run now): decode rows and prefill chunks at
    // different positions, in one forward.
    let cases: Vec<(Vec<u32>, Vec<u32>)> = vec![
        (p3[..40].to_vec(), p3[40..41].to_vec()),
        (Vec::new(), p2.clone()),
        (p3[..7].to_vec(), p3[7..23].to_vec()),
        (p2[..32].to_vec(), p2[32..33].to_vec()),
    ];
    let alone: Vec<Vec<f32>> = cases.iter().map(|(p, c)| run_alone(&m, p, c)).collect();
    let mut states: Vec<_> = cases
        .iter()
        .map(|(p, _)| {
            let mut st = m.new_state();
            if !p.is_empty() {
                let mut it = [BatchItem {
                    state: &mut st,
                    tokens: p,
                }];
                m.forward(&mut it, Logits::All, None).unwrap();
            }
            st
        })
        .collect();
    let mut items: Vec<_> = states
        .iter_mut()
        .zip(&cases)
        .map(|(st, (_, c))| BatchItem {
            state: st,
            tokens: &c[..],
        })
        .collect();
    let batched = m.forward(&mut items, Logits::All, None).unwrap();
    for (i, (a, b)) in alone.iter().zip(&batched).enumerate() {
        assert!(a == b, "{dir}: item {i} differs between alone and batched");
    }
    // and the batch order does not matter
    let mut states2: Vec<_> = cases
        .iter()
        .rev()
        .map(|(p, _)| {
            let mut st = m.new_state();
            if !p.is_empty() {
                let mut it = [BatchItem {
                    state: &mut st,
                    tokens: p,
                }];
                m.forward(&mut it, Logits::All, None).unwrap();
            }
            st
        })
        .collect();
    let mut items: Vec<_> = states2
        .iter_mut()
        .zip(cases.iter().rev())
        .map(|(st, (_, c))| BatchItem {
            state: st,
            tokens: &c[..],
        })
        .collect();
    let rev = m.forward(&mut items, Logits::All, None).unwrap();
    for (i, r) in rev.iter().rev().enumerate() {
        assert!(*r == alone[i], "{dir}: item {i} differs in reversed batch");
    }
}

#[test]
fn v41_batch_invariant() {
    check_batch_invariance("v41-tiny-dev");
}

#[test]
fn v4_batch_invariant() {
    check_batch_invariance("v4-tiny-dev");
}

#[test]
fn dspark_drafts_match_golden() {
    let m = load("v41-tiny-dev");
    let g = golden("v41-tiny-dev");
    let v = m.cfg.vocab_size;
    let (mut worst_l, mut worst_c) = (0.0f64, 0.0f64);
    for i in 0..4 {
        let p = format!("p{i}");
        let ids = g[&format!("{p}.input_ids")].ids();
        let greedy = g[&format!("{p}.greedy_ids")].ids();
        let steps = g[&format!("{p}.dspark.steps")].ids();
        let anchors = g[&format!("{p}.dspark.anchor_ids")].ids();
        let mut st = m.new_state();
        let mut it = [BatchItem {
            state: &mut st,
            tokens: &ids,
        }];
        m.forward(&mut it, Logits::Last, None).unwrap();
        let mut done = 0usize;
        for (s, &k) in steps.iter().enumerate() {
            let k = k as usize;
            if k > done {
                let mut it = [BatchItem {
                    state: &mut st,
                    tokens: &greedy[done..k],
                }];
                m.forward(&mut it, Logits::Last, None).unwrap();
                done = k;
            }
            let d = m.draft(&st, anchors[s]).unwrap();
            let bsz = d.draft_ids.len();
            let base = &g[&format!("{p}.dspark.base_logits")];
            let lg = &g[&format!("{p}.dspark.logits")];
            let conf = &g[&format!("{p}.dspark.confidence")];
            let ids_g = &g[&format!("{p}.dspark.draft_ids")];
            let hid = &g[&format!("{p}.dspark.head_hidden")];
            let n = bsz * v;
            worst_l = worst_l.max(max_diff(&d.base_logits, &base.v[s * n..(s + 1) * n]));
            worst_l = worst_l.max(max_diff(&d.logits, &lg.v[s * n..(s + 1) * n]));
            let dh = d.head_hidden.len();
            worst_l = worst_l.max(max_diff(&d.head_hidden, &hid.v[s * dh..(s + 1) * dh]));
            worst_c = worst_c.max(max_diff(&d.confidence, &conf.v[s * bsz..(s + 1) * bsz]));
            let want: Vec<u32> = ids_g.v[s * bsz..(s + 1) * bsz]
                .iter()
                .map(|&x| x as u32)
                .collect();
            assert_eq!(d.draft_ids, want, "{p} step {s}: draft ids");
            for (r, (&t, &pr)) in d.draft_ids.iter().zip(&d.draft_probs).enumerate() {
                let row = &d.logits[r * v..(r + 1) * v];
                let z: f64 = row
                    .iter()
                    .map(|&x| ((x - row[t as usize]) as f64).exp())
                    .sum();
                assert!((pr as f64 - 1.0 / z).abs() < 1e-6 && pr > 0.0 && pr <= 1.0);
            }
        }
    }
    eprintln!("dspark: logits max|diff| {worst_l:.3e}, confidence {worst_c:.3e}");
    assert!(worst_l < 1e-4, "draft logits differ by {worst_l:.3e}");
    assert!(worst_c < 1e-5, "confidence differs by {worst_c:.3e}");
}

#[test]
fn dspark_context_features_match_trace() {
    let m = load("v41-tiny-dev");
    let g = golden("v41-tiny-dev");
    let ids = g["p2.input_ids"].ids();
    let mut st = m.new_state();
    let mut tr = deepinfer_engine::Trace::default();
    let mut it = [BatchItem {
        state: &mut st,
        tokens: &ids,
    }];
    m.forward(&mut it, Logits::Last, Some(&mut tr)).unwrap();
    for name in ["dspark.main_hidden", "dspark.main_x"] {
        let d = max_diff(&tr.tensors[name].1, &g[&format!("trace.{name}")].v);
        assert!(d < 1e-4, "{name}: {d:.3e}");
    }
}

/// Greedy decoding with DSpark drafts verified by the target (state snapshot, verify the
/// block in one forward, keep the longest agreeing prefix plus the target's own token)
/// yields exactly the plain greedy tokens.
#[test]
fn speculative_greedy_equals_plain_greedy() {
    let m = load("v41-tiny-dev");
    let g = golden("v41-tiny-dev");
    for i in [1usize, 3] {
        let p = format!("p{i}");
        let ids = g[&format!("{p}.input_ids")].ids();
        let greedy = g[&format!("{p}.greedy_ids")].ids();
        let mut st = m.new_state();
        let mut it = [BatchItem {
            state: &mut st,
            tokens: &ids,
        }];
        let mut next = argmax(&m.forward(&mut it, Logits::Last, None).unwrap()[0]) as u32;
        let mut out = vec![next];
        let (mut steps, mut accepted) = (0, 0);
        while out.len() < greedy.len() {
            let d = m.draft(&st, next).unwrap();
            let mut block = vec![next];
            block.extend_from_slice(&d.draft_ids[..d.draft_ids.len() - 1]);
            let snapshot = st.clone();
            let mut it = [BatchItem {
                state: &mut st,
                tokens: &block,
            }];
            let lg = m.forward(&mut it, Logits::All, None).unwrap().remove(0);
            let v = m.cfg.vocab_size;
            // row j verifies draft j; the first mismatch is replaced by the target's pick
            let mut keep = 1; // the anchor
            let mut new_tokens = Vec::new();
            for j in 0..block.len() {
                let t = argmax(&lg[j * v..(j + 1) * v]) as u32;
                new_tokens.push(t);
                if j + 1 < block.len() && block[j + 1] == t {
                    keep += 1;
                    accepted += 1;
                } else {
                    break;
                }
            }
            steps += 1;
            // roll back and consume exactly the accepted tokens
            st = snapshot;
            let mut it = [BatchItem {
                state: &mut st,
                tokens: &block[..keep],
            }];
            m.forward(&mut it, Logits::Last, None).unwrap();
            next = *new_tokens.last().unwrap();
            out.extend_from_slice(&new_tokens);
        }
        out.truncate(greedy.len());
        assert_eq!(out, greedy, "{p}: speculative greedy differs");
        eprintln!("{p}: {steps} verify steps, {accepted} drafts accepted");
    }
}

/// One drafter pass over several sequences (different context lengths, so different window
/// lengths) gives, with the batch-invariant kernels, exactly each sequence's own draft.
#[test]
fn batched_drafts_equal_single_drafts() {
    let dir = data("v41-tiny-dev");
    let m = Model::load(&dir, CpuBackend::batch_invariant()).unwrap();
    let g = golden("v41-tiny-dev");
    let mut states = Vec::new();
    let mut anchors = Vec::new();
    for i in 0..4 {
        let ids = g[&format!("p{i}.input_ids")].ids();
        let mut st = m.new_state();
        let cut = ids.len() - i;
        m.forward(
            &mut [BatchItem {
                state: &mut st,
                tokens: &ids[..cut],
            }],
            Logits::Last,
            None,
        )
        .unwrap();
        states.push(st);
        anchors.push(ids[cut - 1]);
    }
    let items: Vec<_> = states.iter().zip(&anchors).map(|(s, &a)| (s, a)).collect();
    let batched = m.draft_batch(&items).unwrap();
    assert_eq!(batched.len(), 4);
    for (k, &(s, a)) in items.iter().enumerate() {
        let one = m.draft(s, a).unwrap();
        assert_eq!(one, batched[k], "sequence {k}");
    }
    assert!(m.draft_batch(&[]).unwrap().is_empty());
}

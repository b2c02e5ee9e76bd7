//! The global state (compressed entries, indexer keys) in one pool: a state attached to the
//! model's pool reads and writes the blocks a `deepinfer-kv` block table names, exactly as a
//! state with blocks of its own does; a second sequence that hits the first one's cached
//! blocks reads their entries without writing them; a rollback point and a detached snapshot
//! continue bit for bit.

mod common;
use common::*;
use deepinfer_engine::{BatchItem, Logits, Model, SeqState};
use deepinfer_kernels::{CpuBackend, CpuTensor};
use deepinfer_kv::{AllocateOptions, BlockManager, BlockManagerConfig};
use proptest::prelude::*;

const BLOCK: usize = 16;

fn fwd(m: &Model<CpuBackend>, st: &mut SeqState<CpuTensor>, toks: &[u32]) -> Vec<Vec<f32>> {
    m.forward(
        &mut [BatchItem {
            state: st,
            tokens: toks,
        }],
        Logits::All,
        None,
    )
    .unwrap()
}

/// Every layer's entries and keys, gathered.
fn entries(m: &Model<CpuBackend>, st: &SeqState<CpuTensor>) -> Vec<Option<Vec<f32>>> {
    use deepinfer_engine::model::GlobalPart::{Entries, IndexKeys};
    let be = m.backend();
    (0..m.cfg.num_layers)
        .flat_map(|l| [(Entries, l), (IndexKeys, l)])
        .map(|(p, l)| {
            st.global
                .gather(be, p, l)
                .ok()
                .flatten()
                .map(|t| deepinfer_kernels::Backend::download_f32(be, &t).unwrap())
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    #[test]
    fn the_pool_at_kv_block_ids_matches_own_blocks(
        cut in 1usize..99,
        extra in 1usize..20,
        v41 in any::<bool>(),
    ) {
        let dir = if v41 { "v41-tiny-dev" } else { "v4-tiny-dev" };
        let mut m = load(dir);
        m.set_global_pool(64, BLOCK).unwrap();
        let ids = golden(dir)["p3.input_ids"].ids();
        let (head, tail) = ids.split_at(cut);
        let tail = &tail[..extra.min(tail.len())];
        let all = [head, tail].concat();
        let mut kv = BlockManager::new(BlockManagerConfig::new(64, BLOCK)).unwrap();

        // Reference: blocks of its own.
        let mut own = m.new_state();
        let want_head = fwd(&m, &mut own, head);
        let want_tail = fwd(&m, &mut own.clone(), tail);

        // Sequence 1 in the pool, at the ids kv allocates for the whole prompt.
        kv.allocate(1, &all, AllocateOptions::default()).unwrap();
        let mut a = m.new_state();
        a.global.attach(m.global_cache().clone(), kv.block_table(1).unwrap(), 0);
        prop_assert_eq!(fwd(&m, &mut a, head), want_head);
        prop_assert_eq!(entries(&m, &a), entries(&m, &own));
        // A rollback point continues like the original, and restoring it forgets the tail.
        let snap = a.clone();
        let detached = a.detached();
        prop_assert!(!detached.global.in_pool());
        prop_assert_eq!(fwd(&m, &mut a, tail), want_tail.clone());
        let mut back = snap;
        prop_assert_eq!(fwd(&m, &mut back, tail), want_tail.clone());

        // Sequence 2 hits sequence 1's full blocks: it replays from position 0 reading them,
        // writes nothing there, and gives the same logits.
        kv.mark_computed(1, all.len()).unwrap();
        let hit = kv.allocate(2, &all, AllocateOptions::default()).unwrap().plan.reused_tokens;
        let shared: Vec<u32> = kv.block_table(2).unwrap()[..hit / BLOCK].to_vec();
        prop_assert_eq!(&shared[..], &kv.block_table(1).unwrap()[..hit / BLOCK]);
        let before = entries(&m, &a);
        let mut b = m.new_state();
        b.global.attach(m.global_cache().clone(), kv.block_table(2).unwrap(), hit);
        let got = fwd(&m, &mut b, &all);
        let mut fresh = m.new_state();
        prop_assert_eq!(got, fwd(&m, &mut fresh, &all));
        prop_assert_eq!(entries(&m, &a), before, "a hit wrote into shared blocks");

        // The detached snapshot outlives its blocks: kv gives them to another sequence,
        // whose writes replace them, and the snapshot still continues exactly.
        kv.free(1).unwrap();
        kv.free(2).unwrap();
        kv.reset_prefix_cache();
        let other: Vec<u32> = all.iter().map(|t| (t + 17) % m.cfg.vocab_size as u32).collect();
        kv.allocate(3, &other, AllocateOptions::default()).unwrap();
        let mut c = m.new_state();
        c.global.attach(m.global_cache().clone(), kv.block_table(3).unwrap(), 0);
        fwd(&m, &mut c, &other);
        let mut d = detached;
        prop_assert_eq!(fwd(&m, &mut d, tail), want_tail);
        // The pool never addresses more than its blocks.
        prop_assert!(m.global_cache().lock().unwrap().held_tensors() <= 64 * 2 * m.cfg.num_layers);
    }
}

#[test]
fn a_state_writing_past_its_block_table_is_an_error_not_a_panic() {
    let mut m = load("v41-tiny-dev");
    m.set_global_pool(4, BLOCK).unwrap();
    let toks = prompt(1, 40);
    // A forward of 40 positions over a state attached at `ids`: its error.
    let err = |ids: &[u32]| {
        let mut st = m.new_state();
        st.global.attach(m.global_cache().clone(), ids, 0);
        let r = m.forward(
            &mut [BatchItem {
                state: &mut st,
                tokens: &toks,
            }],
            Logits::Last,
            None,
        );
        r.unwrap_err().to_string()
    };
    // One block for 40 positions: the second block's entries have nowhere to go.
    let e = err(&[0]);
    assert!(e.contains("block table"), "{e}");
    // Ids outside the pool are refused too.
    assert!(err(&[9, 10, 11, 12, 13]).contains("outside the pool"));
    // A block size that is not a multiple of the compression ratios is refused.
    let r = *m.cfg.compress_ratios.iter().max().unwrap();
    assert!(r > 1);
    assert!(m.set_global_pool(4, r + 1).is_err());
    assert!(m.set_global_pool(4, 0).is_err());
}

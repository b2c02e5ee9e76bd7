//! The KV pool sized from the model and a memory budget (`EngineConfig::kv_cache_memory`,
//! `block_size` 0 = the model's block size), through the public API.
#![cfg(feature = "runtime")]

use deepinfer_engine::Model;
use deepinfer_engine::runtime::{Engine, EngineConfig, EngineError, KvCacheMemory};
use deepinfer_kernels::CpuBackend;
use std::path::PathBuf;

fn model() -> Model<CpuBackend> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/v41-tiny-dev");
    Model::load(&dir, CpuBackend::batch_invariant()).expect("fixture loads")
}

#[test]
fn a_byte_budget_gives_the_blocks_the_layout_says() {
    let m = model();
    let bs = deepinfer_engine::runtime::default_block_size(&m.cfg);
    assert_eq!(bs % m.global_block_tokens(), 0);
    let lay = m.kv_layout(bs, 6).unwrap();
    let (per_block, per_seq) = (lay.bytes_per_block(), lay.bytes_per_sequence());
    assert!(per_block > 0 && per_seq > 0);
    let cfg = EngineConfig {
        block_size: 0,
        max_num_seqs: 8,
        max_model_len: 1024,
        ..EngineConfig::default()
    };
    let blocks = 100u64;
    let budget = 8 * per_seq + blocks * per_block + per_block / 2;
    let e = Engine::new(
        m,
        EngineConfig {
            kv_cache_memory: Some(KvCacheMemory::Bytes(budget)),
            ..cfg.clone()
        },
    )
    .unwrap();
    let pool = e.kv_pool();
    assert_eq!(pool.block_size, bs, "block size 0 is the model's");
    assert_eq!(pool.num_blocks, blocks as usize);
    assert_eq!(
        e.kv_blocks().0,
        blocks as usize,
        "the scheduler's pool has them"
    );
    assert!(pool.bytes(8) <= budget);
    // A larger budget stops at what 8 sequences of 1,024 tokens can use.
    let e = Engine::new(
        model(),
        EngineConfig {
            kv_cache_memory: Some(KvCacheMemory::Bytes(1 << 40)),
            ..cfg.clone()
        },
    )
    .unwrap();
    assert_eq!(e.kv_pool().num_blocks, 8 * 1024usize.div_ceil(bs));
    // Without a budget, num_blocks and block_size are taken as given.
    let e = Engine::new(
        model(),
        EngineConfig {
            num_blocks: 77,
            block_size: 16,
            ..cfg
        },
    )
    .unwrap();
    assert_eq!((e.kv_pool().num_blocks, e.kv_pool().block_size), (77, 16));
}

#[test]
fn budgets_that_cannot_hold_one_context_are_refused() {
    let cfg = EngineConfig {
        block_size: 0,
        max_num_seqs: 4,
        max_model_len: 4096,
        ..EngineConfig::default()
    };
    for mem in [
        KvCacheMemory::Bytes(1),
        KvCacheMemory::Auto(0.0),
        KvCacheMemory::Auto(1.5),
        KvCacheMemory::Auto(f64::NAN),
    ] {
        let r = Engine::new(
            model(),
            EngineConfig {
                kv_cache_memory: Some(mem),
                ..cfg.clone()
            },
        );
        match r {
            Err(EngineError::Config(msg)) => assert!(msg.contains("kv cache memory"), "{msg}"),
            other => panic!("{mem:?}: {:?}", other.map(|e| e.kv_pool())),
        }
    }
    // Auto within (0, 1] on a system that reports its memory sizes a pool.
    if deepinfer_engine::runtime::available_host_memory().is_some() {
        let e = Engine::new(
            model(),
            EngineConfig {
                kv_cache_memory: Some(KvCacheMemory::Auto(0.01)),
                ..cfg
            },
        )
        .unwrap();
        assert!(e.kv_pool().num_blocks > 0);
    }
}

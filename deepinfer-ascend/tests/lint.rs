//! The source lint passes on every shipped kernel and catches each rule on a mutated copy.

use deepinfer_ascend::kernels::{KERNELS, kernel};
use deepinfer_ascend::lint::{Rule, lint, lint_text};

#[test]
fn every_shipped_kernel_passes_the_lint() {
    let mut all = Vec::new();
    for k in KERNELS {
        all.extend(lint(k));
    }
    assert!(
        all.is_empty(),
        "lint findings:\n{}",
        all.iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn kernel_registry_is_complete() {
    let names: Vec<&str> = KERNELS.iter().map(|k| k.name).collect();
    for want in [
        "rmsnorm_quant",
        "rope",
        "gemv",
        "router",
        "hc_mix",
        "attention",
        "sampling",
    ] {
        assert!(names.contains(&want), "{want} missing");
    }
}

/// Apply `from → to` (must occur) to kernel `name` and return the rules that fire.
fn mutate(name: &str, from: &str, to: &str) -> Vec<Rule> {
    let k = kernel(name).unwrap();
    assert!(k.source.contains(from), "{name} lacks `{from}`");
    let text = k.source.replacen(from, to, 1);
    lint_text(k, &text).into_iter().map(|i| i.rule).collect()
}

#[test]
fn double_init_is_caught() {
    let r = mutate(
        "rope",
        "pipe.InitBuffer(tmpBuf, t.tmp_bytes);",
        "pipe.InitBuffer(tmpBuf, t.tmp_bytes);\n        pipe.InitBuffer(tmpBuf, t.tmp_bytes);",
    );
    assert!(r.contains(&Rule::BufferInit), "{r:?}");
}

#[test]
fn missing_init_is_caught() {
    let r = mutate(
        "sampling",
        "pipe.InitBuffer(outQueueTok, 1, t.out_bytes);",
        "",
    );
    assert!(r.contains(&Rule::BufferInit), "{r:?}");
    assert!(r.contains(&Rule::BufferSize), "{r:?}");
}

#[test]
fn depth_mismatch_is_caught() {
    let r = mutate(
        "router",
        "pipe.InitBuffer(inQueueBias, 1, t.bias_bytes);",
        "pipe.InitBuffer(inQueueBias, BUFFER_NUM, t.bias_bytes);",
    );
    assert!(r.contains(&Rule::BufferInit), "{r:?}");
}

#[test]
fn wrong_buffer_size_field_is_caught() {
    let r = mutate(
        "hc_mix",
        "pipe.InitBuffer(inQueueO, BUFFER_NUM, t.o_bytes);",
        "pipe.InitBuffer(inQueueO, BUFFER_NUM, t.x_bytes);",
    );
    assert_eq!(r, vec![Rule::BufferSize]);
    let r = mutate(
        "hc_mix",
        "pipe.InitBuffer(inQueueO, BUFFER_NUM, t.o_bytes);",
        "pipe.InitBuffer(inQueueO, BUFFER_NUM, 4096);",
    );
    assert_eq!(r, vec![Rule::BufferSize]);
}

#[test]
fn tiling_struct_drift_is_caught() {
    // Swapped fields, a changed type, a missing field.
    let r = mutate(
        "gemv",
        "    uint32_t m;\n    uint32_t n;",
        "    uint32_t n;\n    uint32_t m;",
    );
    assert_eq!(r, vec![Rule::TilingAbi]);
    let r = mutate("attention", "    float scale;", "    uint32_t scale;");
    assert_eq!(r, vec![Rule::TilingAbi]);
    let r = mutate("rmsnorm_quant", "    uint32_t tmp_bytes;\n};", "};");
    assert_eq!(r, vec![Rule::TilingAbi]);
}

#[test]
fn non_vector_entry_is_caught() {
    let r = mutate(
        "hc_mix",
        "KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);",
        "",
    );
    assert_eq!(r, vec![Rule::VectorEntry]);
    let r = mutate("hc_mix", "void hc_mix(", "void hc_mix_v2(");
    assert_eq!(r, vec![Rule::VectorEntry]);
}

#[test]
fn truncating_bf16_cast_is_caught() {
    let r = mutate(
        "rmsnorm_quant",
        "Cast(yLocal, work, RoundMode::CAST_RINT, len);",
        "Cast(yLocal, work, RoundMode::CAST_NONE, len);",
    );
    assert_eq!(r, vec![Rule::CastRounding]);
    let r = mutate(
        "rmsnorm_quant",
        "Cast(qLocal, work, RoundMode::CAST_RINT, len);",
        "Cast(qLocal, work, RoundMode::CAST_TRUNC, len);",
    );
    assert_eq!(r, vec![Rule::CastRounding]);
    // Widening casts may use CAST_NONE.
    let r = mutate(
        "hc_mix",
        "Cast(acc, oLocal, RoundMode::CAST_NONE, cl);",
        "Cast(acc, oLocal, RoundMode::CAST_NONE, cl);",
    );
    assert!(r.is_empty());
}

#[test]
fn unaligned_datacopy_is_caught() {
    // The tail length is arbitrary: copying it with DataCopy instead of DataCopyPad.
    let r = mutate(
        "sampling",
        "DataCopy(pLocal, pGm[off], t.tile_len);",
        "DataCopy(pLocal, pGm[off], len);",
    );
    assert_eq!(r, vec![Rule::DataCopyAlign]);
    let r = mutate(
        "gemv",
        "DataCopy(lutLocal, lutGm, 528);",
        "DataCopy(lutLocal, lutGm, 530);",
    );
    assert_eq!(r, vec![Rule::DataCopyAlign]);
    // A field aligned only for wider elements does not cover narrower ones.
    let r = mutate(
        "router",
        "DataCopyPad(lLocal, lGm[r * t.experts], ext, padv);",
        "DataCopy(lLocal, lGm[r * t.experts], t.experts);",
    );
    assert_eq!(r, vec![Rule::DataCopyAlign]);
}

#[test]
fn constant_drift_is_caught() {
    let k = kernel("rope").unwrap();
    let text = k.source.replace(
        "#include \"common.h\"",
        &deepinfer_ascend::kernels::COMMON_H.replace("BUFFER_NUM = 2", "BUFFER_NUM = 3"),
    );
    let r: Vec<Rule> = lint_text(k, &text).into_iter().map(|i| i.rule).collect();
    assert!(r.contains(&Rule::Constant), "{r:?}");
}

#[test]
fn commented_out_code_does_not_count() {
    // A buffer whose only InitBuffer is commented out is uninitialised.
    let r = mutate(
        "sampling",
        "pipe.InitBuffer(tmpBuf, t.tmp_bytes);",
        "// pipe.InitBuffer(tmpBuf, t.tmp_bytes);",
    );
    assert!(r.contains(&Rule::BufferInit), "{r:?}");
    let r = mutate(
        "sampling",
        "pipe.InitBuffer(tmpBuf, t.tmp_bytes);",
        "/* pipe.InitBuffer(tmpBuf, t.tmp_bytes); */ pipe.InitBuffer(tmpBuf, t.tmp_bytes);",
    );
    assert!(r.is_empty(), "{r:?}");
}

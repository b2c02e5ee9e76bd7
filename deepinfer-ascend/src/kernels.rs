//! Registry of the Ascend C kernel sources shipped in `kernels/`, each bound to its tiling.

use crate::chip::Chip;
use crate::lint::{LintIssue, ParsedSource, lint_tiling};
use crate::mx::MxFormat;
use crate::tiling::{
    AttentionShape, AttentionTiling, FieldAbi, GemvFormat, GemvShape, GemvTiling, HcMixShape,
    HcMixTiling, KernelTiling, RmsNormShape, RmsNormTiling, RopeShape, RopeTiling, RouterShape,
    RouterTiling, SamplingShape, SamplingTiling, ScoreFunc, TilingAbi,
};

/// The shared prelude every kernel includes as `#include "common.h"`.
pub const COMMON_H: &str = include_str!("../kernels/common.h");

/// Which AI-core unit a kernel runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelKind {
    /// Vector unit only (`KERNEL_TYPE_AIV_ONLY`).
    Vector,
}

/// One kernel source.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// Entry symbol (the `extern "C" __global__ __aicore__` function).
    pub name: &'static str,
    /// File name under `kernels/`.
    pub file: &'static str,
    /// The source text, as shipped.
    pub source: &'static str,
    /// Unit it runs on.
    pub kind: KernelKind,
    /// Fields of its tiling struct (roles tell the lint which counts are aligned).
    pub fields: &'static [FieldAbi],
    /// Checks the source's tiling struct and buffers against the Rust tiling (a representative
    /// planned instance).
    pub lint_tiling: fn(&ParsedSource) -> Vec<LintIssue>,
}

impl KernelSource {
    /// The source with `#include "common.h"` replaced by the prelude, as handed to aclrtc.
    pub fn expanded(&self) -> String {
        expand(self.source)
    }
}

/// Replace the `common.h` include by its text.
pub fn expand(source: &str) -> String {
    source.replace("#include \"common.h\"", COMMON_H)
}

const SPEC: crate::chip::ChipSpec = Chip::Ascend950.spec();

/// Lints a source against its planned tiling, or reports why planning failed.
fn lint_planned<T: KernelTiling>(planned: crate::Result<T>, p: &ParsedSource) -> Vec<LintIssue> {
    match planned {
        Ok(t) => lint_tiling(&t, p),
        Err(e) => vec![LintIssue::planner(p, e)],
    }
}

fn rmsnorm_lint(p: &ParsedSource) -> Vec<LintIssue> {
    let s = RmsNormShape {
        rows: 4,
        dim: 5120,
        eps: 1e-6,
        quant: true,
    };
    lint_planned(RmsNormTiling::plan(&SPEC, &s), p)
}

fn rope_lint(p: &ParsedSource) -> Vec<LintIssue> {
    let s = RopeShape {
        rows: 4,
        heads: 64,
        head_dim: 512,
        rope_dim: 64,
        table_len: 4096,
        inverse: false,
    };
    lint_planned(RopeTiling::plan(&SPEC, &s), p)
}

fn gemv_lint(p: &ParsedSource) -> Vec<LintIssue> {
    let s = GemvShape {
        m: 4,
        n: 4096,
        k: 5120,
        format: GemvFormat::Mx(MxFormat::Fp4E2M1),
    };
    lint_planned(GemvTiling::plan(&SPEC, &s), p)
}

fn router_lint(p: &ParsedSource) -> Vec<LintIssue> {
    let s = RouterShape {
        rows: 4,
        experts: 384,
        top_k: 6,
        score: ScoreFunc::SqrtSoftplus,
        temperature: 1.0,
        renorm: true,
        route_scale: 1.5,
    };
    lint_planned(RouterTiling::plan(&SPEC, &s), p)
}

fn hc_mix_lint(p: &ParsedSource) -> Vec<LintIssue> {
    let s = HcMixShape {
        rows: 4,
        streams: 4,
        dim: 5120,
    };
    lint_planned(HcMixTiling::plan(&SPEC, &s), p)
}

fn attention_lint(p: &ParsedSource) -> Vec<LintIssue> {
    let s = AttentionShape {
        heads: 64,
        head_dim: 512,
        n_window: 128,
        n_comp: 512,
        comp_rows: 4096,
        scale: 0.044,
    };
    lint_planned(AttentionTiling::plan(&SPEC, &s), p)
}

fn sampling_lint(p: &ParsedSource) -> Vec<LintIssue> {
    let s = SamplingShape {
        rows: 4,
        vocab: 129_280,
    };
    lint_planned(SamplingTiling::plan(&SPEC, &s), p)
}

/// Every shipped kernel.
pub const KERNELS: &[KernelSource] = &[
    KernelSource {
        name: "rmsnorm_quant",
        file: "rmsnorm_quant.asc",
        source: include_str!("../kernels/rmsnorm_quant.asc"),
        kind: KernelKind::Vector,
        fields: <RmsNormTiling as TilingAbi>::FIELDS,
        lint_tiling: rmsnorm_lint,
    },
    KernelSource {
        name: "rope",
        file: "rope.asc",
        source: include_str!("../kernels/rope.asc"),
        kind: KernelKind::Vector,
        fields: <RopeTiling as TilingAbi>::FIELDS,
        lint_tiling: rope_lint,
    },
    KernelSource {
        name: "gemv",
        file: "gemv.asc",
        source: include_str!("../kernels/gemv.asc"),
        kind: KernelKind::Vector,
        fields: <GemvTiling as TilingAbi>::FIELDS,
        lint_tiling: gemv_lint,
    },
    KernelSource {
        name: "router",
        file: "router.asc",
        source: include_str!("../kernels/router.asc"),
        kind: KernelKind::Vector,
        fields: <RouterTiling as TilingAbi>::FIELDS,
        lint_tiling: router_lint,
    },
    KernelSource {
        name: "hc_mix",
        file: "hc_mix.asc",
        source: include_str!("../kernels/hc_mix.asc"),
        kind: KernelKind::Vector,
        fields: <HcMixTiling as TilingAbi>::FIELDS,
        lint_tiling: hc_mix_lint,
    },
    KernelSource {
        name: "attention",
        file: "attention.asc",
        source: include_str!("../kernels/attention.asc"),
        kind: KernelKind::Vector,
        fields: <AttentionTiling as TilingAbi>::FIELDS,
        lint_tiling: attention_lint,
    },
    KernelSource {
        name: "sampling",
        file: "sampling.asc",
        source: include_str!("../kernels/sampling.asc"),
        kind: KernelKind::Vector,
        fields: <SamplingTiling as TilingAbi>::FIELDS,
        lint_tiling: sampling_lint,
    },
];

/// Look a kernel up by entry name.
pub fn kernel(name: &str) -> Option<&'static KernelSource> {
    KERNELS.iter().find(|k| k.name == name)
}

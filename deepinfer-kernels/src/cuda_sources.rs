//! The CUDA kernel sources (`kernels/*.cu`), embedded so NVRTC can compile them at run time.
//!
//! Always compiled (plain strings): the CI compile check reads them without the `cuda` feature.

/// One `.cu` file.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// File stem, also the NVRTC program name.
    pub name: &'static str,
    /// The file's text.
    pub src: &'static str,
    /// Kernel entry points the file defines.
    pub entries: &'static [&'static str],
}

/// Helpers prepended to every file.
pub const PRELUDE: &str = include_str!("../kernels/prelude.cuh");

/// Every kernel file.
pub const SOURCES: &[KernelSource] = &[
    KernelSource {
        name: "gemv",
        src: include_str!("../kernels/gemv.cu"),
        entries: &["gemv_f32", "gemv_bf16", "gemv_fp8", "gemv_fp4"],
    },
    KernelSource {
        name: "gemv_wide",
        src: include_str!("../kernels/gemv_wide.cu"),
        entries: &["gemv_wide_f32", "gemv_wide_bf16"],
    },
    KernelSource {
        name: "gemm",
        src: include_str!("../kernels/gemm.cu"),
        entries: &["gemm_f32_tn", "grouped_matmul"],
    },
    KernelSource {
        name: "norm",
        src: include_str!("../kernels/norm.cu"),
        entries: &["rms_norm", "softmax_rows"],
    },
    KernelSource {
        name: "elementwise",
        src: include_str!("../kernels/elementwise.cu"),
        entries: &[
            "add_bcast",
            "mul_bcast",
            "affine",
            "unary",
            "swiglu",
            "f32_to_bf16",
            "bf16_to_f32_k",
        ],
    },
    KernelSource {
        name: "rope",
        src: include_str!("../kernels/rope.cu"),
        entries: &["rope_interleaved"],
    },
    KernelSource {
        name: "attention",
        src: include_str!("../kernels/attention.cu"),
        entries: &["sink_attention"],
    },
    KernelSource {
        name: "compress",
        src: include_str!("../kernels/compress.cu"),
        entries: &["compress_pool"],
    },
    KernelSource {
        name: "indexer",
        src: include_str!("../kernels/indexer.cu"),
        entries: &["indexer_scores", "topk_rows"],
    },
    KernelSource {
        name: "hc",
        src: include_str!("../kernels/hc.cu"),
        entries: &["hc_mixes", "hc_collapse", "hc_expand"],
    },
    KernelSource {
        name: "moe",
        src: include_str!("../kernels/moe.cu"),
        entries: &["moe_route", "expert_gemv", "moe_combine"],
    },
    KernelSource {
        name: "sample",
        src: include_str!("../kernels/sample.cu"),
        entries: &["sample_rows"],
    },
    KernelSource {
        name: "copy",
        src: include_str!("../kernels/copy.cu"),
        entries: &[
            "copy_blocks_stage",
            "copy_blocks_commit",
            "gather_rows_f32",
            "gather_rows_bf16",
        ],
    },
    KernelSource {
        name: "quant",
        src: include_str!("../kernels/quant.cu"),
        entries: &[
            "quantize_mxfp4",
            "quantize_fp8_ue8m0",
            "dequantize_fp8",
            "dequantize_fp4",
        ],
    },
];

impl KernelSource {
    /// The text handed to NVRTC: the prelude, then the file.
    pub fn full(&self) -> String {
        format!("{PRELUDE}\n{}", self.src)
    }

    /// Looks a file up by name.
    pub fn find(name: &str) -> Option<&'static KernelSource> {
        SOURCES.iter().find(|k| k.name == name)
    }
}

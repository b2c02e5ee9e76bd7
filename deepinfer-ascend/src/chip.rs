//! Per-chip facts the planner needs: on-chip buffer sizes, core counts, alignment, compiler target.

/// The Ascend chips this crate plans for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Chip {
    /// Ascend 950 (DaVinci arch 3510): larger UB and L0C, native MX formats in the cube unit.
    Ascend950,
    /// Ascend 910B (DaVinci arch 2201).
    Ascend910B,
}

/// On-chip memory sizes and core counts of one chip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChipSpec {
    /// Which chip.
    pub chip: Chip,
    /// Value passed to the compiler as `--npu-arch`.
    pub npu_arch: &'static str,
    /// Unified buffer per vector core, bytes.
    pub ub_bytes: usize,
    /// L1 buffer per cube core, bytes.
    pub l1_bytes: usize,
    /// L0A (left matrix) buffer, bytes.
    pub l0a_bytes: usize,
    /// L0B (right matrix) buffer, bytes.
    pub l0b_bytes: usize,
    /// L0C (accumulator) buffer, bytes.
    pub l0c_bytes: usize,
    /// Cube cores (AIC), the block-dim limit for cube kernels.
    pub cube_cores: u32,
    /// Vector cores (AIV), the block-dim limit for vector kernels.
    pub vector_cores: u32,
    /// Whether the cube unit takes MXFP8 / MXFP4 operands with E8M0 scales natively.
    pub native_mx: bool,
}

/// Every DataCopy between global memory and UB moves whole 32-byte blocks.
pub const BLOCK_BYTES: usize = 32;

impl Chip {
    /// Both chips, for tests and tables.
    pub const ALL: [Chip; 2] = [Chip::Ascend950, Chip::Ascend910B];

    /// The chip's fact table.
    ///
    /// The 910B core counts are those of the 910B2/B3 parts (24 AIC, 48 AIV). The 950 core
    /// counts are an assumption (no public datasheet was available here); a host with a device
    /// should replace them with the queried counts through [`ChipSpec::with_cores`].
    pub const fn spec(self) -> ChipSpec {
        match self {
            Chip::Ascend950 => ChipSpec {
                chip: self,
                npu_arch: "dav-3510",
                ub_bytes: 248 * 1024,
                l1_bytes: 512 * 1024,
                l0a_bytes: 64 * 1024,
                l0b_bytes: 64 * 1024,
                l0c_bytes: 256 * 1024,
                cube_cores: 32,
                vector_cores: 64,
                native_mx: true,
            },
            Chip::Ascend910B => ChipSpec {
                chip: self,
                npu_arch: "dav-2201",
                ub_bytes: 192 * 1024,
                l1_bytes: 512 * 1024,
                l0a_bytes: 64 * 1024,
                l0b_bytes: 64 * 1024,
                l0c_bytes: 128 * 1024,
                cube_cores: 24,
                vector_cores: 48,
                native_mx: false,
            },
        }
    }

    /// Short name used in cache file names.
    pub const fn name(self) -> &'static str {
        match self {
            Chip::Ascend950 => "ascend950",
            Chip::Ascend910B => "ascend910b",
        }
    }
}

impl ChipSpec {
    /// The same chip with core counts queried from a real device.
    pub const fn with_cores(mut self, cube_cores: u32, vector_cores: u32) -> Self {
        self.cube_cores = cube_cores;
        self.vector_cores = vector_cores;
        self
    }
}

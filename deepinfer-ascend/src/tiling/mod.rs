//! Tiling planner: per-kernel `#[repr(C)]` tiling structs (the ABI shared with the `.asc`
//! sources), the unified-buffer budget, 32-byte alignment and the split over block dims.
//!
//! Every struct is a flat sequence of 4-byte fields, so its C mirror has the same layout on any
//! compiler; const assertions pin the size and every offset, and the source lint checks that the
//! C struct names the same fields in the same order with the same types.

use crate::chip::{BLOCK_BYTES, ChipSpec};
use crate::error::{AscendError, Result};

mod attention;
mod cube;
mod gemv;
mod hc_mix;
mod rmsnorm;
mod rope;
mod router;
mod sampling;

pub use attention::{AttentionShape, AttentionTiling};
pub use cube::{CubeGemvPlan, plan_cube_gemv};
pub use gemv::{GEMV_LUT_LEN, GemvFormat, GemvShape, GemvTiling, gemv_lut};
pub use hc_mix::{HcMixShape, HcMixTiling};
pub use rmsnorm::{RmsNormShape, RmsNormTiling};
pub use rope::{RopeShape, RopeTiling};
pub use router::{RouterShape, RouterTiling, ScoreFunc};
pub use sampling::{SamplingShape, SamplingTiling};

/// Depth of every double-buffered queue (`BUFFER_NUM` in the sources).
pub const BUFFER_NUM: u32 = 2;

/// Round `x` up to a multiple of `a` (a > 0).
pub const fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

/// Round a byte count up to whole 32-byte blocks.
pub const fn align32(bytes: usize) -> usize {
    align_up(bytes, BLOCK_BYTES)
}

/// C type of a tiling field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CType {
    /// `uint32_t`
    U32,
    /// `float`
    F32,
}

impl CType {
    /// The type as spelled in the `.asc` sources.
    pub const fn c_name(self) -> &'static str {
        match self {
            CType::U32 => "uint32_t",
            CType::F32 => "float",
        }
    }
}

/// What a field means, so the lint and the validator know which rules apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldRole {
    /// A plain parameter.
    Scalar,
    /// An element count that `DataCopy` may move: count × `elem_bytes` is a multiple of 32.
    AlignedCount {
        /// Size of one element in bytes.
        elem_bytes: u32,
    },
    /// A UB buffer size for `InitBuffer`, a multiple of 32 bytes.
    BufferBytes,
}

/// One field of a tiling struct as the ABI sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldAbi {
    /// Field name, identical in Rust and in the `.asc` struct.
    pub name: &'static str,
    /// Its C type.
    pub ty: CType,
    /// Byte offset in the struct.
    pub offset: usize,
    /// Its role.
    pub role: FieldRole,
}

/// A tiling struct shared with a kernel source.
pub trait TilingAbi: Copy {
    /// The struct name in the `.asc` source.
    const C_NAME: &'static str;
    /// Fields in declaration order.
    const FIELDS: &'static [FieldAbi];
    /// Value of field `i` as raw little-endian bits.
    fn field_bits(&self, i: usize) -> u32;

    /// Serialise the struct exactly as the device reads it.
    fn to_bytes(&self) -> Vec<u8> {
        (0..Self::FIELDS.len())
            .flat_map(|i| self.field_bits(i).to_le_bytes())
            .collect()
    }

    /// Check the role rules: aligned counts and buffer sizes are whole 32-byte blocks.
    fn validate(&self) -> Result<()> {
        for (i, f) in Self::FIELDS.iter().enumerate() {
            let v = self.field_bits(i) as usize;
            let ok = match f.role {
                FieldRole::Scalar => true,
                FieldRole::AlignedCount { elem_bytes } => {
                    (v * elem_bytes as usize).is_multiple_of(BLOCK_BYTES)
                }
                FieldRole::BufferBytes => v.is_multiple_of(BLOCK_BYTES) && v > 0,
            };
            if !ok {
                return Err(AscendError::Shape(format!(
                    "{}.{} = {v} breaks its {:?} rule",
                    Self::C_NAME,
                    f.name,
                    f.role
                )));
            }
        }
        Ok(())
    }
}

/// A kernel's tiling: its ABI plus the UB plan its `Init` allocates.
pub trait KernelTiling: TilingAbi {
    /// UB plan, in the order the kernel's `Init` allocates it.
    fn budget(&self) -> UbBudget;
}

/// Declare a tiling struct: `#[repr(C)]`, 4-byte fields, with const size/offset assertions and
/// its [`TilingAbi`] description.
macro_rules! tiling_struct {
    (
        $(#[$m:meta])*
        $name:ident {
            $( $(#[$fm:meta])* $field:ident : $ty:ident = $role:expr ),+ $(,)?
        }
    ) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy, PartialEq, Default)]
        pub struct $name {
            $( $(#[$fm])* pub $field: $ty, )+
        }

        impl $name {
            const FIELD_LIST: &'static [(&'static str, $crate::tiling::CType)] =
                &[$( (stringify!($field), tiling_struct!(@ctype $ty)) ),+];
        }

        // Compile-time ABI checks: no padding, each field at 4 × its index, 4-byte alignment.
        const _: () = {
            let mut i = 0;
            $(
                assert!(::core::mem::offset_of!($name, $field) == 4 * i);
                assert!(::core::mem::size_of::<$ty>() == 4);
                i += 1;
            )+
            assert!(::core::mem::size_of::<$name>() == 4 * i);
            assert!(::core::mem::align_of::<$name>() == 4);
            assert!(i == $name::FIELD_LIST.len());
        };

        impl $crate::tiling::TilingAbi for $name {
            const C_NAME: &'static str = stringify!($name);
            const FIELDS: &'static [$crate::tiling::FieldAbi] = &[$(
                $crate::tiling::FieldAbi {
                    name: stringify!($field),
                    ty: tiling_struct!(@ctype $ty),
                    offset: ::core::mem::offset_of!($name, $field),
                    role: $role,
                }
            ),+];

            fn field_bits(&self, i: usize) -> u32 {
                let all = [$( tiling_struct!(@bits self.$field, $ty) ),+];
                all[i]
            }
        }
    };
    (@ctype u32) => { $crate::tiling::CType::U32 };
    (@ctype f32) => { $crate::tiling::CType::F32 };
    (@bits $e:expr, u32) => { $e };
    (@bits $e:expr, f32) => { $e.to_bits() };
}
pub(crate) use tiling_struct;

/// How a kernel's work units are split over block dims (AI cores).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// Blocks launched.
    pub block_dim: u32,
    /// Units for every block but the last.
    pub per_block: u32,
    /// Units for the last block (1..=per_block).
    pub last: u32,
}

impl Partition {
    /// Split `units` over at most `max_blocks` blocks, each block's share a multiple of `align`
    /// units (except the last, which takes the remainder).
    pub fn new(units: usize, max_blocks: u32, align: usize) -> Result<Self> {
        if units == 0 {
            return Err(AscendError::Shape("nothing to split".into()));
        }
        let max_blocks = max_blocks.max(1) as usize;
        let per_block = align_up(units.div_ceil(max_blocks), align.max(1));
        let block_dim = units.div_ceil(per_block);
        let last = units - (block_dim - 1) * per_block;
        Ok(Self {
            block_dim: block_dim as u32,
            per_block: per_block as u32,
            last: last as u32,
        })
    }

    /// First unit and unit count of block `b`.
    pub fn range(&self, b: u32) -> (usize, usize) {
        let start = (b * self.per_block) as usize;
        let n = if b + 1 == self.block_dim {
            self.last
        } else {
            self.per_block
        };
        (start, n as usize)
    }
}

/// The unified-buffer plan of a kernel: queues × depth × bytes + temporary buffers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UbBudget {
    /// (name, buffer count, bytes per buffer) for every queue or TBuf.
    pub entries: Vec<(&'static str, u32, usize)>,
}

impl UbBudget {
    /// Add a queue of `depth` buffers of `bytes` each.
    pub fn queue(mut self, name: &'static str, depth: u32, bytes: usize) -> Self {
        self.entries.push((name, depth, bytes));
        self
    }

    /// Add a temporary (TBuf) of `bytes`.
    pub fn tmp(self, name: &'static str, bytes: usize) -> Self {
        self.queue(name, 1, bytes)
    }

    /// Total bytes.
    pub fn total(&self) -> usize {
        self.entries.iter().map(|&(_, d, b)| d as usize * b).sum()
    }

    /// Whether the plan fits the chip's UB and every buffer is 32-byte sized.
    pub fn check(&self, spec: &ChipSpec, what: &str) -> Result<()> {
        if let Some(&(name, _, b)) = self.entries.iter().find(|e| e.2 % BLOCK_BYTES != 0) {
            return Err(AscendError::Shape(format!(
                "{what}: buffer {name} of {b} bytes is not 32-byte aligned"
            )));
        }
        let need = self.total();
        if need > spec.ub_bytes {
            return Err(AscendError::Budget {
                buffer: "UB",
                need,
                have: spec.ub_bytes,
                what: what.to_string(),
            });
        }
        Ok(())
    }
}

/// Largest candidate (tried in the given order, largest first) whose budget fits.
pub(crate) fn pick_largest<T>(
    spec: &ChipSpec,
    what: &str,
    candidates: impl IntoIterator<Item = usize>,
    mut plan: impl FnMut(usize) -> Result<(T, UbBudget)>,
) -> Result<T> {
    let mut last_err = None;
    for c in candidates {
        let (t, budget) = plan(c)?;
        match budget.check(spec, what) {
            Ok(()) => return Ok(t),
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err.unwrap_or_else(|| AscendError::Shape(format!("{what}: no tile candidates"))))
}

/// Candidate tile lengths: `start`, then halving, all multiples of `align`, down to `align`.
pub(crate) fn halving(start: usize, align: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut c = align_up(start.max(1), align);
    loop {
        v.push(c);
        if c <= align {
            break;
        }
        c = align_up(c / 2, align);
    }
    v
}

/// u32 conversion with a shape error on overflow.
pub(crate) fn u32_of(x: usize, what: &str) -> Result<u32> {
    u32::try_from(x).map_err(|_| AscendError::Shape(format!("{what} = {x} exceeds u32")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_covers_units_once() {
        for units in [1usize, 7, 48, 49, 1000, 129_280] {
            for blocks in [1u32, 3, 24, 48, 64] {
                for align in [1usize, 8, 16] {
                    let p = Partition::new(units, blocks, align).unwrap();
                    assert!(p.block_dim <= blocks);
                    assert!(p.last >= 1 && p.last <= p.per_block);
                    let total: usize = (0..p.block_dim).map(|b| p.range(b).1).sum();
                    assert_eq!(total, units);
                }
            }
        }
    }

    #[test]
    fn halving_ends_at_alignment() {
        assert_eq!(halving(100, 32), vec![128, 64, 32]);
        assert_eq!(halving(1, 16), vec![16]);
    }
}

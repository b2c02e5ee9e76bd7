//! Typed weight loading: every tensor the graph needs is requested by canonical name and
//! expected shape; stored dtypes are decoded to f32 (zero-copy when the file already holds
//! aligned little-endian f32). Problems are collected, not raised one by one, so a bad
//! checkpoint reports every missing, unexpected, mis-shaped or mis-typed tensor at once.

use crate::checkpoint::{Checkpoint, MappedBytes, RawTensor};
use crate::names::{FUSED_DOWN, FUSED_GATE_UP};
use crate::quant;
use safetensors::Dtype;
use std::collections::{BTreeSet, HashMap};
use std::fmt;

/// An f32 tensor, either borrowed from the file mapping or owned (decoded).
#[derive(Clone)]
pub struct Tensor {
    /// Row-major shape.
    pub shape: Vec<usize>,
    data: TensorData,
}

#[derive(Clone)]
enum TensorData {
    Mapped(MappedBytes),
    Owned(Vec<f32>),
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.data {
            TensorData::Mapped(_) => "mapped",
            TensorData::Owned(_) => "owned",
        };
        write!(f, "Tensor({:?}, {kind})", self.shape)
    }
}

impl Tensor {
    /// An owned tensor; `data.len()` must equal the product of `shape`.
    pub fn from_vec(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Tensor {
            shape,
            data: TensorData::Owned(data),
        }
    }

    fn empty(shape: &[usize]) -> Self {
        Tensor::from_vec(shape.to_vec(), vec![0.0; shape.iter().product()])
    }

    /// The values, row-major.
    pub fn data(&self) -> &[f32] {
        match &self.data {
            // Alignment and length were checked when the tensor was created.
            TensorData::Mapped(m) => bytemuck::cast_slice(m.bytes()),
            TensorData::Owned(v) => v,
        }
    }

    /// Whether the values are read straight from the mapped file.
    pub fn is_zero_copy(&self) -> bool {
        matches!(self.data, TensorData::Mapped(_))
    }

    /// Number of rows of a 2-D tensor (the first dimension).
    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Row `r` of a tensor viewed as `[rows, rest]`.
    pub fn row(&self, r: usize) -> &[f32] {
        let cols = self.shape[1..].iter().product::<usize>();
        &self.data()[r * cols..(r + 1) * cols]
    }
}

/// One thing wrong with a checkpoint's tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WeightProblem {
    /// The graph needs this tensor and the checkpoint lacks it.
    Missing {
        /// Canonical name.
        name: String,
        /// Shape the graph expects.
        expected: Vec<usize>,
    },
    /// Stored with another shape.
    Shape {
        /// Canonical name.
        name: String,
        /// Shape the graph expects.
        expected: Vec<usize>,
        /// Shape in the file.
        found: Vec<usize>,
    },
    /// Stored with a dtype the graph cannot use for it (or its scales are missing).
    Dtype {
        /// Canonical name.
        name: String,
        /// Stored dtype.
        found: String,
        /// What was expected.
        expected: String,
    },
    /// Present in the checkpoint, used by nothing.
    Unexpected {
        /// Canonical name.
        name: String,
    },
}

impl fmt::Display for WeightProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WeightProblem::Missing { name, expected } => write!(f, "missing `{name}` {expected:?}"),
            WeightProblem::Shape {
                name,
                expected,
                found,
            } => {
                write!(f, "`{name}` has shape {found:?}, expected {expected:?}")
            }
            WeightProblem::Dtype {
                name,
                found,
                expected,
            } => {
                write!(f, "`{name}` is stored as {found}, expected {expected}")
            }
            WeightProblem::Unexpected { name } => write!(f, "unexpected tensor `{name}`"),
        }
    }
}

/// All problems of a checkpoint, reported together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightProblems(pub Vec<WeightProblem>);

impl fmt::Display for WeightProblems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} tensor problem(s): ", self.0.len())?;
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, "; ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for WeightProblems {}

/// The part of a published checkpoint that `name` belongs to, when it is one the engine does
/// not run: the vision tower and its aligner, image embeddings, the vision-language router
/// bias, and multi-token-prediction layers the model does not use (V4's `mtp.*`; V4.1's
/// drafter tensors are used and never reach this). Such tensors are skipped on load and
/// listed; any other tensor the graph does not use is an error (a checkpoint the engine does
/// not understand).
pub fn unused_part(name: &str) -> Option<&'static str> {
    let last = name.rsplit('.').next().unwrap_or(name);
    if name.starts_with("vision") || name.starts_with("visual.") || name.contains(".vision") {
        Some("vision tower")
    } else if name.starts_with("aligner.") {
        Some("vision aligner")
    } else if name.starts_with("image_") || name.contains(".image_") {
        Some("image embeddings")
    } else if last == "bias_vl" || name.ends_with(".bias_vl.scale") {
        Some("vision-language router bias")
    } else if name.starts_with("mtp.") {
        Some("multi-token prediction")
    } else {
        None
    }
}

/// Requests tensors from a checkpoint by name and shape, collecting problems.
pub struct WeightLoader<'a> {
    ck: &'a Checkpoint,
    fp8_block: Option<[usize; 2]>,
    used: BTreeSet<String>,
    problems: Vec<WeightProblem>,
    fused: HashMap<String, Option<Tensor>>,
}

impl<'a> WeightLoader<'a> {
    /// Start loading from `ck`.
    pub fn new(ck: &'a Checkpoint) -> Self {
        WeightLoader {
            ck,
            fp8_block: None,
            used: BTreeSet::new(),
            problems: Vec::new(),
            fused: HashMap::new(),
        }
    }

    /// Decode FP8 weights with scales over `[rows, cols]` blocks (the config's
    /// `quantization_config.weight_block_size`) instead of inferring the blocks from each
    /// scale's shape; a scale whose shape does not fit is then a problem.
    pub fn with_fp8_block(mut self, block: Option<[usize; 2]>) -> Self {
        self.fp8_block = block;
        self
    }

    /// The stored dtype of `name`, if the checkpoint holds it.
    pub fn stored_dtype(&self, name: &str) -> Option<Dtype> {
        self.ck.get(name).map(|r| r.dtype)
    }

    /// The stored dtype of routed expert matrix `which` of expert `e` (unfused or HF fused).
    pub fn expert_stored_dtype(&self, prefix: &str, e: usize, which: &str) -> Option<Dtype> {
        let layer = prefix.trim_end_matches(".ffn");
        let fused = match which {
            "w2" => format!("{layer}.{FUSED_DOWN}"),
            _ => format!("{layer}.{FUSED_GATE_UP}"),
        };
        self.stored_dtype(&format!("{prefix}.experts.{e}.{which}.weight"))
            .or_else(|| self.stored_dtype(&fused))
    }

    /// Whether the checkpoint holds `name` (for optional tensors).
    pub fn has(&self, name: &str) -> bool {
        self.ck.get(name).is_some()
    }

    /// A float tensor of the given shape, decoded to f32. On a problem, records it and
    /// returns zeros so loading can continue and report everything.
    pub fn f32(&mut self, name: &str, shape: &[usize]) -> Tensor {
        match self.ck.get(name) {
            None => {
                self.problems.push(WeightProblem::Missing {
                    name: name.into(),
                    expected: shape.to_vec(),
                });
                Tensor::empty(shape)
            }
            Some(raw) => {
                self.used.insert(name.to_string());
                match self.decode(name, raw, shape) {
                    Ok(t) => t,
                    Err(p) => {
                        self.problems.push(p);
                        Tensor::empty(shape)
                    }
                }
            }
        }
    }

    /// `name`'s stored bytes when a backend can hold them as they are: stored as F32, BF16 or
    /// F16 with exactly `shape`. Marks the tensor used. `None` (nothing recorded) when it must
    /// be decoded instead ([`WeightLoader::f32`] then reports any problem).
    pub fn stored_as_is(
        &mut self,
        name: &str,
        shape: &[usize],
    ) -> Option<(
        deepinfer_kernels::SharedBytes,
        usize,
        deepinfer_kernels::DType,
    )> {
        use deepinfer_kernels::DType as K;
        let raw = self.ck.get(name)?;
        let dtype = match raw.dtype {
            Dtype::F32 => K::F32,
            Dtype::BF16 => K::BF16,
            Dtype::F16 => K::F16,
            _ => return None,
        };
        if raw.shape != shape {
            return None;
        }
        self.used.insert(name.to_string());
        let (bytes, start) = self.ck.bytes(raw).shared();
        Some((bytes, start, dtype))
    }

    /// A stored FP8 e4m3 matrix with its block scales (UE8M0 or f32), or FP4 e2m1 pairs with
    /// per-32 UE8M0 scales along each row, as the kernels' quantised matrix (codes and scales
    /// copied as stored, nothing decoded). `None` when `name` is not stored so or its scale
    /// does not tile it in a layout the kernels read; [`WeightLoader::f32`] then decodes it
    /// (and reports what is wrong).
    pub fn stored_quant(
        &mut self,
        name: &str,
        shape: &[usize],
    ) -> Option<deepinfer_kernels::QuantMatrix> {
        use deepinfer_kernels::{QuantFormat, QuantMatrix, ScaleFormat};
        let raw = self.ck.get(name)?;
        let rows: usize = shape[..shape.len().saturating_sub(1)].iter().product();
        let cols = *shape.last()?;
        let base = name.strip_suffix(".weight").unwrap_or(name);
        let sname = format!("{base}.scale");
        let sraw = self.ck.get(&sname)?;
        let (sr, sc) = match sraw.shape.as_slice() {
            [r, c] => (*r, *c),
            [c] => (1, *c),
            _ => return None,
        };
        if sr == 0 || sc == 0 {
            return None;
        }
        let scale_bytes = self.ck.bytes(sraw).bytes().to_vec();
        let ue8m0 = matches!(sraw.dtype, Dtype::F8_E8M0 | Dtype::U8);
        let codes = self.ck.bytes(raw).bytes().to_vec();
        let q = match raw.dtype {
            Dtype::F8_E4M3 if raw.shape == shape => {
                let (br, bc) = match self.fp8_block {
                    Some([br, bc]) => (br, bc),
                    None => (rows.div_ceil(sr), cols.div_ceil(sc)),
                };
                if br == 0 || bc == 0 || rows.div_ceil(br) != sr || cols.div_ceil(bc) != sc {
                    return None;
                }
                let (scale, f32s, bytes) = match sraw.dtype {
                    _ if ue8m0 => (ScaleFormat::Ue8m0, None, Some(scale_bytes)),
                    Dtype::F32 => {
                        let v = scale_bytes
                            .chunks_exact(4)
                            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                            .collect();
                        (ScaleFormat::F32, Some(v), None)
                    }
                    _ => return None,
                };
                let format = QuantFormat::Fp8 {
                    block_rows: br,
                    block_cols: bc,
                    scale,
                };
                QuantMatrix::from_parts(format, rows, cols, codes, f32s, bytes, 1.0).ok()?
            }
            Dtype::I8 | Dtype::U8 => {
                let packed = raw.shape.len() == shape.len()
                    && raw.shape[..raw.shape.len() - 1] == shape[..shape.len() - 1]
                    && raw.shape.last().map(|&x| x * 2) == Some(cols);
                if !packed || !ue8m0 || !cols.is_multiple_of(32) || (sr, sc) != (rows, cols / 32) {
                    return None;
                }
                QuantMatrix::from_parts(
                    QuantFormat::Mxfp4,
                    rows,
                    cols,
                    codes,
                    None,
                    Some(scale_bytes),
                    1.0,
                )
                .ok()?
            }
            _ => return None,
        };
        self.used.insert(name.to_string());
        self.used.insert(sname);
        Some(q)
    }

    /// An integer table (e.g. `tid2eid`), stored as i32, i64 or u8..u32, as i64 values.
    pub fn ints(&mut self, name: &str, shape: &[usize]) -> Vec<i64> {
        let n: usize = shape.iter().product();
        let Some(raw) = self.ck.get(name) else {
            self.problems.push(WeightProblem::Missing {
                name: name.into(),
                expected: shape.to_vec(),
            });
            return vec![0; n];
        };
        self.used.insert(name.to_string());
        if raw.shape != shape {
            self.problems.push(WeightProblem::Shape {
                name: name.into(),
                expected: shape.to_vec(),
                found: raw.shape.clone(),
            });
            return vec![0; n];
        }
        let b = self.ck.bytes(raw);
        let bytes = b.bytes();
        match raw.dtype {
            Dtype::I64 => bytes
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect(),
            Dtype::I32 => bytes
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as i64)
                .collect(),
            Dtype::U8 => bytes.iter().map(|&x| x as i64).collect(),
            other => {
                self.problems.push(WeightProblem::Dtype {
                    name: name.into(),
                    found: format!("{other:?}"),
                    expected: "an integer dtype (I32, I64)".into(),
                });
                vec![0; n]
            }
        }
    }

    /// Routed expert matrix `which` (`w1`, `w2`, `w3`) of expert `e` under `prefix`
    /// (e.g. `layers.3.ffn`), from DeepSeek's unfused tensors or HF's fused ones.
    pub fn expert(&mut self, prefix: &str, e: usize, which: &str, shape: &[usize]) -> Tensor {
        let unfused = format!("{prefix}.experts.{e}.{which}.weight");
        let layer = prefix.trim_end_matches(".ffn");
        let fused_name = match which {
            "w2" => format!("{layer}.{FUSED_DOWN}"),
            _ => format!("{layer}.{FUSED_GATE_UP}"),
        };
        if self.ck.get(&unfused).is_some() || self.ck.get(&fused_name).is_none() {
            return self.f32(&unfused, shape);
        }
        let (rows, cols) = (shape[0], shape[1]);
        if !self.fused.contains_key(&fused_name) {
            let raw = self
                .ck
                .get(&fused_name)
                .map(|r| r.shape.clone())
                .unwrap_or_default();
            let e_count = raw.first().copied().unwrap_or(0);
            let per = if which == "w2" { rows } else { 2 * rows };
            let t = if raw.len() == 3 && raw[1] == per && raw[2] == cols {
                Some(self.f32(&fused_name, &[e_count, per, cols]))
            } else {
                self.used.insert(fused_name.clone());
                self.problems.push(WeightProblem::Shape {
                    name: fused_name.clone(),
                    expected: vec![e_count, per, cols],
                    found: raw,
                });
                None
            };
            self.fused.insert(fused_name.clone(), t);
        }
        let Some(Some(t)) = self.fused.get(&fused_name) else {
            return Tensor::empty(shape);
        };
        if e >= t.shape[0] {
            self.problems.push(WeightProblem::Missing {
                name: unfused,
                expected: shape.to_vec(),
            });
            return Tensor::empty(shape);
        }
        let per = t.shape[1];
        let off = match which {
            "w3" => rows,
            _ => 0,
        };
        let start = (e * per + off) * cols;
        Tensor::from_vec(
            shape.to_vec(),
            t.data()[start..start + rows * cols].to_vec(),
        )
    }

    /// Finish: every stored tensor not requested is reported as unexpected; all problems are
    /// returned together.
    pub fn finish(mut self) -> Result<Vec<String>, WeightProblems> {
        let mut skipped = Vec::new();
        for name in self.ck.names() {
            if self.used.contains(name) {
                continue;
            }
            if unused_part(name).is_some() {
                skipped.push(name.to_string());
            } else {
                self.problems
                    .push(WeightProblem::Unexpected { name: name.into() });
            }
        }
        if self.problems.is_empty() {
            skipped.sort();
            Ok(skipped)
        } else {
            Err(WeightProblems(self.problems))
        }
    }

    fn scale_of(&mut self, name: &str) -> Option<(Vec<f32>, Vec<usize>)> {
        let base = name.strip_suffix(".weight").unwrap_or(name);
        let sname = format!("{base}.scale");
        let raw = self.ck.get(&sname)?;
        self.used.insert(sname.clone());
        let b = self.ck.bytes(raw);
        let bytes = b.bytes();
        let vals: Vec<f32> = match raw.dtype {
            Dtype::F8_E8M0 | Dtype::U8 => bytes.iter().map(|&x| quant::ue8m0_to_f32(x)).collect(),
            Dtype::F8_E4M3 => bytes.iter().map(|&x| quant::e4m3_to_f32(x)).collect(),
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap_or([0; 4])))
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            _ => return None,
        };
        Some((vals, raw.shape.clone()))
    }

    fn decode(
        &mut self,
        name: &str,
        raw: &RawTensor,
        shape: &[usize],
    ) -> Result<Tensor, WeightProblem> {
        let shape_err = || WeightProblem::Shape {
            name: name.into(),
            expected: shape.to_vec(),
            found: raw.shape.clone(),
        };
        let dtype_err = |expected: &str| WeightProblem::Dtype {
            name: name.into(),
            found: format!("{:?}", raw.dtype),
            expected: expected.into(),
        };
        let bytes = self.ck.bytes(raw);
        match raw.dtype {
            Dtype::F32 => {
                if raw.shape != shape {
                    return Err(shape_err());
                }
                let b = bytes.bytes();
                if cfg!(target_endian = "little") && bytemuck::try_cast_slice::<u8, f32>(b).is_ok()
                {
                    Ok(Tensor {
                        shape: shape.to_vec(),
                        data: TensorData::Mapped(bytes),
                    })
                } else {
                    let v = b
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                    Ok(Tensor::from_vec(shape.to_vec(), v))
                }
            }
            Dtype::BF16 | Dtype::F16 => {
                if raw.shape != shape {
                    return Err(shape_err());
                }
                let bf = raw.dtype == Dtype::BF16;
                let v = bytes
                    .bytes()
                    .chunks_exact(2)
                    .map(|c| {
                        if bf {
                            half::bf16::from_le_bytes([c[0], c[1]]).to_f32()
                        } else {
                            half::f16::from_le_bytes([c[0], c[1]]).to_f32()
                        }
                    })
                    .collect();
                Ok(Tensor::from_vec(shape.to_vec(), v))
            }
            Dtype::F8_E4M3 => {
                if raw.shape != shape {
                    return Err(shape_err());
                }
                let mut v: Vec<f32> = bytes
                    .bytes()
                    .iter()
                    .map(|&x| quant::e4m3_to_f32(x))
                    .collect();
                self.apply_scales(name, &mut v, shape, self.fp8_block, &dtype_err)?;
                Ok(Tensor::from_vec(shape.to_vec(), v))
            }
            // FP4 e2m1: packed pairs as bytes ([.., in/2]) or the F4 dtype ([.., in]).
            Dtype::I8 | Dtype::U8 | Dtype::F4 => {
                let packed_ok = match raw.dtype {
                    Dtype::F4 => raw.shape == shape,
                    _ => {
                        raw.shape.len() == shape.len()
                            && raw.shape[..raw.shape.len() - 1] == shape[..shape.len() - 1]
                            && raw.shape.last().map(|&x| x * 2) == shape.last().copied()
                    }
                };
                if !packed_ok {
                    return Err(shape_err());
                }
                let n: usize = shape.iter().product();
                let mut v = vec![0.0f32; n];
                quant::unpack_e2m1(bytes.bytes(), &mut v);
                self.apply_scales(name, &mut v, shape, None, &dtype_err)?;
                Ok(Tensor::from_vec(shape.to_vec(), v))
            }
            _ => Err(dtype_err(
                "F32, BF16, F16, F8_E4M3 (+scale) or FP4 (+scale)",
            )),
        }
    }

    fn apply_scales(
        &mut self,
        name: &str,
        v: &mut [f32],
        shape: &[usize],
        block: Option<[usize; 2]>,
        dtype_err: &dyn Fn(&str) -> WeightProblem,
    ) -> Result<(), WeightProblem> {
        let (scales, sshape) = self
            .scale_of(name)
            .ok_or_else(|| dtype_err("a quantised weight with a `.scale` tensor"))?;
        let rows = shape[..shape.len() - 1].iter().product::<usize>();
        let cols = *shape.last().unwrap_or(&1);
        let (sr, sc) = match sshape.len() {
            2 => (sshape[0], sshape[1]),
            1 => (1, sshape[0]),
            _ => return Err(dtype_err("a 1-D or 2-D block scale")),
        };
        if sr == 0 || sc == 0 || scales.len() != sr * sc {
            return Err(dtype_err("a non-empty block scale"));
        }
        let (br, bc) = match block {
            Some([br, bc]) => {
                if rows.div_ceil(br) != sr || cols.div_ceil(bc) != sc {
                    return Err(dtype_err(&format!(
                        "a [{}, {}] block scale for weight_block_size [{br}, {bc}]",
                        rows.div_ceil(br),
                        cols.div_ceil(bc)
                    )));
                }
                (br, bc)
            }
            None => (rows.div_ceil(sr), cols.div_ceil(sc)),
        };
        if rows.div_ceil(br) != sr || cols.div_ceil(bc) != sc {
            return Err(dtype_err("a block scale whose shape tiles the weight"));
        }
        quant::apply_block_scales(v, rows, cols, &scales, br, bc);
        Ok(())
    }
}

//! Source lint for the `.asc` kernels: catches the mistakes that fail silently on a device.
//!
//! Rules:
//! - [`Rule::BufferInit`]: every `TQue` / `TBuf` is initialised exactly once, with the depth of
//!   its declaration, and no undeclared buffer is initialised.
//! - [`Rule::BufferSize`]: the `InitBuffer` calls name the same buffers, in the same order, with
//!   the same depths and byte sizes as the Rust tiling's UB plan; sizes come from tiling fields.
//! - [`Rule::TilingAbi`]: the C tiling struct has the Rust struct's fields, in order, same types.
//! - [`Rule::Constant`]: `BUFFER_NUM`, `MX_BLOCK`, `BLOCK_BYTES` equal the Rust constants.
//! - [`Rule::VectorEntry`]: one entry point named as registered, declared vector-only.
//! - [`Rule::CastRounding`]: casts to bf16/f16/fp8/fp4 round to nearest (`CAST_RINT` or
//!   `CAST_ROUND`), never `CAST_NONE` or truncation.
//! - [`Rule::DataCopyAlign`]: a `DataCopy` element count is provably whole 32-byte blocks: a
//!   tiling field the planner aligns for that element size (optionally times something), an
//!   aligned literal, or block-unit `DataCopyParams`. Anything else must use `DataCopyPad`.

use std::collections::HashMap;

use crate::chip::BLOCK_BYTES;
use crate::error::AscendError;
use crate::kernels::{KernelKind, KernelSource, expand};
use crate::mx::MX_BLOCK;
use crate::tiling::{BUFFER_NUM, CType, FieldRole, KernelTiling};

/// Lint rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Queue/buffer declared but not initialised exactly once (or depth mismatch).
    BufferInit,
    /// InitBuffer sizes or order differ from the Rust UB plan.
    BufferSize,
    /// C tiling struct differs from the Rust one.
    TilingAbi,
    /// A shared constant differs from Rust.
    Constant,
    /// Entry point missing, misnamed or not declared vector-only.
    VectorEntry,
    /// Narrowing float cast without round-to-nearest.
    CastRounding,
    /// DataCopy count not provably a multiple of 32 bytes.
    DataCopyAlign,
    /// The Rust planner could not plan the sample shape.
    Planner,
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LintIssue {
    /// Kernel file.
    pub file: String,
    /// Rule broken.
    pub rule: Rule,
    /// What and where.
    pub message: String,
}

impl LintIssue {
    fn new(p: &ParsedSource, rule: Rule, message: impl Into<String>) -> Self {
        Self {
            file: p.file.clone(),
            rule,
            message: message.into(),
        }
    }

    /// The planner failed on the sample shape used for the size checks.
    pub fn planner(p: &ParsedSource, e: AscendError) -> Self {
        Self::new(p, Rule::Planner, e.to_string())
    }
}

impl std::fmt::Display for LintIssue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {:?}: {}", self.file, self.rule, self.message)
    }
}

/// A declared queue or buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferDecl {
    /// Variable name.
    pub name: String,
    /// Queue depth (1 for TBuf).
    pub depth: u32,
}

/// One `pipe.InitBuffer(...)` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitCall {
    /// Buffer name.
    pub name: String,
    /// Depth argument (1 for the two-argument TBuf form), if it resolves to a number.
    pub depth: Option<u32>,
    /// Size argument, as written.
    pub size: String,
}

/// What the lint extracts from a source (comments stripped, `common.h` expanded).
#[derive(Debug, Clone, Default)]
pub struct ParsedSource {
    /// File name.
    pub file: String,
    /// `constexpr` integer constants.
    pub constants: HashMap<String, i64>,
    /// Struct name → fields `(type, name)` in order.
    pub structs: HashMap<String, Vec<(String, String)>>,
    /// Declared queues and buffers.
    pub buffers: Vec<BufferDecl>,
    /// InitBuffer calls in order.
    pub inits: Vec<InitCall>,
    /// Tensor variable name → element types it is declared with.
    pub tensor_types: HashMap<String, Vec<String>>,
    /// `Cast(...)` argument lists.
    pub casts: Vec<Vec<String>>,
    /// `DataCopy(...)` argument lists.
    pub copies: Vec<Vec<String>>,
    /// Names declared as `DataCopyParams`.
    pub copy_params: Vec<String>,
    /// Entry points: (name, body).
    pub entries: Vec<(String, String)>,
}

/// Remove `//` and `/* */` comments (string literals in kernels hold no comment markers).
fn strip_comments(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else {
            let ch = s[i..].chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// Arguments of the call whose `(` is at `open`, split at top-level commas.
fn call_args(s: &str, open: usize) -> Option<Vec<String>> {
    let mut depth = 0i32;
    let mut args = Vec::new();
    let mut cur = String::new();
    for ch in s[open..].chars() {
        match ch {
            '(' | '[' | '{' => {
                if depth > 0 {
                    cur.push(ch);
                }
                depth += 1;
            }
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    args.push(cur.trim().to_string());
                    return Some(args);
                }
                cur.push(ch);
            }
            ',' if depth == 1 => {
                args.push(cur.trim().to_string());
                cur.clear();
            }
            _ => cur.push(ch),
        }
    }
    None
}

/// Positions of the `(` of every `name(` where `name` is a whole identifier.
fn find_calls(s: &str, name: &str) -> Vec<usize> {
    let pat = format!("{name}(");
    let b = s.as_bytes();
    s.match_indices(&pat)
        .filter(|&(i, _)| i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        .map(|(i, _)| i + name.len())
        .collect()
}

fn is_ident(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

/// Base variable of an expression like `xLocal[j * d]` or `xLocal[i].ReinterpretCast<T>()`.
fn base_name(expr: &str) -> &str {
    let end = expr.find(['[', '.', ' ', '(']).unwrap_or(expr.len());
    &expr[..end]
}

/// Parse a source (after `common.h` expansion).
pub fn parse(file: &str, text: &str) -> ParsedSource {
    let s = strip_comments(&expand(text));
    let mut p = ParsedSource {
        file: file.to_string(),
        ..Default::default()
    };
    // constexpr TYPE NAME = VALUE;
    for (i, _) in s.match_indices("constexpr ") {
        let stmt = &s[i..s[i..].find(';').map_or(s.len(), |e| i + e)];
        let words: Vec<&str> = stmt.split_whitespace().collect();
        if words.len() == 5
            && words[3] == "="
            && let Ok(v) = words[4].trim_end_matches(['u', 'U']).parse::<i64>()
        {
            p.constants.insert(words[2].to_string(), v);
        }
    }
    // struct NAME { TYPE FIELD; ... };
    for (i, _) in s.match_indices("struct ") {
        let rest = &s[i + 7..];
        let Some(brace) = rest.find('{') else {
            continue;
        };
        let name = rest[..brace].trim();
        if !is_ident(name) {
            continue;
        }
        let Some(close) = rest[brace..].find('}') else {
            continue;
        };
        let body = &rest[brace + 1..brace + close];
        let fields = body
            .split(';')
            .filter_map(|f| {
                let w: Vec<&str> = f.split_whitespace().collect();
                (w.len() == 2).then(|| (w[0].to_string(), w[1].to_string()))
            })
            .collect();
        p.structs.insert(name.to_string(), fields);
    }
    // TQue<POS, DEPTH> NAME;  TBuf<POS> NAME;
    for kw in ["TQue<", "TBuf<"] {
        for (i, _) in s.match_indices(kw) {
            let rest = &s[i + kw.len()..];
            let Some(gt) = rest.find('>') else { continue };
            let targs: Vec<&str> = rest[..gt].split(',').map(str::trim).collect();
            let after = &rest[gt + 1..];
            let Some(semi) = after.find(';') else {
                continue;
            };
            let name = after[..semi].trim();
            if !is_ident(name) {
                continue;
            }
            let depth = if kw == "TBuf<" {
                Some(1)
            } else {
                targs.get(1).and_then(|d| resolve(&p.constants, d))
            };
            p.buffers.push(BufferDecl {
                name: name.to_string(),
                depth: depth.unwrap_or(0),
            });
        }
    }
    for open in find_calls(&s, "InitBuffer") {
        if let Some(a) = call_args(&s, open) {
            let (depth, size) = match a.len() {
                2 => (Some(1), a[1].clone()),
                3 => (resolve(&p.constants, &a[1]), a[2].clone()),
                _ => (None, String::new()),
            };
            p.inits.push(InitCall {
                name: a.first().cloned().unwrap_or_default(),
                depth,
                size,
            });
        }
    }
    for kw in ["LocalTensor<", "GlobalTensor<"] {
        for (i, _) in s.match_indices(kw) {
            let rest = &s[i + kw.len()..];
            let Some(gt) = rest.find('>') else { continue };
            let ty = rest[..gt].trim().to_string();
            let after = rest[gt + 1..].trim_start();
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            let name = &after[..end];
            if is_ident(name) {
                let e = p.tensor_types.entry(name.to_string()).or_default();
                if !e.contains(&ty) {
                    e.push(ty);
                }
            }
        }
    }
    for (i, _) in s.match_indices("DataCopyParams ") {
        let rest = &s[i + 15..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        p.copy_params.push(rest[..end].to_string());
    }
    for open in find_calls(&s, "Cast") {
        if let Some(a) = call_args(&s, open) {
            p.casts.push(a);
        }
    }
    for open in find_calls(&s, "DataCopy") {
        if let Some(a) = call_args(&s, open) {
            p.copies.push(a);
        }
    }
    for (i, _) in s.match_indices("__global__ __aicore__ void ") {
        let rest = &s[i + 27..];
        let Some(paren) = rest.find('(') else {
            continue;
        };
        let name = rest[..paren].trim().to_string();
        let body_start = rest.find('{').unwrap_or(rest.len());
        let mut depth = 0;
        let mut end = rest.len();
        for (j, ch) in rest[body_start..].char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = body_start + j;
                        break;
                    }
                }
                _ => {}
            }
        }
        p.entries.push((name, rest[body_start..end].to_string()));
    }
    p
}

fn resolve(consts: &HashMap<String, i64>, s: &str) -> Option<u32> {
    s.trim()
        .parse::<u32>()
        .ok()
        .or_else(|| consts.get(s.trim()).and_then(|&v| u32::try_from(v).ok()))
}

fn elem_bytes(ty: &str) -> Option<u32> {
    Some(match ty {
        "float" | "int32_t" | "uint32_t" => 4,
        "bfloat16_t" | "half" | "int16_t" | "uint16_t" => 2,
        "uint8_t" | "int8_t" | "fp8_e4m3fn_t" | "fp8_e5m2_t" | "hifloat8_t" => 1,
        _ => return None,
    })
}

const NARROW_FLOATS: [&str; 6] = [
    "bfloat16_t",
    "half",
    "fp8_e4m3fn_t",
    "fp8_e5m2_t",
    "hifloat8_t",
    "fp4x2_e2m1_t",
];

/// Lint one registered kernel as shipped.
pub fn lint(k: &KernelSource) -> Vec<LintIssue> {
    lint_text(k, k.source)
}

/// Lint `text` as if it were kernel `k`'s source (used to test the lint on mutated sources).
pub fn lint_text(k: &KernelSource, text: &str) -> Vec<LintIssue> {
    let p = parse(k.file, text);
    let mut out = Vec::new();
    // Constants shared with Rust.
    for (name, want) in [
        ("BUFFER_NUM", BUFFER_NUM as i64),
        ("MX_BLOCK", MX_BLOCK as i64),
        ("BLOCK_BYTES", BLOCK_BYTES as i64),
    ] {
        match p.constants.get(name) {
            Some(&v) if v == want => {}
            Some(&v) => out.push(LintIssue::new(
                &p,
                Rule::Constant,
                format!("{name} = {v}, Rust has {want}"),
            )),
            None => out.push(LintIssue::new(
                &p,
                Rule::Constant,
                format!("{name} not defined"),
            )),
        }
    }
    // Buffers: declared ones initialised exactly once with their declared depth.
    for b in &p.buffers {
        let inits: Vec<&InitCall> = p.inits.iter().filter(|c| c.name == b.name).collect();
        if inits.len() != 1 {
            out.push(LintIssue::new(
                &p,
                Rule::BufferInit,
                format!("{} initialised {} times", b.name, inits.len()),
            ));
        } else if inits[0].depth != Some(b.depth) {
            out.push(LintIssue::new(
                &p,
                Rule::BufferInit,
                format!(
                    "{} declared with depth {} but initialised with {:?}",
                    b.name, b.depth, inits[0].depth
                ),
            ));
        }
    }
    for c in &p.inits {
        if !p.buffers.iter().any(|b| b.name == c.name) {
            out.push(LintIssue::new(
                &p,
                Rule::BufferInit,
                format!("InitBuffer on undeclared {}", c.name),
            ));
        }
    }
    // Entry point.
    let entries: Vec<&(String, String)> = p.entries.iter().collect();
    if entries.len() != 1 || entries[0].0 != k.name {
        out.push(LintIssue::new(
            &p,
            Rule::VectorEntry,
            format!(
                "expected one entry `{}`, found {:?}",
                k.name,
                entries.iter().map(|e| &e.0).collect::<Vec<_>>()
            ),
        ));
    }
    if k.kind == KernelKind::Vector {
        for (name, body) in &entries {
            if !body
                .replace(' ', "")
                .contains("KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY)")
            {
                out.push(LintIssue::new(
                    &p,
                    Rule::VectorEntry,
                    format!("{name} is not declared KERNEL_TYPE_AIV_ONLY"),
                ));
            }
        }
    }
    // Casts to narrow floats must round to nearest.
    for a in &p.casts {
        if a.len() != 4 {
            continue;
        }
        let dst = base_name(&a[0]);
        let tys = p.tensor_types.get(dst).cloned().unwrap_or_default();
        if tys.is_empty() {
            out.push(LintIssue::new(
                &p,
                Rule::CastRounding,
                format!("Cast destination {dst} has no declared type"),
            ));
            continue;
        }
        if tys.iter().any(|t| NARROW_FLOATS.contains(&t.as_str())) {
            let mode = a[2].rsplit("::").next().unwrap_or("");
            if mode != "CAST_RINT" && mode != "CAST_ROUND" {
                out.push(LintIssue::new(
                    &p,
                    Rule::CastRounding,
                    format!(
                        "Cast to {dst} ({}) uses {mode}, not round-to-nearest",
                        tys.join("/")
                    ),
                ));
            }
        }
    }
    // DataCopy counts.
    for a in &p.copies {
        if a.len() != 3 {
            continue;
        }
        let count = a[2].as_str();
        if p.copy_params.iter().any(|n| n == count) || count.starts_with("DataCopyParams") {
            continue;
        }
        let mut sizes: Vec<u32> = Vec::new();
        for side in [&a[0], &a[1]] {
            if let Some(tys) = p.tensor_types.get(base_name(side)) {
                sizes.extend(tys.iter().filter_map(|t| elem_bytes(t)));
            }
        }
        let Some(&e) = sizes.iter().min() else {
            out.push(LintIssue::new(
                &p,
                Rule::DataCopyAlign,
                format!("DataCopy({}) has untyped operands", a.join(", ")),
            ));
            continue;
        };
        if !count_aligned(k, count, e) {
            out.push(LintIssue::new(
                &p,
                Rule::DataCopyAlign,
                format!(
                    "DataCopy({}) count `{count}` × {e} B is not provably whole 32-byte blocks",
                    a.join(", ")
                ),
            ));
        }
    }
    out.extend((k.lint_tiling)(&p));
    out
}

/// Whether a DataCopy count expression is provably aligned for elements of `e` bytes: an
/// aligned literal, or a product with a tiling field the planner aligns for `e`-byte elements.
fn count_aligned(k: &KernelSource, count: &str, e: u32) -> bool {
    if let Ok(n) = count.parse::<u32>() {
        return (n * e).is_multiple_of(BLOCK_BYTES as u32);
    }
    count.split('*').map(str::trim).any(|factor| {
        factor.strip_prefix("t.").is_some_and(|f| {
            k.fields.iter().any(|fd| {
                fd.name == f
                    && matches!(fd.role, FieldRole::AlignedCount { elem_bytes } if e >= elem_bytes)
            })
        })
    })
}

/// Check a parsed source against a planned Rust tiling: struct ABI and the UB plan.
pub fn lint_tiling<T: KernelTiling>(t: &T, p: &ParsedSource) -> Vec<LintIssue> {
    let mut out = Vec::new();
    match p.structs.get(T::C_NAME) {
        None => out.push(LintIssue::new(
            p,
            Rule::TilingAbi,
            format!("struct {} missing", T::C_NAME),
        )),
        Some(fields) => {
            let want: Vec<(String, String)> = T::FIELDS
                .iter()
                .map(|f| (f.ty.c_name().to_string(), f.name.to_string()))
                .collect();
            if *fields != want {
                out.push(LintIssue::new(
                    p,
                    Rule::TilingAbi,
                    format!(
                        "struct {} fields {:?} differ from Rust {:?}",
                        T::C_NAME,
                        fields,
                        want
                    ),
                ));
            }
        }
    }
    let budget = t.budget();
    let got: Vec<(String, Option<u32>, Option<u32>)> = p
        .inits
        .iter()
        .map(|c| {
            let val = c.size.strip_prefix("t.").and_then(|f| {
                T::FIELDS
                    .iter()
                    .position(|fd| {
                        fd.name == f && fd.role == FieldRole::BufferBytes && fd.ty == CType::U32
                    })
                    .map(|i| t.field_bits(i))
            });
            (c.name.clone(), c.depth, val)
        })
        .collect();
    let want: Vec<(String, Option<u32>, Option<u32>)> = budget
        .entries
        .iter()
        .map(|&(n, d, b)| (n.to_string(), Some(d), u32::try_from(b).ok()))
        .collect();
    if got != want {
        out.push(LintIssue::new(
            p,
            Rule::BufferSize,
            format!("InitBuffer calls {got:?} differ from the Rust UB plan {want:?}"),
        ));
    }
    out
}

//! Thin NVRTC calls: compile one source for one GPU architecture, returning PTX, the SASS
//! cubin and the compiler log (with `--ptxas-options=-v`: registers and spill bytes).
//!
//! Self-contained (depends only on `cudarc::nvrtc`), so the compile-check test can include it.

use std::ffi::CString;

use cudarc::nvrtc::{result, sys};

/// The result of one compilation.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// PTX text.
    pub ptx: String,
    /// SASS for the requested architecture.
    pub cubin: Vec<u8>,
    /// Compiler and ptxas log.
    pub log: String,
}

/// Register use and spills of one kernel, parsed from a ptxas `-v` log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelUsage {
    /// Mangled or `extern "C"` name.
    pub name: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes spilled to local memory (stores + loads).
    pub spill_bytes: u32,
}

/// Whether libnvrtc can be loaded (no panic when it cannot).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library candidates; touches no device.
    unsafe { sys::is_culib_present() }
}

/// Compiles `src` for `arch` (e.g. `sm_90a`, `sm_100f`) with `-std=c++17` and a verbose
/// ptxas log. Errors carry the compiler log.
pub fn compile(src: &str, name: &str, arch: &str) -> Result<Compiled, String> {
    let csrc = CString::new(src).map_err(|e| e.to_string())?;
    let cname = CString::new(format!("{name}.cu")).map_err(|e| e.to_string())?;
    let prog = result::create_program(&csrc, Some(&cname)).map_err(|e| format!("create: {e:?}"))?;
    let opts = [
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "--ptxas-options=-v".to_string(),
        "-default-device".to_string(),
    ];
    // SAFETY: `prog` was just created and is destroyed once, below.
    let compiled = unsafe { result::compile_program(prog, &opts) };
    // SAFETY: as above.
    let log = unsafe { result::get_program_log(prog) }
        .map(|l| cstr_vec(&l))
        .unwrap_or_default();
    let out = match compiled {
        Err(e) => Err(format!("{name} for {arch}: {e:?}\n{log}")),
        // SAFETY: the program compiled; the size query precedes the copy into a buffer of
        // exactly that size.
        Ok(()) => unsafe {
            let ptx = result::get_ptx(prog)
                .map(|p| cstr_vec(&p))
                .map_err(|e| format!("ptx: {e:?}"));
            let mut size = 0usize;
            let cubin = sys::nvrtcGetCUBINSize(prog, &mut size)
                .result()
                .and_then(|()| {
                    let mut cubin = vec![0u8; size];
                    sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast())
                        .result()
                        .map(|()| cubin)
                })
                .map_err(|e| format!("cubin: {e:?}"));
            match (ptx, cubin) {
                (Ok(ptx), Ok(cubin)) => Ok(Compiled { ptx, cubin, log }),
                (Err(e), _) | (_, Err(e)) => Err(e),
            }
        },
    };
    // SAFETY: `prog` is live and not used after this.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

fn cstr_vec(v: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = v.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The integer just before `marker` in `line` (0 if none).
fn number_before(line: &str, marker: &str) -> u32 {
    line.find(marker)
        .and_then(|i| line[..i].split_whitespace().last())
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

/// Parses `Compiling entry function 'X'` / `Used N registers` / `N bytes spill stores, M bytes
/// spill loads` lines of a ptxas `-v` log.
pub fn parse_usage(log: &str) -> Vec<KernelUsage> {
    const ENTRY: &str = "Compiling entry function '";
    let mut out: Vec<KernelUsage> = Vec::new();
    for line in log.lines() {
        if let Some(i) = line.find(ENTRY) {
            let name = line[i + ENTRY.len()..]
                .split('\'')
                .next()
                .unwrap_or("")
                .to_string();
            out.push(KernelUsage {
                name,
                registers: 0,
                spill_bytes: 0,
            });
        } else if let Some(k) = out.last_mut() {
            if line.contains("registers") {
                k.registers = number_before(line, "registers");
            }
            if line.contains("bytes spill stores") {
                k.spill_bytes = number_before(line, "bytes spill stores")
                    + number_before(line, "bytes spill loads");
            }
        }
    }
    out
}

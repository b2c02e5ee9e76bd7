//! Layer 2: one thin function per API call, status codes turned into `Result`.

use std::ffi::{CStr, CString, c_char, c_void};

use super::raw::{AclStatus, AclSymbols, Handle, MALLOC_HUGE_FIRST, RtcSymbols};
use crate::error::{AscendError, Result};

/// Turn a status into a result.
pub(crate) fn check(call: &'static str, code: AclStatus) -> Result<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(AscendError::Acl {
            call,
            code,
            log: String::new(),
        })
    }
}

fn cstring(call: &'static str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| AscendError::Acl {
        call,
        code: -1,
        log: ": interior NUL in argument".into(),
    })
}

impl AclSymbols {
    pub fn acl_init(&self) -> Result<()> {
        // SAFETY: a null config path is documented as "no configuration file".
        check("aclInit", unsafe { (self.init)(std::ptr::null()) })
    }

    pub fn acl_finalize(&self) -> Result<()> {
        // SAFETY: no arguments; called once per successful aclInit.
        check("aclFinalize", unsafe { (self.finalize)() })
    }

    pub fn device_count(&self) -> Result<u32> {
        let mut n = 0u32;
        // SAFETY: `n` is a valid out-pointer for the duration of the call.
        check("aclrtGetDeviceCount", unsafe {
            (self.get_device_count)(&mut n)
        })?;
        Ok(n)
    }

    pub fn set_device(&self, id: i32) -> Result<()> {
        // SAFETY: plain integer argument.
        check("aclrtSetDevice", unsafe { (self.set_device)(id) })
    }

    pub fn reset_device(&self, id: i32) -> Result<()> {
        // SAFETY: plain integer argument.
        check("aclrtResetDevice", unsafe { (self.reset_device)(id) })
    }

    pub fn soc_name(&self) -> Result<String> {
        // SAFETY: no arguments; the result is null or a NUL-terminated string owned by the
        // library, which stays valid while it is loaded (we copy it immediately).
        let p = unsafe { (self.get_soc_name)() };
        if p.is_null() {
            return Err(AscendError::Acl {
                call: "aclrtGetSocName",
                code: -1,
                log: ": null name".into(),
            });
        }
        // SAFETY: non-null, NUL-terminated per the API contract.
        Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    pub fn current_context(&self) -> Result<Handle> {
        let mut ctx: Handle = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("aclrtGetCurrentContext", unsafe {
            (self.get_current_context)(&mut ctx)
        })?;
        Ok(ctx)
    }

    pub fn set_context(&self, ctx: Handle) -> Result<()> {
        // SAFETY: `ctx` came from aclrtGetCurrentContext and its device is not reset yet.
        check("aclrtSetCurrentContext", unsafe {
            (self.set_current_context)(ctx)
        })
    }

    pub fn stream_create(&self) -> Result<Handle> {
        let mut s: Handle = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("aclrtCreateStream", unsafe { (self.create_stream)(&mut s) })?;
        Ok(s)
    }

    pub fn stream_destroy(&self, s: Handle) -> Result<()> {
        // SAFETY: `s` was created by aclrtCreateStream and is destroyed once.
        check("aclrtDestroyStream", unsafe { (self.destroy_stream)(s) })
    }

    pub fn stream_sync(&self, s: Handle) -> Result<()> {
        // SAFETY: `s` is a live stream.
        check("aclrtSynchronizeStream", unsafe {
            (self.synchronize_stream)(s)
        })
    }

    pub fn mem_alloc(&self, bytes: usize) -> Result<Handle> {
        let mut p: Handle = std::ptr::null_mut();
        // SAFETY: valid out-pointer; size is any value (the runtime rejects zero itself).
        check("aclrtMalloc", unsafe {
            (self.malloc)(&mut p, bytes, MALLOC_HUGE_FIRST)
        })?;
        Ok(p)
    }

    pub fn mem_free(&self, p: Handle) -> Result<()> {
        // SAFETY: `p` came from aclrtMalloc and is freed once.
        check("aclrtFree", unsafe { (self.free)(p) })
    }

    pub fn copy_to_device(&self, dst: Handle, capacity: usize, src: &[u8]) -> Result<()> {
        // SAFETY: `dst` holds `capacity` bytes; `src` is a live host slice of the given length;
        // the runtime checks `src.len() <= capacity`.
        check("aclrtMemcpy", unsafe {
            (self.memcpy)(
                dst,
                capacity,
                src.as_ptr().cast(),
                src.len(),
                super::raw::MEMCPY_HOST_TO_DEVICE,
            )
        })
    }

    pub fn copy_to_host(&self, dst: &mut [u8], src: Handle, len: usize) -> Result<()> {
        // SAFETY: `dst` is a live host buffer of `dst.len()` bytes; `src` is a device buffer of
        // at least `len` bytes (checked by the caller).
        check("aclrtMemcpy", unsafe {
            (self.memcpy)(
                dst.as_mut_ptr().cast(),
                dst.len(),
                src as *const c_void,
                len,
                super::raw::MEMCPY_DEVICE_TO_HOST,
            )
        })
    }

    pub fn binary_load(&self, bin: &[u8]) -> Result<Handle> {
        let mut h: Handle = std::ptr::null_mut();
        // SAFETY: `bin` is live for the call (the runtime copies it); null options = defaults.
        check("aclrtBinaryLoadFromData", unsafe {
            (self.binary_load_from_data)(bin.as_ptr().cast(), bin.len(), std::ptr::null(), &mut h)
        })?;
        Ok(h)
    }

    pub fn binary_unload_handle(&self, h: Handle) -> Result<()> {
        // SAFETY: `h` came from aclrtBinaryLoadFromData and is unloaded once.
        check("aclrtBinaryUnLoad", unsafe { (self.binary_unload)(h) })
    }

    pub fn function(&self, bin: Handle, name: &str) -> Result<Handle> {
        let c = cstring("aclrtBinaryGetFunction", name)?;
        let mut f: Handle = std::ptr::null_mut();
        // SAFETY: `bin` is a loaded binary; `c` is NUL-terminated and outlives the call.
        check("aclrtBinaryGetFunction", unsafe {
            (self.binary_get_function)(bin, c.as_ptr(), &mut f)
        })?;
        Ok(f)
    }

    pub fn launch(&self, func: Handle, block_dim: u32, args: &[u8], stream: Handle) -> Result<()> {
        // SAFETY: `func` is a kernel handle of a loaded binary; `args` is the packed argument
        // block (one 8-byte device address per kernel parameter), copied by the runtime.
        check("aclrtLaunchKernel", unsafe {
            (self.launch_kernel)(func, block_dim, args.as_ptr().cast(), args.len(), stream)
        })
    }
}

impl RtcSymbols {
    /// Compile `source` with `options`; on failure the error carries the compiler log.
    pub fn compile(&self, name: &str, source: &str, options: &[String]) -> Result<Vec<u8>> {
        let src = cstring("aclrtcCreateProg", source)?;
        let cname = cstring("aclrtcCreateProg", name)?;
        let opts: Vec<CString> = options
            .iter()
            .map(|o| cstring("aclrtcCompileProg", o))
            .collect::<Result<_>>()?;
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Handle = std::ptr::null_mut();
        // SAFETY: all strings are NUL-terminated and outlive the call; no headers (0, null).
        check("aclrtcCreateProg", unsafe {
            (self.create_prog)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        })?;
        let result = self.compile_created(prog, &opt_ptrs);
        // SAFETY: `prog` was created above and is destroyed exactly once, whatever happened.
        let destroyed = check("aclrtcDestroyProg", unsafe {
            (self.destroy_prog)(&mut prog)
        });
        let bin = result?;
        destroyed?;
        Ok(bin)
    }

    fn compile_created(&self, prog: Handle, opts: &[*const c_char]) -> Result<Vec<u8>> {
        // SAFETY: `prog` is live; `opts` holds `opts.len()` valid C strings.
        let status = unsafe { (self.compile_prog)(prog, opts.len() as i32, opts.as_ptr()) };
        if status != 0 {
            return Err(AscendError::Acl {
                call: "aclrtcCompileProg",
                code: status,
                log: format!(":\n{}", self.log(prog)),
            });
        }
        let mut size = 0usize;
        // SAFETY: valid out-pointer, live program.
        check("aclrtcGetBinDataSize", unsafe {
            (self.get_bin_data_size)(prog, &mut size)
        })?;
        let mut bin = vec![0u8; size];
        // SAFETY: `bin` has exactly the size the library reported.
        check("aclrtcGetBinData", unsafe {
            (self.get_bin_data)(prog, bin.as_mut_ptr().cast())
        })?;
        Ok(bin)
    }

    fn log(&self, prog: Handle) -> String {
        let mut size = 0usize;
        // SAFETY: valid out-pointer, live program.
        if unsafe { (self.get_compile_log_size)(prog, &mut size) } != 0 || size == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` has the reported size.
        if unsafe { (self.get_compile_log)(prog, buf.as_mut_ptr().cast()) } != 0 {
            return String::new();
        }
        String::from_utf8_lossy(&buf)
            .trim_end_matches('\0')
            .to_string()
    }
}

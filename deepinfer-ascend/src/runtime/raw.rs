//! Layer 1: raw symbols of `libascendcl` and the runtime compiler library, resolved at run time.

use std::ffi::{c_char, c_int, c_void};
use std::path::Path;

use libloading::Library;

use crate::error::{AscendError, Result};

/// AscendCL status code (0 = success).
pub(crate) type AclStatus = c_int;
/// Opaque handle (stream, binary, function, program, device pointer).
pub(crate) type Handle = *mut c_void;

/// `aclrtMemcpy` kinds.
pub(crate) const MEMCPY_HOST_TO_DEVICE: c_int = 1;
pub(crate) const MEMCPY_DEVICE_TO_HOST: c_int = 2;
/// `aclrtMalloc` policy: huge pages first.
pub(crate) const MALLOC_HUGE_FIRST: c_int = 0;

fn open(path: &Path) -> Result<Library> {
    // SAFETY: loading a shared library runs its initialisers; the AscendCL libraries (or the
    // test fakes) have no initialisers with preconditions on the caller.
    unsafe { Library::new(path) }.map_err(|e| AscendError::Library {
        library: path.display().to_string(),
        detail: e.to_string(),
    })
}

/// Resolve one symbol as a function pointer of type `T`.
fn sym<T: Copy>(lib: &Library, path: &Path, name: &str) -> Result<T> {
    // SAFETY: `T` is the documented C signature of `name` (declared next to each field below);
    // the pointer is copied out and only used while the owning `Library` is alive (it is
    // stored in the same struct).
    unsafe { lib.get::<T>(name.as_bytes()).map(|s| *s) }.map_err(|e| AscendError::Library {
        library: format!("{} ({name})", path.display()),
        detail: e.to_string(),
    })
}

/// `libascendcl` entry points used by the runtime.
pub(crate) struct AclSymbols {
    pub init: unsafe extern "C" fn(*const c_char) -> AclStatus,
    pub finalize: unsafe extern "C" fn() -> AclStatus,
    pub set_device: unsafe extern "C" fn(i32) -> AclStatus,
    pub reset_device: unsafe extern "C" fn(i32) -> AclStatus,
    pub get_device_count: unsafe extern "C" fn(*mut u32) -> AclStatus,
    pub get_soc_name: unsafe extern "C" fn() -> *const c_char,
    pub get_current_context: unsafe extern "C" fn(*mut Handle) -> AclStatus,
    pub set_current_context: unsafe extern "C" fn(Handle) -> AclStatus,
    pub create_stream: unsafe extern "C" fn(*mut Handle) -> AclStatus,
    pub destroy_stream: unsafe extern "C" fn(Handle) -> AclStatus,
    pub synchronize_stream: unsafe extern "C" fn(Handle) -> AclStatus,
    pub malloc: unsafe extern "C" fn(*mut Handle, usize, c_int) -> AclStatus,
    pub free: unsafe extern "C" fn(Handle) -> AclStatus,
    pub memcpy: unsafe extern "C" fn(Handle, usize, *const c_void, usize, c_int) -> AclStatus,
    pub binary_load_from_data:
        unsafe extern "C" fn(*const c_void, usize, *const c_void, *mut Handle) -> AclStatus,
    pub binary_get_function: unsafe extern "C" fn(Handle, *const c_char, *mut Handle) -> AclStatus,
    pub binary_unload: unsafe extern "C" fn(Handle) -> AclStatus,
    pub launch_kernel: unsafe extern "C" fn(Handle, u32, *const c_void, usize, Handle) -> AclStatus,
    // Keeps the code the pointers above point into mapped; dropped last.
    _lib: Library,
}

impl AclSymbols {
    /// Load `libascendcl` from `path` and resolve every symbol (any missing one is an error).
    pub fn load(path: &Path) -> Result<Self> {
        let lib = open(path)?;
        Ok(Self {
            init: sym(&lib, path, "aclInit")?,
            finalize: sym(&lib, path, "aclFinalize")?,
            set_device: sym(&lib, path, "aclrtSetDevice")?,
            reset_device: sym(&lib, path, "aclrtResetDevice")?,
            get_device_count: sym(&lib, path, "aclrtGetDeviceCount")?,
            get_soc_name: sym(&lib, path, "aclrtGetSocName")?,
            get_current_context: sym(&lib, path, "aclrtGetCurrentContext")?,
            set_current_context: sym(&lib, path, "aclrtSetCurrentContext")?,
            create_stream: sym(&lib, path, "aclrtCreateStream")?,
            destroy_stream: sym(&lib, path, "aclrtDestroyStream")?,
            synchronize_stream: sym(&lib, path, "aclrtSynchronizeStream")?,
            malloc: sym(&lib, path, "aclrtMalloc")?,
            free: sym(&lib, path, "aclrtFree")?,
            memcpy: sym(&lib, path, "aclrtMemcpy")?,
            binary_load_from_data: sym(&lib, path, "aclrtBinaryLoadFromData")?,
            binary_get_function: sym(&lib, path, "aclrtBinaryGetFunction")?,
            binary_unload: sym(&lib, path, "aclrtBinaryUnLoad")?,
            launch_kernel: sym(&lib, path, "aclrtLaunchKernel")?,
            _lib: lib,
        })
    }
}

/// Runtime compiler (`aclrtc`) entry points.
pub(crate) struct RtcSymbols {
    pub create_prog: unsafe extern "C" fn(
        *mut Handle,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> AclStatus,
    pub compile_prog: unsafe extern "C" fn(Handle, c_int, *const *const c_char) -> AclStatus,
    pub get_bin_data_size: unsafe extern "C" fn(Handle, *mut usize) -> AclStatus,
    pub get_bin_data: unsafe extern "C" fn(Handle, *mut c_char) -> AclStatus,
    pub get_compile_log_size: unsafe extern "C" fn(Handle, *mut usize) -> AclStatus,
    pub get_compile_log: unsafe extern "C" fn(Handle, *mut c_char) -> AclStatus,
    pub destroy_prog: unsafe extern "C" fn(*mut Handle) -> AclStatus,
    _lib: Library,
}

impl RtcSymbols {
    /// Load the runtime compiler library from `path`.
    pub fn load(path: &Path) -> Result<Self> {
        let lib = open(path)?;
        Ok(Self {
            create_prog: sym(&lib, path, "aclrtcCreateProg")?,
            compile_prog: sym(&lib, path, "aclrtcCompileProg")?,
            get_bin_data_size: sym(&lib, path, "aclrtcGetBinDataSize")?,
            get_bin_data: sym(&lib, path, "aclrtcGetBinData")?,
            get_compile_log_size: sym(&lib, path, "aclrtcGetCompileLogSize")?,
            get_compile_log: sym(&lib, path, "aclrtcGetCompileLog")?,
            destroy_prog: sym(&lib, path, "aclrtcDestroyProg")?,
            _lib: lib,
        })
    }
}

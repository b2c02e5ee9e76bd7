//! Host runtime: AscendCL and the runtime compiler, loaded at run time.
//!
//! Three layers, as cudarc does for CUDA: `raw` (symbols resolved with `libloading`), `calls`
//! (one thin `Result` function per API call) and this module's owning types, the only public
//! ones. A missing library or symbol is an `Err`, never a panic. Kernels are compiled for the
//! detected chip (`--npu-arch=dav-3510` or `dav-2201`) at first use and cached on disk.

mod cache;
mod calls;
mod raw;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

pub use cache::KernelCache;
use raw::{AclSymbols, Handle, RtcSymbols};

use crate::chip::{Chip, ChipSpec};
use crate::error::{AscendError, Result};
use crate::kernels::KernelSource;

/// Where to find the two libraries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryPaths {
    /// `libascendcl.so` (a bare name is searched on the loader path).
    pub ascendcl: PathBuf,
    /// The runtime compiler library.
    pub aclrtc: PathBuf,
}

impl LibraryPaths {
    /// `$DEEPINFER_ASCENDCL` / `$DEEPINFER_ACLRTC`, else `libascendcl.so` / `libacl_rtc.so`
    /// from the loader path (a CANN install puts them there through `set_env.sh`).
    pub fn from_env() -> Self {
        let get = |var: &str, default: &str| {
            std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from)
        };
        Self {
            ascendcl: get("DEEPINFER_ASCENDCL", "libascendcl.so"),
            aclrtc: get("DEEPINFER_ACLRTC", "libacl_rtc.so"),
        }
    }
}

/// How to open a runtime.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// Device ordinal.
    pub device: i32,
    /// Library locations.
    pub libraries: LibraryPaths,
    /// Binary cache folder (`None`: compile every time).
    pub cache_dir: Option<PathBuf>,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            device: 0,
            libraries: LibraryPaths::from_env(),
            cache_dir: KernelCache::default_dir(),
        }
    }
}

/// A raw handle that only crosses threads under the runtime's lock.
#[derive(Debug, Clone, Copy)]
struct Raw(Handle);
// SAFETY: AscendCL handles are process-wide identifiers, not thread-affine memory; every use
// happens under `Shared::lock` after binding the device context to the calling thread.
unsafe impl Send for Raw {}
// SAFETY: as above; shared references only read the handle value.
unsafe impl Sync for Raw {}

/// State shared by the runtime and its buffers; resets the device when the last one goes.
struct Shared {
    acl: AclSymbols,
    ctx: Raw,
    device: i32,
    lock: Mutex<()>,
}

impl Shared {
    /// Lock and bind the device context to this thread.
    fn enter(&self) -> Result<MutexGuard<'_, ()>> {
        let g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.acl.set_context(self.ctx.0)?;
        Ok(g)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; the process is releasing the device anyway.
        let _ = self.acl.reset_device(self.device);
        let _ = self.acl.acl_finalize();
    }
}

/// Device memory, freed on drop.
pub struct DeviceBuffer {
    shared: Arc<Shared>,
    ptr: Raw,
    bytes: usize,
}

impl DeviceBuffer {
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Ok(_g) = self.shared.enter() {
            let _ = self.shared.acl.mem_free(self.ptr.0);
        }
    }
}

struct Loaded {
    binary: Raw,
    function: Raw,
}

/// An opened device: stream, kernel binaries, memory.
pub struct AscendRuntime {
    shared: Arc<Shared>,
    rtc_path: PathBuf,
    rtc: OnceLock<std::result::Result<RtcSymbols, AscendError>>,
    stream: Raw,
    chip: ChipSpec,
    soc: String,
    cache: KernelCache,
    loaded: Mutex<HashMap<&'static str, Loaded>>,
}

impl std::fmt::Debug for AscendRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AscendRuntime")
            .field("soc", &self.soc)
            .field("device", &self.shared.device)
            .finish()
    }
}

/// Map a SoC name to the chip family the kernels are compiled for.
pub fn chip_from_soc(soc: &str) -> Result<Chip> {
    if soc.starts_with("Ascend950") {
        Ok(Chip::Ascend950)
    } else if soc.starts_with("Ascend910B") || soc.starts_with("Ascend910_93") {
        Ok(Chip::Ascend910B)
    } else {
        Err(AscendError::Unsupported(format!(
            "SoC {soc:?}: only Ascend 950 and 910B are planned for"
        )))
    }
}

impl AscendRuntime {
    /// Open device `opts.device`. Fails (never panics) when libascendcl cannot be loaded, a
    /// symbol is missing, the device does not exist or the chip is not one this crate targets.
    pub fn open(opts: &RuntimeOptions) -> Result<Self> {
        let acl = AclSymbols::load(&opts.libraries.ascendcl)?;
        acl.acl_init()?;
        let count = match acl.device_count() {
            Ok(n) => n,
            Err(e) => {
                let _ = acl.acl_finalize();
                return Err(e);
            }
        };
        if opts.device < 0 || opts.device as u32 >= count {
            let _ = acl.acl_finalize();
            return Err(AscendError::Unsupported(format!(
                "device {} of {count}",
                opts.device
            )));
        }
        if let Err(e) = acl.set_device(opts.device) {
            let _ = acl.acl_finalize();
            return Err(e);
        }
        let ctx = match acl.current_context() {
            Ok(c) => c,
            Err(e) => {
                let _ = acl.reset_device(opts.device);
                let _ = acl.acl_finalize();
                return Err(e);
            }
        };
        // From here on `Shared`'s drop resets and finalises on every error path.
        let shared = Arc::new(Shared {
            acl,
            ctx: Raw(ctx),
            device: opts.device,
            lock: Mutex::new(()),
        });
        let soc = shared.acl.soc_name()?;
        let chip = chip_from_soc(&soc)?.spec();
        let stream = {
            let _g = shared.enter()?;
            shared.acl.stream_create()?
        };
        Ok(Self {
            shared,
            rtc_path: opts.libraries.aclrtc.clone(),
            rtc: OnceLock::new(),
            stream: Raw(stream),
            chip,
            soc,
            cache: KernelCache::new(opts.cache_dir.clone()),
            loaded: Mutex::new(HashMap::new()),
        })
    }

    /// The chip's fact table.
    pub fn chip(&self) -> ChipSpec {
        self.chip
    }

    /// The SoC name the runtime reported.
    pub fn soc_name(&self) -> &str {
        &self.soc
    }

    /// Allocate `bytes` of device memory (at least 32).
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        let _g = self.shared.enter()?;
        let bytes = bytes.max(32);
        let p = self.shared.acl.mem_alloc(bytes)?;
        Ok(DeviceBuffer {
            shared: self.shared.clone(),
            ptr: Raw(p),
            bytes,
        })
    }

    /// Copy host bytes into a new device buffer.
    pub fn upload(&self, data: &[u8]) -> Result<DeviceBuffer> {
        let buf = self.alloc(data.len())?;
        let _g = self.shared.enter()?;
        self.shared.acl.copy_to_device(buf.ptr.0, buf.bytes, data)?;
        Ok(buf)
    }

    /// Copy the first `len` bytes of a device buffer back (after synchronising the stream).
    pub fn download(&self, buf: &DeviceBuffer, len: usize) -> Result<Vec<u8>> {
        if len > buf.bytes {
            return Err(AscendError::Shape(format!(
                "download of {len} bytes from a {}-byte buffer",
                buf.bytes
            )));
        }
        self.synchronize()?;
        let _g = self.shared.enter()?;
        let mut out = vec![0u8; len];
        self.shared.acl.copy_to_host(&mut out, buf.ptr.0, len)?;
        Ok(out)
    }

    /// Wait for every launched kernel.
    pub fn synchronize(&self) -> Result<()> {
        let _g = self.shared.enter()?;
        self.shared.acl.stream_sync(self.stream.0)
    }

    /// Compiler options for this chip.
    pub fn compile_options(&self) -> Vec<String> {
        vec![format!("--npu-arch={}", self.chip.npu_arch)]
    }

    /// The device binary of a kernel: from the cache, else compiled now (and cached).
    pub fn compile(&self, k: &KernelSource) -> Result<Vec<u8>> {
        let src = k.expanded();
        let opts = self.compile_options();
        let file = KernelCache::file_name(k.name, self.chip.npu_arch, &src, &opts);
        if let Some(bin) = self.cache.get(&file) {
            return Ok(bin);
        }
        let rtc = self
            .rtc
            .get_or_init(|| RtcSymbols::load(&self.rtc_path))
            .as_ref()
            .map_err(Clone::clone)?;
        let bin = rtc.compile(k.name, &src, &opts)?;
        self.cache.put(&file, &bin)?;
        Ok(bin)
    }

    /// Launch kernel `k` on `block_dim` cores with device-pointer arguments, in order.
    pub fn launch(
        &self,
        k: &'static KernelSource,
        block_dim: u32,
        args: &[&DeviceBuffer],
    ) -> Result<()> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if !loaded.contains_key(k.name) {
            let bin = self.compile(k)?;
            let _g = self.shared.enter()?;
            let binary = self.shared.acl.binary_load(&bin)?;
            let function = match self.shared.acl.function(binary, k.name) {
                Ok(f) => f,
                Err(e) => {
                    let _ = self.shared.acl.binary_unload_handle(binary);
                    return Err(e);
                }
            };
            loaded.insert(
                k.name,
                Loaded {
                    binary: Raw(binary),
                    function: Raw(function),
                },
            );
        }
        let f = loaded[k.name].function;
        let packed: Vec<u8> = args
            .iter()
            .flat_map(|a| (a.ptr.0 as usize as u64).to_le_bytes())
            .collect();
        let _g = self.shared.enter()?;
        self.shared
            .acl
            .launch(f.0, block_dim, &packed, self.stream.0)
    }
}

impl Drop for AscendRuntime {
    fn drop(&mut self) {
        if let Ok(_g) = self.shared.enter() {
            let _ = self.shared.acl.stream_sync(self.stream.0);
            let loaded = self.loaded.get_mut().unwrap_or_else(|p| p.into_inner());
            for l in loaded.values() {
                let _ = self.shared.acl.binary_unload_handle(l.binary.0);
            }
            let _ = self.shared.acl.stream_destroy(self.stream.0);
        }
    }
}

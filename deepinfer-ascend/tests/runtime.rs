//! Host-runtime error paths and the compile-once cache, against a fake libascendcl built here
//! with the system C compiler (`cc`). Skipped with a message when no `cc` is available.

use std::path::{Path, PathBuf};
use std::process::Command;

use deepinfer_ascend::kernels::{KernelKind, KernelSource, kernel};
use deepinfer_ascend::runtime::{AscendRuntime, LibraryPaths, RuntimeOptions, chip_from_soc};
use deepinfer_ascend::{AscendError, Chip};

const FAKE_C: &str = include_str!("fake/fake_ascendcl.c");

/// Compile the fake into `dir` with extra `-D` flags; None when there is no C compiler.
fn build_fake(dir: &Path, defines: &[&str]) -> Option<PathBuf> {
    let src = dir.join("fake_ascendcl.c");
    std::fs::write(&src, FAKE_C).unwrap();
    let out = dir.join("libfake_ascendcl.so");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .args(defines)
        .status();
    match status {
        Ok(s) if s.success() => Some(out),
        _ => {
            eprintln!("skipping: no working `cc` to build the fake libascendcl");
            None
        }
    }
}

fn opts(lib: &Path, cache: Option<PathBuf>, device: i32) -> RuntimeOptions {
    RuntimeOptions {
        device,
        libraries: LibraryPaths {
            ascendcl: lib.to_path_buf(),
            aclrtc: lib.to_path_buf(),
        },
        cache_dir: cache,
    }
}

/// Keeps the fake loaded for the whole test (so its counters survive runtimes coming and
/// going) and reads them; the runtime's own `dlopen` of the same path shares this instance.
struct Fake(libloading::Library);

impl Fake {
    fn hold(lib: &Path) -> Self {
        // SAFETY: the fake library has no initialisers.
        Fake(unsafe { libloading::Library::new(lib) }.unwrap())
    }

    fn get(&self, name: &str) -> usize {
        // SAFETY: every fake counter takes no arguments and returns an int or a size_t, read
        // here as a usize and masked below for the int ones (small, non-negative values).
        let f = unsafe {
            self.0
                .get::<unsafe extern "C" fn() -> usize>(name.as_bytes())
        }
        .unwrap();
        // SAFETY: no arguments, no preconditions.
        let v = unsafe { f() };
        if name.ends_with("args_size") {
            v
        } else {
            v & 0xffff_ffff
        }
    }
}

#[test]
fn missing_library_is_an_error_not_a_panic() {
    let o = opts(Path::new("/nonexistent/libascendcl.so"), None, 0);
    assert!(matches!(
        AscendRuntime::open(&o),
        Err(AscendError::Library { .. })
    ));
    // The default names are absent on this machine too.
    let d = RuntimeOptions {
        libraries: LibraryPaths {
            ascendcl: "libascendcl_absent_here.so".into(),
            aclrtc: "x".into(),
        },
        ..RuntimeOptions::default()
    };
    assert!(AscendRuntime::open(&d).is_err());
}

#[test]
fn missing_symbol_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let Some(lib) = build_fake(dir.path(), &["-DOMIT_LAUNCH"]) else {
        return;
    };
    match AscendRuntime::open(&opts(&lib, None, 0)) {
        Err(AscendError::Library { library, .. }) => {
            assert!(library.contains("aclrtLaunchKernel"), "{library}")
        }
        other => panic!("expected a library error, got {other:?}"),
    }
}

#[test]
fn bad_device_and_unknown_chip_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let Some(lib) = build_fake(dir.path(), &[]) else {
        return;
    };
    assert!(matches!(
        AscendRuntime::open(&opts(&lib, None, 3)),
        Err(AscendError::Unsupported(_))
    ));
    assert!(matches!(
        AscendRuntime::open(&opts(&lib, None, -1)),
        Err(AscendError::Unsupported(_))
    ));
    let dir2 = tempfile::tempdir().unwrap();
    let Some(lib2) = build_fake(dir2.path(), &["-DFAKE_SOC=\"Ascend310P3\""]) else {
        return;
    };
    let fake2 = Fake::hold(&lib2);
    assert!(matches!(
        AscendRuntime::open(&opts(&lib2, None, 0)),
        Err(AscendError::Unsupported(_))
    ));
    assert!(
        fake2.get("fake_finalized") >= 1,
        "a failed open still finalises"
    );
}

#[test]
fn soc_names_map_to_chips() {
    assert_eq!(chip_from_soc("Ascend910B2").unwrap(), Chip::Ascend910B);
    assert_eq!(chip_from_soc("Ascend910_9391").unwrap(), Chip::Ascend910B);
    assert_eq!(chip_from_soc("Ascend950PR").unwrap(), Chip::Ascend950);
    assert!(chip_from_soc("Ascend310P").is_err());
}

#[test]
fn compile_errors_carry_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let Some(lib) = build_fake(dir.path(), &[]) else {
        return;
    };
    let rt = AscendRuntime::open(&opts(&lib, None, 0)).unwrap();
    let bad = KernelSource {
        source: "// FAKE_COMPILE_ERROR\n",
        ..*kernel("rope").unwrap()
    };
    match rt.compile(&bad) {
        Err(AscendError::Acl { call, code, log }) => {
            assert_eq!(call, "aclrtcCompileProg");
            assert_eq!(code, 3);
            assert!(log.contains("fake compile error"), "{log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn kernels_compile_once_per_arch_and_launch() {
    let dir = tempfile::tempdir().unwrap();
    let Some(lib) = build_fake(dir.path(), &[]) else {
        return;
    };
    let fake = Fake::hold(&lib);
    let cache = dir.path().join("cache");
    let k = kernel("hc_mix").unwrap();
    {
        let rt = AscendRuntime::open(&opts(&lib, Some(cache.clone()), 0)).unwrap();
        assert_eq!(rt.chip().chip, Chip::Ascend910B);
        assert_eq!(
            rt.compile_options(),
            vec!["--npu-arch=dav-2201".to_string()]
        );
        let a = rt.upload(&[1, 2, 3]).unwrap();
        let b = rt.alloc(64).unwrap();
        rt.launch(k, 7, &[&a, &b]).unwrap();
        rt.launch(k, 5, &[&a, &b, &a]).unwrap();
        rt.synchronize().unwrap();
        assert_eq!(
            fake.get("fake_compile_count"),
            1,
            "second launch reuses the loaded kernel"
        );
        assert_eq!(fake.get("fake_last_block_dim"), 5);
        assert_eq!(fake.get("fake_last_args_size"), 24);
    }
    let files: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(files.len(), 1);
    assert!(
        files[0].starts_with("hc_mix-dav-2201-") && files[0].ends_with(".bin"),
        "{files:?}"
    );
    // A new runtime with the same cache does not compile again.
    let rt = AscendRuntime::open(&opts(&lib, Some(cache), 0)).unwrap();
    assert_eq!(rt.compile(k).unwrap(), b"BIN:hc_mix".to_vec());
    assert_eq!(fake.get("fake_compile_count"), 1);
}

#[test]
fn ascend950_compiles_for_dav_3510() {
    let dir = tempfile::tempdir().unwrap();
    let Some(lib) = build_fake(dir.path(), &["-DFAKE_SOC=\"Ascend950PR\""]) else {
        return;
    };
    let rt = AscendRuntime::open(&opts(&lib, None, 0)).unwrap();
    assert_eq!(rt.chip().npu_arch, "dav-3510");
    assert_eq!(
        rt.compile(kernel("gemv").unwrap()).unwrap(),
        b"BIN:gemv".to_vec()
    );
}

#[test]
fn memory_round_trips_and_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    let Some(lib) = build_fake(dir.path(), &[]) else {
        return;
    };
    let fake = Fake::hold(&lib);
    {
        let rt = AscendRuntime::open(&opts(&lib, None, 0)).unwrap();
        let data: Vec<u8> = (0..=255).collect();
        let buf = rt.upload(&data).unwrap();
        assert_eq!(buf.len(), 256);
        assert_eq!(rt.download(&buf, 256).unwrap(), data);
        assert!(matches!(rt.download(&buf, 257), Err(AscendError::Shape(_))));
        assert_eq!(fake.get("fake_live_allocs"), 1);
        drop(rt);
        // The buffer outlives the runtime handle and is still freed correctly.
        assert_eq!(
            fake.get("fake_finalized"),
            0,
            "device kept while a buffer lives"
        );
        drop(buf);
    }
    assert_eq!(fake.get("fake_live_allocs"), 0);
    assert_eq!(fake.get("fake_finalized"), 1);
}

#[test]
fn missing_compiler_library_fails_at_first_compile() {
    let dir = tempfile::tempdir().unwrap();
    let Some(lib) = build_fake(dir.path(), &[]) else {
        return;
    };
    let mut o = opts(&lib, None, 0);
    o.libraries.aclrtc = dir.path().join("no_rtc.so");
    let rt = AscendRuntime::open(&o).unwrap();
    assert!(matches!(
        rt.compile(kernel("router").unwrap()),
        Err(AscendError::Library { .. })
    ));
    let ks = KernelSource {
        kind: KernelKind::Vector,
        ..*kernel("router").unwrap()
    };
    assert!(rt.compile(&ks).is_err());
}

//! The no-device error path of the CUDA backend: with no `libcuda`, and with a fake `libcuda`
//! whose `cuInit` fails, `CudaBackend::new` returns an error instead of panicking.

use std::path::Path;
use std::process::Command;

use deepinfer_kernels::KernelError;
use deepinfer_kernels::cuda::{CudaBackend, arch_for};

const CHILD: &str = "DEEPINFER_FAKE_LIBCUDA_CHILD";

#[test]
fn arch_selection() {
    assert_eq!(arch_for(9, 0), "sm_90a");
    assert_eq!(arch_for(10, 0), "sm_100f");
    assert_eq!(arch_for(10, 3), "sm_100f");
    assert_eq!(arch_for(8, 9), "sm_89");
}

/// In the child process (fake libcuda on the loader path) this is the check; in the parent it
/// checks whatever driver the machine has: either none, or a working device.
#[test]
fn new_without_a_usable_driver_is_an_error() {
    match CudaBackend::new(0) {
        Err(KernelError::Device(msg)) => {
            if std::env::var(CHILD).is_ok() {
                assert!(msg.contains("CUDA context"), "{msg}");
                println!("FAKE-LIBCUDA-ERROR-OK: {msg}");
            }
        }
        Err(e) => panic!("unexpected error kind: {e}"),
        Ok(b) => {
            assert!(
                std::env::var(CHILD).is_err(),
                "the fake libcuda must not yield a device"
            );
            eprintln!("a real CUDA device is present: {b:?}");
        }
    }
}

#[test]
fn fake_libcuda_whose_cuinit_fails() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("fake.c");
    // cuInit fails with CUDA_ERROR_NO_DEVICE (100); cuGetErrorString exists as in any real
    // driver (cudarc formats driver errors through it).
    let src = "int cuInit(unsigned int flags) { (void)flags; return 100; }\n\
               int cuGetErrorString(int e, const char** s) { (void)e; *s = \"no CUDA-capable device (fake)\"; return 0; }\n";
    std::fs::write(&c, src).unwrap();
    let so = dir.path().join("libcuda.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&c)
        .status();
    match built {
        Ok(s) if s.success() => {}
        other => panic!("building the fake libcuda with `{cc}` failed: {other:?}"),
    }
    std::os::unix::fs::symlink(&so, dir.path().join("libcuda.so.1")).unwrap();
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--exact",
            "new_without_a_usable_driver_is_an_error",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("LD_LIBRARY_PATH", prepend(dir.path()))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("FAKE-LIBCUDA-ERROR-OK"),
        "child did not reach the fake driver:\n{stdout}\n{stderr}"
    );
}

fn prepend(dir: &Path) -> String {
    match std::env::var("LD_LIBRARY_PATH") {
        Ok(v) if !v.is_empty() => format!("{}:{v}", dir.display()),
        _ => dir.display().to_string(),
    }
}

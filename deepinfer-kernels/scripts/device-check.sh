#!/usr/bin/env bash
# On-device check of deepinfer-kernels' CUDA backend: every CUDA op against the CPU backend
# (bit-exact for sampling, integer and copy ops and for (de)quantisation; stated tolerances for
# float ops, see tests/cuda_device.rs), then GEMV / sink-attention bandwidth against a
# device-to-device copy.
#
#   deepinfer-kernels/scripts/device-check.sh --build   # here: build the test binary into
#                                                       # deepinfer-kernels/.device-check/ (no GPU needed)
#   deepinfer-kernels/scripts/device-check.sh           # on the GPU machine, from the repo root
#
# On the GPU machine it runs deepinfer-kernels/.device-check/cuda_device when present (carry
# `deepinfer-kernels/.device-check`), else builds with cargo if cargo exists. Needs the CUDA driver and
# libnvrtc (a CUDA 13 toolkit, or the PyPI wheel nvidia-cuda-nvrtc==13.5.37: set
# DEEPINFER_NVRTC_LIB to its lib directory); libcublas is optional (GEMMs fall back to the
# portable kernels and the report says so). Output: the PASS/FAIL lines and bandwidth figures,
# also written to $OUT/device-check.txt when $OUT is set.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin_dir=$root/deepinfer-kernels/.device-check
bin=$bin_dir/cuda_device

# cuda_backend_trait: the same model-like step through the `Backend` trait on CUDA and CPU.
trait_bin=$bin_dir/cuda_backend_trait

if [[ ${1:-} == --build ]]; then
  cd "$root"
  mkdir -p "$bin_dir"
  for t in cuda_device cuda_backend_trait; do
    json=$(cargo test -p deepinfer-kernels --release --test $t --no-run --message-format=json)
    exe=$(printf '%s\n' "$json" | grep '"executable":"' | grep "$t" | tail -1 |
          sed 's/.*"executable":"\([^"]*\)".*/\1/')
    cp "$exe" "$bin_dir/$t"
    echo "built $bin_dir/$t ($(du -h "$bin_dir/$t" | cut -f1))"
  done
  echo "carry deepinfer-kernels/.device-check to the GPU machine"
  exit 0
fi

log=${OUT:-/tmp}/device-check.txt
{
  echo "== $(date -u) device-check"
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader || true
} | tee "$log"

# libnvrtc / libcublas: system paths first, then an explicit or PyPI location.
extra=${DEEPINFER_NVRTC_LIB:-}
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         "$HOME"/.cache/deepinfer-nvrtc/venv/lib/python3*/site-packages/nvidia/cu13/lib; do
  [[ -d $d ]] && extra=${extra:+$extra:}$d
done
export LD_LIBRARY_PATH=${extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# (No `ls | grep -q` here: under pipefail grep's early exit fails the pipeline.)
found=$(ldconfig -p 2>/dev/null | grep -c libnvrtc || true)
for d in ${extra//:/ }; do compgen -G "$d/libnvrtc.so*" >/dev/null && found=1; done
if [[ $found == 0 ]]; then
  echo "WARNING: libnvrtc not found; kernels cannot be compiled (set DEEPINFER_NVRTC_LIB)" | tee -a "$log"
fi

args=(--ignored --nocapture --test-threads=1)
if [[ -x $bin ]]; then
  run=("$bin" "${args[@]}")
elif command -v cargo >/dev/null; then
  cd "$root"
  run=(cargo test -p deepinfer-kernels --release --test cuda_device -- "${args[@]}")
else
  echo "no $bin and no cargo: build it first with '$0 --build' and carry deepinfer-kernels/.device-check" | tee -a "$log"
  exit 2
fi
set +e
timeout "${DEVICE_CHECK_TIMEOUT:-420}" "${run[@]}" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
if [[ -x $trait_bin ]]; then
  trait=("$trait_bin" --nocapture --test-threads=1)
elif command -v cargo >/dev/null; then
  trait=(cargo test -p deepinfer-kernels --release --test cuda_backend_trait -- --nocapture --test-threads=1)
else
  trait=()
fi
if [[ ${#trait[@]} -gt 0 ]]; then
  echo "== Backend trait step, CUDA vs CPU" | tee -a "$log"
  timeout 120 "${trait[@]}" 2>&1 | tee -a "$log"
  trc=${PIPESTATUS[0]}
  [[ $rc -eq 0 ]] && rc=$trc
fi
echo "== exit $rc" | tee -a "$log"
exit "$rc"

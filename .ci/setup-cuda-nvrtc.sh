#!/usr/bin/env bash
# NVRTC from PyPI (no CUDA toolkit, no GPU) for deepinfer-kernels' CUDA compile-check test.
# Idempotent: the venv is cached under $DEEPINFER_NVRTC_HOME (default ~/.cache/deepinfer-nvrtc).
set -euo pipefail
home=${DEEPINFER_NVRTC_HOME:-$HOME/.cache/deepinfer-nvrtc}
if [[ ! -f $home/ok-13.5.37 ]]; then
  python3 -m venv "$home/venv"
  "$home/venv/bin/pip" install -q nvidia-cuda-nvrtc==13.5.37
  touch "$home/ok-13.5.37"
fi
lib=$("$home/venv/bin/python" -c 'import nvidia,os;print(os.path.join(list(nvidia.__path__)[0],"cu13","lib"))')
ls "$lib"/libnvrtc* >/dev/null
echo "NVRTC at $lib"

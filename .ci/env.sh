# Sourced by .ci/run after the setup scripts: puts the PyPI NVRTC on the loader path and makes
# deepinfer-kernels' CUDA compile-check test mandatory (it fails instead of skipping).
_nvrtc_home=${DEEPINFER_NVRTC_HOME:-$HOME/.cache/deepinfer-nvrtc}
if [ -x "$_nvrtc_home/venv/bin/python" ]; then
  _nvrtc_lib=$("$_nvrtc_home/venv/bin/python" -c 'import nvidia,os;print(os.path.join(list(nvidia.__path__)[0],"cu13","lib"))')
  export LD_LIBRARY_PATH="$_nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export DEEPINFER_REQUIRE_NVRTC=1
unset _nvrtc_home _nvrtc_lib

# Sourced by .ci/run after the setup scripts: puts the PyPI NVRTC on the loader path and makes
# deepinfer-kernels' CUDA compile-check test mandatory (it fails instead of skipping).
_nvrtc_home=${DEEPINFER_NVRTC_HOME:-$HOME/.cache/deepinfer-nvrtc}
if [ -x "$_nvrtc_home/venv/bin/python" ]; then
  _nvrtc_lib=$("$_nvrtc_home/venv/bin/python" -c 'import nvidia,os;print(os.path.join(list(nvidia.__path__)[0],"cu13","lib"))')
  export LD_LIBRARY_PATH="$_nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export DEEPINFER_REQUIRE_NVRTC=1
unset _nvrtc_home _nvrtc_lib
# The OpenAI and Anthropic SDKs of .ci/setup-python-sdk.sh for deepinfer-engine's
# tests/server_sdk.rs, made mandatory.
_sdk_home=${DEEPINFER_SDK_HOME:-$HOME/.cache/deepinfer-sdk}
if [ -x "$_sdk_home/venv/bin/python" ]; then
  export DEEPINFER_SDK_PYTHON="$_sdk_home/venv/bin/python"
fi
export DEEPINFER_REQUIRE_SDK=1
unset _sdk_home

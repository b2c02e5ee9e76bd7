#!/usr/bin/env bash
# llama.cpp figures on the tiny V4 checkpoint (GGUF made by convert_gguf.py), 2 threads, CPU.
#   bench/peers/run_llamacpp.sh [f32|bf16 ...]
# Prints one JSON line per dtype:
#   prefill_tok_s  llama-bench pp1024 (one 1,024-token prompt; mean of -r reps)
#   decode_tok_s   llama-bench tg64 (batch 1, 64 tokens one at a time)
#   offline_*      llama-batched-bench -npp 256 -ntg 64 -npl 16 (16 sequences, prompts not shared):
#                  total = S (all tokens / total time), gen = 16*64 / total time
# Environment: PEERS (default /work/peers), THREADS (2), REPS (3).
set -euo pipefail
PEERS=${PEERS:-/work/peers}
THREADS=${THREADS:-2}
REPS=${REPS:-3}
BIN=$PEERS/llama-build/bin
LCPP=$PEERS/llama_cpp_python-0.3.36/vendor/llama.cpp
HERE=$(cd "$(dirname "$0")" && pwd)
PY=$PEERS/venv/bin/python
DTYPES=("$@")
[ ${#DTYPES[@]} -eq 0 ] && DTYPES=(f32 bf16)
mkdir -p "$PEERS/gguf" "$PEERS/runs"

for dt in "${DTYPES[@]}"; do
  src=$PEERS/v4-tiny-256-upstream
  [ "$dt" = bf16 ] && src=$PEERS/v4-tiny-256-upstream-bf16
  gguf=$PEERS/gguf/v4-tiny-256-$dt.gguf
  if [ ! -f "$gguf" ]; then
    "$PY" "$HERE/convert_gguf.py" "$LCPP" "$src" --outfile "$gguf" --outtype "$dt" \
      > "$PEERS/runs/convert-$dt.log" 2>&1
  fi
  lb=$PEERS/runs/llama-bench-$dt.json
  "$BIN/llama-bench" -m "$gguf" -p 1024 -n 64 -t "$THREADS" -r "$REPS" -o json > "$lb" 2> "$PEERS/runs/llama-bench-$dt.err"
  bb=$PEERS/runs/llama-batched-$dt.jsonl
  "$BIN/llama-batched-bench" -m "$gguf" -c 8192 -b 2048 -ub 512 -npp 256 -ntg 64 -npl 16 \
    -t "$THREADS" -tb "$THREADS" --output-format jsonl > "$PEERS/runs/llama-batched-$dt.out" 2> "$PEERS/runs/llama-batched-$dt.err"
  grep '^{' "$PEERS/runs/llama-batched-$dt.out" > "$bb" || true
  "$PY" - "$lb" "$bb" "$dt" "$THREADS" <<'PY'
import json, sys
lb, bb, dt, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
res = {"peer": "llama.cpp", "dtype": dt, "threads": threads}
for r in json.load(open(lb)):
    res.setdefault("build", f"{r.get('build_commit')} ({r.get('build_number')})")
    if r["n_prompt"] > 0 and r["n_gen"] == 0:
        res.update(prefill_len=r["n_prompt"], prefill_tok_s=round(r["avg_ts"], 1), prefill_tok_s_sd=round(r["stddev_ts"], 1))
    elif r["n_gen"] > 0 and r["n_prompt"] == 0:
        res.update(decode_steps=r["n_gen"], decode_tok_s=round(r["avg_ts"], 2), decode_tok_s_sd=round(r["stddev_ts"], 2))
rows = [json.loads(l) for l in open(bb) if l.strip()]
if rows:
    r = rows[-1]
    res.update(offline=f"{r['pl']}x{r['pp']}->{r['tg']}", offline_total_tok_s=round(r["speed"], 1),
               offline_gen_tok_s=round(r["pl"] * r["tg"] / r["t"], 1), offline_wall_s=round(r["t"], 2),
               offline_pp_tok_s=round(r["speed_pp"], 1), offline_tg_tok_s=round(r["speed_tg"], 1))
else:
    res["offline_error"] = "llama-batched-bench printed no result (see runs/llama-batched-%s.err)" % dt
print(json.dumps(res), flush=True)
PY
done

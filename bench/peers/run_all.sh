#!/usr/bin/env bash
# Our engine, llama.cpp and transformers back to back on the same tiny V4 checkpoint, 2 threads,
# then a markdown table (with ours/peer ratios) on stdout. Our engine runs first and again last,
# so the drift of a shared machine shows in the table.
#
#   ENGINE=/path/to/deepinfer bench/peers/run_all.sh
#
# Environment:
#   ENGINE        deepinfer binary (default $PEERS/bin/deepinfer; build it with
#                 `cargo build --release -p deepinfer-engine` and copy it there)
#   ENGINE_MODEL  directory our engine loads for f32 (default $PEERS/v4-tiny-256, the transformers
#                 save_pretrained dir; $PEERS/v4-tiny-256-upstream holds the same weights under
#                 DeepSeek names); ENGINE_MODEL_BF16 likewise for bf16
#   DTYPES        "f32 bf16" (default)
#   SKIP          any of: ours transformers llamacpp
#   TF_ARGS       extra run_transformers.py arguments (e.g. "--skip offline": its batched generate
#                 takes ~15 min per dtype on a loaded 2-core machine)
#   PEERS (/work/peers), THREADS (2)
set -euo pipefail
PEERS=${PEERS:-/work/peers}
THREADS=${THREADS:-2}
ENGINE=${ENGINE:-$PEERS/bin/deepinfer}
ENGINE_MODEL=${ENGINE_MODEL:-$PEERS/v4-tiny-256}
ENGINE_MODEL_BF16=${ENGINE_MODEL_BF16:-$PEERS/v4-tiny-256-bf16}
DTYPES=${DTYPES:-f32 bf16}
SKIP=${SKIP:-}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=$PEERS/venv/bin/python
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=$PEERS/runs/$STAMP
mkdir -p "$OUT"
RES=$OUT/results.jsonl
: > "$RES"
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

ours() {  # $1 = before|after
  for dt in $DTYPES; do
    dir=$ENGINE_MODEL; [ "$dt" = bf16 ] && dir=$ENGINE_MODEL_BF16
    log "deepinfer $dt ($1): forward-bench"
    "$ENGINE" forward-bench --model "$dir" --prompt-len 1024 --decode-tokens 64 --threads "$THREADS" --repeat 3 --json \
      > "$OUT/ours-forward-$dt-$1.json" 2> "$OUT/ours-forward-$dt-$1.err"
    log "deepinfer $dt ($1): bench 16 x 256 -> 64"
    "$ENGINE" bench --model "$dir" --concurrency 16 --prompt-len 256 --new-tokens 64 --threads "$THREADS" \
      --output "$OUT/ours-bench-$dt-$1" > "$OUT/ours-bench-$dt-$1.out" 2>&1
    "$PY" - "$OUT/ours-forward-$dt-$1.json" "$OUT/ours-bench-$dt-$1.json" "$dt" "$1" "$THREADS" >> "$RES" <<'PY'
import json, sys
fw, bb, dt, run, threads = sys.argv[1:6]
f = json.loads(open(fw).read().strip().splitlines()[-1])
b = json.load(open(bb))
p = [x for x in b["points"] if x["concurrency"] == 16][0]
s = b["setup"]
gen = p["total_tok_s"]  # deepinfer bench: generated tokens / wall
total = gen * (s["prompt_len"] + s["new_tokens"]) / s["new_tokens"]
print(json.dumps({"peer": "deepinfer", "dtype": dt, "run": run, "threads": int(threads),
                  "prefill_len": f["prompt_len"], "prefill_tok_s": round(f["prefill_tok_s"], 1),
                  "prefill_tok_s_median": round(f["prefill_median_tok_s"], 1),
                  "decode_steps": f["decode_tokens"], "decode_tok_s": round(f["decode_tok_s"], 2),
                  "offline": f"16x{s['prompt_len']}->{s['new_tokens']}",
                  "offline_total_tok_s": round(total, 1), "offline_gen_tok_s": round(gen, 1),
                  "batch_invariant": f.get("batch_invariant")}))
PY
  done
}

case " $SKIP " in *" ours "*) ;; *) ours before ;; esac
case " $SKIP " in *" llamacpp "*) ;; *)
  log "llama.cpp: $DTYPES"
  # shellcheck disable=SC2086
  THREADS=$THREADS "$HERE/run_llamacpp.sh" $DTYPES >> "$RES" 2> "$OUT/llamacpp.err" || log "llama.cpp failed (see $OUT/llamacpp.err)"
  ;; esac
case " $SKIP " in *" transformers "*) ;; *)
  log "transformers: $DTYPES"
  "$PY" "$HERE/run_transformers.py" --dtype "$(echo $DTYPES | tr ' ' ',')" --threads "$THREADS" --repeat 2 ${TF_ARGS:-} \
    >> "$RES" 2> "$OUT/transformers.err" || log "transformers failed (see $OUT/transformers.err)"
  ;; esac
case " $SKIP " in *" ours "*) ;; *) ours after ;; esac

{
  echo "Run $STAMP on $(nproc) cores, load average at end: $(cut -d' ' -f1-3 /proc/loadavg) (machine shared with other jobs)."
  echo
  "$PY" "$HERE/make_table.py" "$RES"
} | tee "$OUT/table.md"
log "results: $RES"

#!/usr/bin/env python3
"""Markdown table from the JSON lines of run_transformers.py, run_llamacpp.sh and ours.

  make_table.py RESULTS.jsonl

Each line has "peer" (deepinfer, transformers, llama.cpp), "dtype" and any of prefill_tok_s,
decode_tok_s, offline_total_tok_s, offline_gen_tok_s. A line with "run": "after" is our engine
measured again at the end of the run (to show the drift of the shared machine).
The ratio columns divide our engine's figure (same dtype, first measurement) by each peer's.
"""

import json
import sys

COLS = [
    ("prefill_tok_s", "prefill 1,024 tok/s"),
    ("decode_tok_s", "decode b=1 tok/s"),
    ("offline_total_tok_s", "16x256->64 total tok/s"),
    ("offline_gen_tok_s", "16x256->64 generated tok/s"),
]


def fmt(v):
    if v is None:
        return "-"
    return f"{v:,.1f}" if v >= 10 else f"{v:.2f}"


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
    ours = {}
    for r in rows:
        if r.get("peer") == "deepinfer" and r.get("run", "before") == "before":
            ours.setdefault(r["dtype"], {}).update(r)
    out = ["| engine | weights | " + " | ".join(c[1] for c in COLS) + " |",
           "|---|---|" + "---:|" * len(COLS)]
    for r in rows:
        name = r["peer"] + (" (again, end of run)" if r.get("run") == "after" else "")
        out.append(f"| {name} | {r['dtype']} | " + " | ".join(fmt(r.get(k)) for k, _ in COLS) + " |")
    out.append("")
    out.append("Ratios, ours / peer (same weights dtype; > 1 means ours is faster):")
    out.append("")
    out.append("| ours vs | weights | " + " | ".join(c[1].split(" tok/s")[0] for c in COLS) + " |")
    out.append("|---|---|" + "---:|" * len(COLS))
    for r in rows:
        if r["peer"] == "deepinfer":
            continue
        o = ours.get(r["dtype"])
        if not o:
            continue
        cells = []
        for k, _ in COLS:
            a, b = o.get(k), r.get(k)
            cells.append(f"{a / b:.2f}x" if a and b else "-")
        out.append(f"| {r['peer']} | {r['dtype']} | " + " | ".join(cells) + " |")
    print("\n".join(out))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Compare `deepinfer score` logits with transformers' on the same checkpoint.

  venv/bin/python compare_logits.py --model /work/peers/v4-tiny-256 --deepinfer PATH/TO/deepinfer

Writes the prompt ids as JSON, runs `deepinfer score --model DIR --input IDS.json --output OUT`,
runs transformers' no-cache forward in f32 over the same ids, and prints one JSON line:
max abs diff per prompt and overall, plus whether the argmax agrees at every position.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch


def prompt_ids(n, vocab, seed):
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(0, vocab, size=n)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/work/peers/v4-tiny-256")
    ap.add_argument("--engine-model", default=None,
                    help="directory deepinfer loads (default: --model); e.g. the upstream-named copy")
    ap.add_argument("--deepinfer", required=True, help="path of the deepinfer binary")
    ap.add_argument("--lengths", default="1,7,33,200,600", help="prompt lengths (comma separated)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    prompts = {f"p{i}": prompt_ids(int(n), vocab, 100 + i) for i, n in enumerate(args.lengths.split(","))}

    with tempfile.TemporaryDirectory() as tmp:
        inp = os.path.join(tmp, "ids.json")
        out = os.path.join(tmp, "ours.safetensors")
        with open(inp, "w") as f:
            json.dump(prompts, f)
        cmd = [args.deepinfer, "score", "--model", args.engine_model or args.model, "--input", inp, "--output", out,
               "--threads", str(args.threads)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(json.dumps({"error": "deepinfer score failed", "cmd": " ".join(cmd),
                              "rc": r.returncode, "stderr": r.stderr[-4000:]}))
            return 1
        ours = load_file(out)

    res = {"model": args.model, "engine_model": args.engine_model or args.model, "per_prompt": {}}
    worst = 0.0
    argmax_ok = True
    for name, ids in prompts.items():
        with torch.no_grad():
            ref = model(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()
        mine = ours[f"{name}.logits"]
        d = float(np.abs(ref - mine).max())
        same = bool((ref.argmax(-1) == mine.argmax(-1)).all())
        res["per_prompt"][name] = {"len": len(ids), "max_abs_diff": d, "argmax_equal": same,
                                   "ref_abs_max": float(np.abs(ref).max())}
        worst = max(worst, d)
        argmax_ok &= same
    res["max_abs_diff"] = worst
    res["argmax_equal"] = argmax_ok
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Check model.py against an oracle golden set (reference logits and DSpark drafts).

  python check.py ../../../shared/oracle/v41-tiny-dev

Runs in float64 and prints the largest difference; exits non-zero above 1e-6.
"""

import json
import os
import sys

import numpy as np
import torch
from safetensors.numpy import load_file

from model import V41, EngramHasher


def main():
    d = sys.argv[1]
    cfg = json.load(open(os.path.join(d, "config.json")))
    w = load_file(os.path.join(d, "model.safetensors"))
    g = load_file(os.path.join(d, "golden.safetensors"))
    m = V41(cfg, w, dtype=torch.float64)
    tm = json.load(open(os.path.join(d, "engram_token_map.json")))["token_map"]
    hasher = EngramHasher(m.c, tm)
    head = m.W("head.weight")
    worst, i = 0.0, 0
    with torch.no_grad():
        while f"p{i}.input_ids" in g:
            ids = g[f"p{i}.input_ids"].astype(np.int64)
            full = np.concatenate([ids, g[f"p{i}.greedy_ids"][:-1].astype(np.int64)])
            h, feats = m(torch.as_tensor(full[None]), torch.as_tensor(hasher(full[None])), want_features=True)
            lg = (h @ head.T)[0].numpy()
            d1 = np.abs(lg[: len(ids)] - g[f"p{i}.logits"]).max()
            d2 = np.abs(lg[len(ids) - 1 :] - g[f"p{i}.greedy_logits"]).max()
            line = f"p{i} prompt={d1:.2e} continuation={d2:.2e}"
            worst = max(worst, d1, d2)
            if f"p{i}.dspark.steps" in g:
                d5 = 0.0
                for s, k in enumerate(g[f"p{i}.dspark.steps"]):
                    P = len(ids) + int(k)  # tokens consumed before the block
                    ctx = torch.as_tensor(full[None, :P])
                    anchor = int(g[f"p{i}.dspark.anchor_ids"][s])
                    seq = torch.as_tensor(np.concatenate([full[:P], [anchor]])[None])
                    want = g[f"p{i}.dspark.draft_ids"][s].astype(np.int64)
                    hid, normed, mem = m.draft(feats[:, :P], seq, torch.tensor([[P]]), torch.as_tensor(want[None, None]))
                    last = f"mtp.{m.n_stages - 1}"
                    logits = normed @ head.T + mem @ m.W(last + ".markov_head.head.weight").T
                    conf = torch.sigmoid(torch.cat([hid, mem], -1) @ m.W(last + ".confidence_head.proj.weight")[0])
                    d5 = max(d5, np.abs(logits[0, 0].numpy() - g[f"p{i}.dspark.logits"][s]).max(),
                             np.abs(conf[0, 0].numpy() - g[f"p{i}.dspark.confidence"][s]).max())
                    assert (logits[0, 0].argmax(-1).numpy() == want).all(), "draft ids disagree"
                    del ctx
                line += f" dspark={d5:.2e}"
                worst = max(worst, d5)
            print(line)
            i += 1
    print(f"worst {worst:.3e}")
    sys.exit(0 if worst < 1e-6 else 1)


if __name__ == "__main__":
    main()

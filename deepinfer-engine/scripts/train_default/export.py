"""Turn train.py's output into the embedded default's files in the repository.

  python export.py --trained /tmp/train-default --dir /tmp/default-model   # a model directory
  python export.py --trained /tmp/train-default --repo                     # the gzipped assets

Rows of the vocabulary the corpus never used: zero embeddings, and the shared "unused"
output row (see train.py) in `head.weight` and the Markov head. Weights are stored as bf16.
"""

import argparse
import gzip
import json
import os
import shutil

import numpy as np
import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
DATA = os.path.join(REPO, "deepinfer-engine", "data")
CONFIG = os.path.join(REPO, "deepinfer-engine", "src", "runtime", "default_config.json")
def vocab_rows(name):
    """'in' for tables indexed by token id, 'out' for output heads over the vocabulary."""
    if name == "embed.weight" or name.endswith(".markov_head.embed.weight"):
        return "in"
    if name == "head.weight" or name.endswith(".markov_head.head.weight"):
        return "out"
    return None


def full_weights(trained):
    z = np.load(os.path.join(trained, "trained.npz"))
    vocab = z["vocab"]
    V = json.load(open(CONFIG))["text_config"]["vocab_size"]
    out = {}
    for key in z.files:
        if not key.startswith("w/"):
            continue
        name, v = key[2:], z[key]
        if vocab_rows(name) == "in":
            full = np.zeros((V, v.shape[1]), np.float32)
            full[vocab] = v
            v = full
        elif vocab_rows(name) == "out":
            full = np.repeat(v[-1:], V, 0)
            full[vocab] = v[:-1]
            v = full
        out[name] = torch.from_numpy(np.ascontiguousarray(v)).to(torch.bfloat16)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trained", required=True)
    ap.add_argument("--dir")
    ap.add_argument("--repo", action="store_true")
    args = ap.parse_args()
    w = full_weights(args.trained)
    tmap = os.path.join(args.trained, "engram_token_map.json")
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
        save_file(w, os.path.join(args.dir, "model.safetensors"))
        shutil.copy(CONFIG, os.path.join(args.dir, "config.json"))
        shutil.copy(tmap, os.path.join(args.dir, "engram_token_map.json"))
    if args.repo:
        os.makedirs(DATA, exist_ok=True)
        tmp = os.path.join(args.trained, "model.safetensors")
        save_file(w, tmp)
        for src, dst in ((tmp, "default-model.safetensors.gz"), (tmap, "default-engram-token-map.json.gz")):
            with open(src, "rb") as f, gzip.GzipFile(os.path.join(DATA, dst), "wb", 9, mtime=0) as g:
                g.write(f.read())
            print(dst, os.path.getsize(os.path.join(DATA, dst)), "bytes")


if __name__ == "__main__":
    main()

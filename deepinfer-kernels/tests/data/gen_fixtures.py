#!/usr/bin/env python3
"""Regenerates tests/data/numpy_ref.json from the NumPy references of the DeepSeek models.

  python3 tests/data/gen_fixtures.py /path/to/shared/reference > tests/data/numpy_ref.json

Every input is float32-representable (generated as float32); the references compute in
float64. The Rust tests (tests/numpy_ref.rs) feed the same inputs to the CPU backend.
"""
import json
import math
import sys
import types

import numpy as np

sys.modules.setdefault("safetensors", types.ModuleType("safetensors"))
sn = types.ModuleType("safetensors.numpy")
sn.load_file = None
sys.modules["safetensors.numpy"] = sn
sys.path.insert(0, sys.argv[1])
import v4_numpy_ref as v4  # noqa: E402
import v41_numpy_ref as v41  # noqa: E402

rng = np.random.default_rng(7)


def r32(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(np.float64)


def L(a):
    return np.asarray(a, dtype=np.float64).ravel().tolist()


out = {}

# ---- RoPE with YaRN frequencies ------------------------------------------------------------
S, H, d, r = 5, 3, 16, 8
p = {"rope_theta": 10000.0, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
     "beta_fast": 32, "beta_slow": 1}
f = v4.inv_freq_for(p, r)
x = r32(S, H, d)
pos = np.array([0, 1, 7, 100, 4095])
y = v4.rope(x.transpose(1, 0, 2), pos, f).transpose(1, 0, 2)
yi = v4.rope(x.transpose(1, 0, 2), pos, f, sign=-1.0).transpose(1, 0, 2)
out["rope"] = {"S": S, "H": H, "d": d, "theta": 10000.0, "dims": r, "factor": 4.0, "orig": 64.0,
               "beta_fast": 32.0, "beta_slow": 1.0, "inv_freq": L(f), "x": L(x), "pos": pos.tolist(),
               "y": L(y), "y_inv": L(yi), "inv_freq_plain": L(v4.inv_freq_for({"rope_theta": 10000.0}, r))}

# ---- hyper-connections (V4.1 hc_mixes, collapse, merge) ---------------------------------------
S, N, D = 3, 4, 8
m = object.__new__(v41.V41Model)
m.c = {"hc_mult": N, "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "hc_sinkhorn_iters": 5}
X = r32(S, N, D)
fn = r32((2 + N) * N, N * D, scale=0.3)
sc = r32(3, scale=0.5)
base = r32((2 + N) * N, scale=0.5)
m.w = {"p_fn": fn, "p_scale": sc, "p_base": base}
pre, post, C = m.hc_mixes(X, "p")
mix = v4.rms(X.reshape(S, -1), 1e-6) @ fn.T
outv = r32(S, D)
merged = v41.V41Model.merge(X, outv, post, C)
coll = v41.V41Model.collapse(X, pre)
out["hc"] = {"S": S, "N": N, "D": D, "eps": 1e-6, "iters": 5, "X": L(X), "fn": L(fn), "scale": L(sc),
             "base": L(base), "mix": L(mix), "pre": L(pre), "post": L(post), "comb": L(C), "out": L(outv),
             "merged": L(merged), "collapsed": L(coll)}

# ---- V4 compressor (overlap and not) -------------------------------------------------------
S, Dm, c, mr = 12, 16, 8, 4
cfg = {"rms_norm_eps": 1e-6}
mm = object.__new__(v4.Model)
mm.cfg = cfg
mm.f_comp = v4.inv_freq_for({"rope_theta": 160000.0}, 4)
xx = r32(S, Dm)
w = {}
for pfx, cd in (("ov", 2 * c), ("pl", c)):
    w[pfx + ".kv_proj.weight"] = r32(cd, Dm, scale=0.3)
    w[pfx + ".gate_proj.weight"] = r32(cd, Dm, scale=0.3)
    w[pfx + ".position_bias"] = r32(mr, cd, scale=0.3)
    w[pfx + ".kv_norm.weight"] = r32(c, scale=0.5) + 1.0
mm.w = w
e_ov = mm.compress(xx, "ov", mr, c, overlap=True)
e_pl = mm.compress(xx, "pl", mr, c, overlap=False)
out["compress"] = {"S": S, "D": Dm, "c": c, "ratio": mr, "rope_theta": 160000.0, "rope_dims": 4, "x": L(xx),
                   **{k: L(v) for k, v in w.items()}, "ent_overlap": L(e_ov), "ent_plain": L(e_pl)}

# ---- lightning indexer scores + top-k, sink attention ----------------------------------------
S, Hi, di, T, ratio, k = 6, 4, 8, 7, 2, 3
qi = r32(S, Hi, di)
K = r32(T, di)
wts = r32(S, Hi)
pos = np.arange(8, 8 + S)
vis = np.minimum((pos + 1) // ratio, T)
score = np.einsum("sh,sht->st", wts * (di ** -0.5 * Hi ** -0.5), np.maximum(np.einsum("shd,td->sht", qi, K), 0.0))
score = np.where(np.arange(T)[None, :] < vis[:, None], score, -np.inf)
sel = []
for s in range(S):
    order = np.argsort(-score[s], kind="stable")[:k]
    sel.append([int(j) if np.isfinite(score[s, j]) else -1 for j in order])
out["indexer"] = {"S": S, "Hi": Hi, "di": di, "T": T, "k": k, "q": L(qi), "K": L(K), "w": L(wts),
                  "visible": vis.tolist(), "scale": di ** -0.5 * Hi ** -0.5,
                  "score": [x if np.isfinite(x) else None for x in score.ravel().tolist()], "topk": sel}

S, H, d, J = 4, 3, 8, 9
q = r32(S, H, d)
keys = r32(J, d)
allow = rng.random((S, J)) < 0.5
allow[0] = False  # a row with only the sink
sink = r32(H)
lg = np.einsum("shd,jd->shj", q, keys) / math.sqrt(d)
lg = np.where(allow[:, None, :], lg, -np.inf)
mx = np.maximum(lg.max(-1, keepdims=True), sink[None, :, None])
e = np.exp(lg - mx)
prob = e / (e.sum(-1, keepdims=True) + np.exp(sink[None, :, None] - mx))
o = np.einsum("shj,jd->shd", prob, keys)
out["attention"] = {"S": S, "H": H, "d": d, "J": J, "q": L(q), "kv": L(keys), "allow": allow.astype(int).ravel().tolist(),
                    "sink": L(sink), "o": L(o)}

# ---- MoE (V4: score routing with bias; hash routing) ------------------------------------------
S, Dm, E, I, k = 5, 8, 6, 4, 2
cfg = {"num_experts_per_tok": k, "swiglu_limit": 1.5, "moe_intermediate_size": I, "routed_scaling_factor": 2.5,
       "mlp_layer_types": ["moe", "hash_moe"]}
mo = object.__new__(v4.Model)
mo.cfg = cfg
xm = r32(S, Dm)
ids = rng.integers(0, 10, S)
ww = {}
for li in range(2):
    p = f"model.layers.{li}.mlp"
    ww[p + ".gate.weight"] = r32(E, Dm, scale=0.5)
    ww[p + ".gate.e_score_correction_bias"] = r32(E, scale=0.1)
    ww[p + ".gate.tid2eid"] = np.stack([rng.permutation(E)[:k] for _ in range(10)]).astype(np.int64)
    ww[p + ".experts.gate_up_proj"] = r32(E, 2 * I, Dm, scale=0.5)
    ww[p + ".experts.down_proj"] = r32(E, Dm, I, scale=0.5)
    ww[p + ".shared_experts.gate_proj.weight"] = r32(I, Dm, scale=0.5)
    ww[p + ".shared_experts.up_proj.weight"] = r32(I, Dm, scale=0.5)
    ww[p + ".shared_experts.down_proj.weight"] = r32(Dm, I, scale=0.5)
mo.w = ww
moe = {"S": S, "D": Dm, "E": E, "I": I, "k": k, "limit": 1.5, "scale": 2.5, "x": L(xm), "ids": ids.tolist()}
for li in range(2):
    p = f"model.layers.{li}.mlp"
    moe[f"out{li}"] = L(mo.moe(xm, li, ids))
    for key in ("gate.weight", "gate.e_score_correction_bias", "experts.gate_up_proj", "experts.down_proj",
                "shared_experts.gate_proj.weight", "shared_experts.up_proj.weight", "shared_experts.down_proj.weight"):
        moe[f"l{li}.{key}"] = L(ww[p + "." + key])
    moe[f"l{li}.tid2eid"] = ww[p + ".gate.tid2eid"].ravel().tolist()
out["moe"] = moe

# ---- QAT round trips and scalar rounding -----------------------------------------------------
xq = np.concatenate([r32(4, 64), r32(2, 64, scale=1e-3), r32(2, 64, scale=300.0)], 0)
out["qat"] = {"rows": 8, "cols": 64, "x": L(xq), "fp8_32": L(v41.qat_fp8(xq, 32)),
              "mxfp4_32": L(v41.qat_mxfp4(xq, 32)), "nvfp4_16": L(v41.qat_nvfp4(xq, 16))}
grid = np.concatenate([np.arange(-8, 8.01, 0.125), np.arange(-500, 501, 7.5), r32(64, scale=10.0),
                       np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 2.0 ** -10, 2.0 ** -7, 449.0, 1e4])])
grid = grid.astype(np.float32).astype(np.float64)
out["round"] = {"x": L(grid), "e4m3": L(v41._round_e4m3(grid)),
                "e2m1": L(v41._round_e2m1(np.clip(grid, -6, 6)))}

json.dump(out, sys.stdout, separators=(",", ":"))

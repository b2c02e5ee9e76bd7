"""Train deepinfer's embedded default model (a toy: ~1 M parameters besides the vocabulary).

  python train.py --out /tmp/train-default --minutes 60

The architecture is `deepinfer-engine/src/runtime/default_config.json` (the v41-tiny-dev
shapes at DeepSeek's 129,280-token vocabulary). The backbone learns next-token prediction on
the rows of `data.py`; the DSpark drafter (three stages, Markov head, confidence head) learns
to draft the next `dspark_block_size` tokens from the backbone's context features at random
anchors, and its confidence head the chance that each draft is right given the ones before it.

Only the ~19 k token ids the corpus uses get their own embedding and output rows; every
other id shares one output row, trained as a single class whose logit carries
log(number of unused ids), so its probability mass is learned as theirs. `export.py` writes
that shared row for every unused id, so the engine's full-vocabulary softmax gives them the
same (small) total mass.

Fixed seed; PyTorch on the CPU. Not part of CI.
"""

import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

import data
from model import V41, EngramHasher

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
CONFIG = os.path.join(REPO, "deepinfer-engine", "src", "runtime", "default_config.json")


def fnv1a64(b):
    h = 0xCBF29CE484222325
    for x in b:
        h = ((h ^ x) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def engram_token_map(tok, vocab, n):
    """Token -> Engram class: the token's text without the leading-space marker, lowercased,
    hashed (FNV-1a) modulo the compressed vocabulary, so case and spacing variants share rows."""
    out = []
    for t in range(vocab):
        s = tok.id_to_token(t) or ""
        out.append(fnv1a64(s.replace("\u0120", "").lower().encode("utf-8")) % n)
    return out


def init_weights(c, names_shapes, rng):
    """Initial values by tensor role (plain, documented, no tuning)."""
    w = {}
    for name, shape in names_shapes:
        fan_in = shape[-1]
        if name.endswith("norm.weight") or name.endswith("_scale") or name.endswith("q_weight") or name.endswith("k_weight"):
            v = np.ones(shape)
        elif name.endswith("_base") or name.endswith("attn_sink") or name.endswith("gate.bias") or "confidence_head" in name:
            v = np.zeros(shape)
        elif name == "embed.weight" or name.endswith("engram.embed.weight"):
            v = rng.standard_normal(shape)
        elif "markov_head" in name:
            v = 0.02 * rng.standard_normal(shape)
        else:
            v = rng.standard_normal(shape) / math.sqrt(fan_in)
        w[name] = v.astype(np.float32)
    return w


def tensor_shapes(c, vocab_rows, head_rows):
    """Every tensor of the checkpoint with its shape, from the config (the engine's loader
    checks the same list; `export.py` fails loudly if they differ)."""
    D, H, d, r = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["qk_rope_head_dim"]
    N, E, I = c["hc_mult"], c["n_routed_experts"], c["moe_intermediate_size"]
    G, Ro, Rq = c["o_groups"], c["o_lora_rank"], c["q_lora_rank"]
    Hi, di = c["index_n_heads"], c["index_head_dim"]
    mix = 2 * N + N * N
    out = [("embed.weight", [vocab_rows, D]), ("head.weight", [head_rows, D]), ("norm.weight", [D])]
    ratios = c["compress_ratios"][: c["num_hidden_layers"]]

    def block(p, experts, attn_extra):
        s = [(f"{p}.hc_attn_fn", [mix, N * D]), (f"{p}.hc_attn_scale", [3]), (f"{p}.hc_attn_base", [mix]),
             (f"{p}.hc_ffn_fn", [mix, N * D]), (f"{p}.hc_ffn_scale", [3]), (f"{p}.hc_ffn_base", [mix]),
             (f"{p}.attn_norm.weight", [D]), (f"{p}.ffn_norm.weight", [D]),
             (f"{p}.attn.wq_a.weight", [Rq, D]), (f"{p}.attn.q_norm.weight", [Rq]),
             (f"{p}.attn.wq_b.weight", [H * d, Rq]), (f"{p}.attn.wkv.weight", [d, D]),
             (f"{p}.attn.kv_norm.weight", [d]), (f"{p}.attn.attn_sink", [H]),
             (f"{p}.attn.wo_a.weight", [G * Ro, H * d // G]), (f"{p}.attn.wo_b.weight", [D, G * Ro]),
             (f"{p}.ffn.gate.weight", [experts, D]), (f"{p}.ffn.gate.bias", [experts])]
        for w_, shp in (("w1", [I, D]), ("w3", [I, D]), ("w2", [D, I])):
            s += [(f"{p}.ffn.experts.{e}.{w_}.weight", shp) for e in range(experts)]
            s.append((f"{p}.ffn.shared_experts.{w_}.weight", shp))
        return s + attn_extra

    kv_src, idx_src = c["kv_source_layer_ids"], c["index_source_layer_ids"]
    for l in range(c["num_hidden_layers"]):
        p = f"layers.{l}"
        extra = []
        if ratios[l] and l in kv_src:
            extra += [(f"{p}.attn.compressor.wkv.weight", [d, D]), (f"{p}.attn.compressor.norm.weight", [d]),
                      (f"{p}.attn.indexer.wk.weight", [di, d]), (f"{p}.attn.indexer.k_norm.weight", [di])]
            if ratios[l] > 1:
                extra.append((f"{p}.attn.compressor.wgate.weight", [d, D]))
        if ratios[l] and l in idx_src:
            extra += [(f"{p}.attn.indexer.wq_b.weight", [Hi * di, Rq]), (f"{p}.attn.indexer.weights_proj.weight", [Hi, D])]
        if l in c["engram_layer_ids"]:
            li = c["engram_layer_ids"].index(l)
            cols = (c["engram_max_ngram_size"] - 1) * c["engram_n_heads"]
            extra += [(f"{p}.engram.embed.weight", [c["engram_num_embeddings"][li], c["engram_head_dim"]]),
                      (f"{p}.engram.wkv.weight", [(N + 1) * D, cols * c["engram_head_dim"]]),
                      (f"{p}.engram.q_weight", [N, D]), (f"{p}.engram.k_weight", [N, D])]
        out += block(p, c["n_routed_experts"], extra)
    n_st = c["num_nextn_predict_layers"] if c.get("dspark_block_size") else 0
    Rm = c["dspark_markov_rank"]
    for j in range(n_st):
        p = f"mtp.{j}"
        out += block(p, c["dspark_n_routed_experts"] or E, [])
        if j == 0:
            out += [(f"{p}.main_proj.weight", [D, D * len(c["dspark_target_layer_ids"])]), (f"{p}.main_norm.weight", [D])]
        if j == n_st - 1:
            out += [(f"{p}.norm.weight", [D]), (f"{p}.markov_head.embed.weight", [vocab_rows, Rm]),
                    (f"{p}.markov_head.head.weight", [head_rows, Rm]), (f"{p}.confidence_head.proj.weight", [1, D + Rm])]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/train-default-corpus")
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--text-batch", type=int, default=8)
    ap.add_argument("--chat-batch", type=int, default=12)
    ap.add_argument("--anchors", type=int, default=6)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--resume", help="a directory with an earlier run's trained.npz to continue from")
    ap.add_argument("--draft-targets", choices=("target", "corpus"), default="target",
                    help="what the drafter learns to predict: the backbone's greedy tokens (what "
                         "verification accepts) or the corpus tokens")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    os.makedirs(args.out, exist_ok=True)
    cfg = json.load(open(CONFIG))
    from model import flat_config
    c = flat_config(cfg)

    ds = data.build(REPO, args.work)
    vocab = data.used_vocab([ds["text"], ds["chat"]])
    compact = np.full(c["vocab_size"], -1, np.int64)
    compact[vocab] = np.arange(len(vocab))
    n_unused = c["vocab_size"] - len(vocab)
    tok = data.tokenizer(REPO)
    tmap = engram_token_map(tok, c["vocab_size"], c["engram_compressed_vocab_size"])
    hasher = EngramHasher(c, tmap)
    shapes = tensor_shapes(c, len(vocab), len(vocab) + 1)
    init = init_weights(c, shapes, rng)
    if args.resume:
        z = np.load(os.path.join(args.resume, "trained.npz"))
        assert (z["vocab"] == vocab).all(), "the earlier run used another vocabulary"
        init = {k[2:]: z[k] for k in z.files if k.startswith("w/")}
    m = V41(cfg, init)
    m.c["dspark_noise_token_id"] = int(compact[data.NOISE])
    head_name = "head.weight"
    last = f"mtp.{m.n_stages - 1}"
    opt = torch.optim.AdamW(m.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    log_unused = math.log(n_unused)
    Bk = c["dspark_block_size"]
    print(f"vocab used {len(vocab)}, text rows {len(ds['text'])}, chat rows {len(ds['chat'])}", flush=True)

    def logits_of(h, head):
        lg = h @ head.T
        return torch.cat([lg[..., :-1], lg[..., -1:] + log_unused], -1)

    def step_loss(rows):
        ids = torch.as_tensor(rows)
        valid = ids >= 0
        real = ids.clamp(min=0)
        cids = torch.as_tensor(compact)[real]
        hashes = torch.as_tensor(hasher(np.where(rows >= 0, rows, data.EOS)))
        h, feats = m(cids, hashes, want_features=True)
        lg = logits_of(h[:, :-1], m.W(head_name))
        tgt = cids[:, 1:].masked_fill(~valid[:, 1:], -100)
        loss = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1), ignore_index=-100)
        # DSpark: anchors P with all Bk targets inside the row
        lens = valid.sum(1).numpy()
        anchors = np.stack([rng.integers(1, max(2, n - Bk), size=args.anchors) for n in lens])
        anchors = torch.as_tensor(anchors)
        at = (anchors[..., None] + torch.arange(Bk)).clamp(max=cids.shape[1] - 2)  # predicting at+1
        if args.draft_targets == "target":
            greedy = lg.detach().argmax(-1).clamp(max=len(vocab) - 1)  # [B, S-1]
            nxt = torch.gather(greedy, 1, at.flatten(1)).view(*anchors.shape, Bk)
        else:
            nxt = torch.gather(cids, 1, (at + 1).flatten(1)).view(*anchors.shape, Bk)
        ok = (anchors[..., None] + 1 + torch.arange(Bk)) < torch.as_tensor(lens)[:, None, None]
        hid, normed, mem = m.draft(feats.detach(), cids, anchors, nxt)
        dl = logits_of(normed, m.W(head_name)) + logits_of(mem, m.W(last + ".markov_head.head.weight")) - torch.cat(
            [torch.zeros(len(vocab)), torch.tensor([log_unused])])
        dtgt = nxt.masked_fill(~ok, -100)
        dloss = F.cross_entropy(dl.reshape(-1, dl.shape[-1]), dtgt.reshape(-1), ignore_index=-100)
        conf = torch.cat([hid, mem], -1).detach() @ m.W(last + ".confidence_head.proj.weight")[0]
        right = (dl.argmax(-1) == nxt).float()
        closs = F.binary_cross_entropy_with_logits(conf[ok], right[ok])
        acc = right[ok].mean().item()
        return loss, dloss, closs, acc

    t0, step = time.time(), 0
    total = args.minutes * 60
    text, chat = ds["text"], ds["chat"]
    hist = []
    while time.time() - t0 < total:
        frac = (time.time() - t0) / total
        lr = args.lr * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        rows = text[rng.integers(0, len(text), args.text_batch)] if step % 2 == 0 else chat[rng.integers(0, len(chat), args.chat_batch)]
        loss, dloss, closs, acc = step_loss(rows)
        opt.zero_grad()
        (loss + 0.5 * dloss + 0.1 * closs).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        hist.append((loss.item(), dloss.item(), closs.item(), acc))
        step += 1
        if step % 50 == 0:
            a = np.mean(hist[-50:], 0)
            print(f"step {step} t={time.time() - t0:.0f}s lr={lr:.2e} loss={a[0]:.3f} draft={a[1]:.3f} conf={a[2]:.3f} draft_acc={a[3]:.3f}", flush=True)
        if step % 500 == 0:
            save(args.out, m, vocab, tmap, step)
    save(args.out, m, vocab, tmap, step)


def save(out, m, vocab, tmap, step):
    w = {k: v.numpy() for k, v in m.state_dict_upstream().items()}
    np.savez(os.path.join(out, "trained.npz"), vocab=vocab, **{"w/" + k: v for k, v in w.items()})
    json.dump({"token_map": tmap}, open(os.path.join(out, "engram_token_map.json"), "w"))
    json.dump({"step": step}, open(os.path.join(out, "progress.json"), "w"))


if __name__ == "__main__":
    main()

"""DeepSeek-V4.1 (`deepseek_v41`) text forward pass and DSpark drafter in PyTorch, for training.

A batched, differentiable rewrite of the architecture that `deepinfer-engine` serves, written
from `v41-architecture.md` and checked against the oracle's reference logits (`check.py`), so
weights trained here mean the same thing in the engine. Every row of a batch is one sequence
that starts at position 0 (no cache: training only needs the one-shot forward).

What does not learn by gradient: the indexer and the candidate-block filter choose entries
with a hard top-k, so their weights (`indexer.*`) keep their initial values, and the router's
`gate.bias` (DeepSeek's auxiliary-loss-free balance bias) is not trained either.
"""

import math

import numpy as np
import torch
import torch.nn.functional as F


def flat_config(cfg):
    """HF-style config (text fields under text_config) -> one flat dict with defaults."""
    t = dict(cfg.get("text_config", cfg))
    for k, v in cfg.items():
        if k not in ("text_config", "vision_config"):
            t.setdefault(k, v)
    for k, v in (("num_nextn_predict_layers", 0), ("candidate_source_layer_id", -1),
                 ("candidate_topk_blocks", 0), ("candidate_block_size", 0), ("engram_layer_ids", []),
                 ("norm_topk_prob", True), ("gate_temp", 1.0), ("dspark_block_size", 0),
                 ("dspark_target_layer_ids", []), ("dspark_num_experts_per_tok", 0)):
        t.setdefault(k, v)
    return t


def last_at_or_below(layers, l):
    c = [j for j in layers if j <= l]
    return max(c) if c else None


def inv_freq(theta, r, scaling=None):
    """RoPE inverse frequencies for r rotary channels; YaRN without magnitude scaling."""
    f = 1.0 / theta ** (np.arange(0, r, 2, dtype=np.float64) / r)
    if scaling and scaling.get("rope_type", scaling.get("type")) == "yarn":
        factor, orig = scaling["factor"], scaling["original_max_position_embeddings"]
        bf, bs = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

        def corr(n_rot):
            return r * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(theta))

        lo, hi = max(math.floor(corr(bf)), 0), min(math.ceil(corr(bs)), r - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(r // 2) - lo) / (hi - lo), 0.0, 1.0)
        f = f / factor * ramp + f * (1.0 - ramp)
    return f


def rms(x, eps, w=None):
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    return y * w if w is not None else y


def rope(x, cos, sin, sign=1.0):
    """Interleaved RoPE on the trailing 2*len(freq) channels. x [..., S, (H,) dim]; cos/sin
    broadcast to x[..., ::2] of the rotary part (shape [S, 1?, r/2])."""
    r = 2 * cos.shape[-1]
    a, b = x[..., -r::2], x[..., -r + 1 :: 2]
    s = sign * sin
    rot = torch.stack([a * cos - b * s, a * s + b * cos], -1).flatten(-2)
    return torch.cat([x[..., :-r], rot], -1)


class V41(torch.nn.Module):
    """Parameters are kept under the checkpoint's own (upstream) tensor names."""

    def __init__(self, cfg, weights, dtype=torch.float32):
        super().__init__()
        self.c = c = flat_config(cfg)
        self.dtype = dtype
        self.params = torch.nn.ParameterDict(
            {k.replace(".", "/"): torch.nn.Parameter(torch.as_tensor(v, dtype=dtype)) for k, v in weights.items()})
        self.L = c["num_hidden_layers"]
        self.ratios = list(c["compress_ratios"][: self.L])
        self.kv_src, self.idx_src = list(c["kv_source_layer_ids"]), list(c["index_source_layer_ids"])
        self.r = c["qk_rope_head_dim"]
        self.f_main = inv_freq(c["rope_theta"], self.r)
        self.f_comp = inv_freq(c["compress_rope_theta"], self.r, c.get("rope_scaling"))
        self.n_stages = int(c["num_nextn_predict_layers"]) if c["dspark_block_size"] else 0
        self.targets = list(c["dspark_target_layer_ids"]) if self.n_stages else []
        self.experts = {}  # prefix -> number of routed experts

    def W(self, k):
        return self.params[k.replace(".", "/")]

    def has(self, k):
        return k.replace(".", "/") in self.params

    def state_dict_upstream(self):
        return {k.replace("/", "."): v.detach() for k, v in self.params.items()}

    def cs(self, pos, freq):
        ang = torch.as_tensor(np.asarray(pos, np.float64)[:, None] * freq[None, :], dtype=self.dtype)
        return torch.cos(ang), torch.sin(ang)

    # ---- mHC --------------------------------------------------------------------------
    def hc_mixes(self, X, pfx):
        c = self.c
        N, eps = c["hc_mult"], c["hc_eps"]
        mix = rms(X.flatten(-2), c["rms_norm_eps"]) @ self.W(pfx + "_fn").T
        sc, b = self.W(pfx + "_scale"), self.W(pfx + "_base")
        pre = torch.sigmoid(mix[..., :N] * sc[0] + b[:N]) + eps
        post = 2.0 * torch.sigmoid(mix[..., N : 2 * N] * sc[1] + b[N : 2 * N])
        C = torch.softmax(mix[..., 2 * N :].unflatten(-1, (N, N)) * sc[2] + b[2 * N :].view(N, N), -1) + eps
        C = C / (C.sum(-2, keepdim=True) + eps)
        for _ in range(c["hc_sinkhorn_iters"] - 1):
            C = C / (C.sum(-1, keepdim=True) + eps)
            C = C / (C.sum(-2, keepdim=True) + eps)
        return pre, post, C

    @staticmethod
    def collapse(X, pre):
        return torch.einsum("...n,...nd->...d", pre, X)

    @staticmethod
    def merge(X, out, post, C):
        return post[..., None] * out[..., None, :] + torch.einsum("...jk,...jd->...kd", C, X)

    # ---- Engram -----------------------------------------------------------------------
    def engram(self, X, hash_ids, l):
        c = self.c
        p = f"layers.{l}.engram"
        N, D = X.shape[-2], X.shape[-1]
        emb = self.W(p + ".embed.weight")[hash_ids]  # [B, S, cols, head_dim]
        kv = emb.flatten(-2) @ self.W(p + ".wkv.weight").T
        key, value = kv[..., : N * D].unflatten(-1, (N, D)), kv[..., N * D :]
        eps = c["rms_norm_eps"]
        wgt = self.W(p + ".q_weight") * self.W(p + ".k_weight")
        rstd = torch.rsqrt((X * X).mean(-1) + eps) * torch.rsqrt((key * key).mean(-1) + eps)
        dot = (X * wgt * key).sum(-1) * rstd / math.sqrt(D)
        gate = torch.sigmoid(torch.sign(dot) * torch.sqrt(torch.clamp(dot.abs(), min=1e-6)))
        return X + gate[..., None] * value[..., None, :]

    # ---- attention --------------------------------------------------------------------
    def attention(self, x, l, S, shared):
        c = self.c
        p = f"layers.{l}.attn"
        B = x.shape[0]
        H, d, Wn, eps = c["num_attention_heads"], c["head_dim"], c["sliding_window"], c["rms_norm_eps"]
        ratio = self.ratios[l]
        cos, sin = shared["cs_comp"] if ratio else shared["cs_main"]
        qr = rms(x @ self.W(p + ".wq_a.weight").T, eps, self.W(p + ".q_norm.weight"))
        q = rope((qr @ self.W(p + ".wq_b.weight").T).view(B, S, H, d), cos[:, None], sin[:, None])
        kv = rope(rms(x @ self.W(p + ".wkv.weight").T, eps, self.W(p + ".kv_norm.weight")), cos, sin)
        i = torch.arange(S)
        allow = ((i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - Wn)).expand(B, S, S)
        keys = kv
        if ratio:
            src = last_at_or_below(self.kv_src, l)
            if l == src:
                self.compress(x, l, S, shared)
            ents = shared["comp"][src]
            if l in self.idx_src:
                shared["topk"] = self.indexer(x, qr, l, S, shared)
            keys = torch.cat([kv, ents], 1)
            allow = torch.cat([allow, shared["topk"]], 2)
        lg = torch.einsum("bshd,bjd->bshj", q, keys) / math.sqrt(d)
        lg = lg.masked_fill(~allow[:, :, None, :], float("-inf"))
        sink = self.W(p + ".attn_sink")[None, None, :, None]
        mx = torch.maximum(lg.amax(-1, keepdim=True), sink).detach()
        e = torch.exp(lg - mx)
        prob = e / (e.sum(-1, keepdim=True) + torch.exp(sink - mx))
        o = torch.einsum("bshj,bjd->bshd", prob, keys)
        o = rope(o, cos[:, None], sin[:, None], sign=-1.0)
        G, Ro = c["o_groups"], c["o_lora_rank"]
        Wa = self.W(p + ".wo_a.weight").view(G, Ro, H * d // G)
        z = torch.einsum("bsgi,gri->bsgr", o.reshape(B, S, G, H * d // G), Wa).flatten(-2)
        return z @ self.W(p + ".wo_b.weight").T

    def compress(self, x, l, S, shared):
        c = self.c
        p = f"layers.{l}.attn"
        ratio, d, eps = self.ratios[l], c["head_dim"], c["rms_norm_eps"]
        B = x.shape[0]
        a = x @ self.W(p + ".compressor.wkv.weight").T
        if ratio == 1:
            lat, gpos = a, np.arange(S)
        else:
            z = x @ self.W(p + ".compressor.wgate.weight").T
            n = S // ratio
            full = n * ratio
            w = torch.softmax(z[:, :full].reshape(B, n, ratio, d), 2)
            lat = (w * a[:, :full].reshape(B, n, ratio, d)).sum(2)
            gpos = np.arange(n) * ratio
        lat = rms(lat, eps, self.W(p + ".compressor.norm.weight"))
        cos, sin = self.cs(gpos, self.f_comp)
        shared["comp"][l] = rope(lat, cos, sin)
        k = rms(lat @ self.W(p + ".indexer.wk.weight").T, eps, self.W(p + ".indexer.k_norm.weight"))
        shared["ikey"][l] = rope(k, cos, sin)

    @torch.no_grad()
    def indexer(self, x, qr, l, S, shared):
        """Bool [B, S, T]: the compressed entries each query reads (top index_topk)."""
        c = self.c
        p = f"layers.{l}.attn.indexer"
        B = x.shape[0]
        ratio = self.ratios[l]
        Hi, di = c["index_n_heads"], c["index_head_dim"]
        owner = last_at_or_below([j for j in self.kv_src if j in self.idx_src], l)
        K = shared["ikey"][owner]
        T = K.shape[1]
        cos, sin = shared["cs_comp"]
        qi = rope((qr @ self.W(p + ".wq_b.weight").T).view(B, S, Hi, di), cos[:, None], sin[:, None])
        wts = (x @ self.W(p + ".weights_proj.weight").T) * (di**-0.5 * Hi**-0.5)
        score = torch.einsum("bsh,bsht->bst", wts, torch.relu(torch.einsum("bshd,btd->bsht", qi, K)))
        vis = (torch.arange(S) + 1) // ratio
        visible = torch.arange(T)[None, :] < vis[:, None]  # [S, T]
        score = score.masked_fill(~visible, float("-inf"))
        cs = c["candidate_source_layer_id"]
        if l == cs and c["candidate_topk_blocks"] > 0:
            shared["cand"] = self.candidate_blocks(score, vis)
        elif 0 <= cs < l and c["candidate_topk_blocks"] > 0:
            score = score.masked_fill(~shared["cand"], float("-inf"))
        k = min(c["index_topk"], T)
        order = torch.sort(score, dim=-1, descending=True, stable=True).indices[..., :k]
        sel = torch.zeros(B, S, T, dtype=torch.bool)
        sel.scatter_(-1, order, True)
        return sel & visible

    def candidate_blocks(self, score, vis):
        c = self.c
        bs, keep_n = c["candidate_block_size"], c["candidate_topk_blocks"]
        B, S, T = score.shape
        nb = -(-T // bs)
        padded = torch.full((B, S, nb * bs), float("-inf"), dtype=score.dtype)
        padded[..., :T] = score
        bsc = padded.view(B, S, nb, bs).amax(-1)
        last = torch.div(vis - 1, bs, rounding_mode="floor")
        bsc = bsc.masked_fill(torch.arange(nb)[None, :] == last[:, None], float("inf"))
        kk = min(keep_n, nb)
        order = torch.sort(bsc, dim=-1, descending=True, stable=True).indices[..., :kk]
        keep = torch.zeros(B, S, nb, dtype=torch.bool)
        keep.scatter_(-1, order, torch.gather(bsc, -1, order) > float("-inf"))
        return keep.repeat_interleave(bs, -1)[..., :T]

    # ---- MoE --------------------------------------------------------------------------
    def expert_stack(self, p):
        n = self.experts.get(p)
        if n is None:
            n = 0
            while self.has(f"{p}.experts.{n}.w1.weight"):
                n += 1
            self.experts[p] = n
        return [torch.stack([self.W(f"{p}.experts.{e}.{w}.weight") for e in range(n)]) for w in ("w1", "w3", "w2")]

    def moe(self, x, p, topk):
        """Every routed expert runs on every row, weighted by its routing weight (0 when not
        chosen): the same sum as the sparse dispatch, and simple to differentiate."""
        c = self.c
        lim = c["swiglu_limit"]
        logit = (x @ self.W(p + ".gate.weight").T) / c["gate_temp"]
        s = torch.sqrt(F.softplus(logit))
        biased = (s + self.W(p + ".gate.bias")).detach()
        sel = torch.sort(biased, dim=-1, descending=True, stable=True).indices[..., :topk]
        wts = torch.gather(s, -1, sel)
        if c["norm_topk_prob"] and topk > 1:
            wts = wts / (wts.sum(-1, keepdim=True) + 1e-20)
        wts = wts * c["routed_scaling_factor"]
        dense = torch.zeros_like(s).scatter(-1, sel, wts)  # [..., E]

        def act(g, u):
            if lim > 0:
                g, u = torch.clamp(g, max=lim), torch.clamp(u, -lim, lim)
            return g * torch.sigmoid(g) * u

        w1, w3, w2 = self.expert_stack(p)
        a = act(torch.einsum("...d,eid->...ei", x, w1), torch.einsum("...d,eid->...ei", x, w3))
        out = torch.einsum("...ei,edi->...d", a * dense[..., None], w2)
        sp = p + ".shared_experts"
        a = act(x @ self.W(sp + ".w1.weight").T, x @ self.W(sp + ".w3.weight").T)
        return out + a @ self.W(sp + ".w2.weight").T, sel

    # ---- backbone ---------------------------------------------------------------------
    def forward(self, ids, hashes=None, want_features=False):
        """ids [B, S] (each row starts at position 0); hashes [B, S, n_engram_layers, cols].
        Returns final hidden states [B, S, D] (and the DSpark context features)."""
        c = self.c
        B, S = ids.shape
        eps, N = c["rms_norm_eps"], c["hc_mult"]
        pos = np.arange(S)
        shared = {"cs_main": self.cs(pos, self.f_main), "cs_comp": self.cs(pos, self.f_comp), "comp": {}, "ikey": {}}
        X = self.W("embed.weight")[ids][:, :, None, :].expand(B, S, N, -1)
        pre_mix = torch.zeros(B, S, N, dtype=self.dtype)
        pre_mix[..., 0] = 1.0
        feats = []
        for l in range(self.L):
            lp = f"layers.{l}"
            if l in c["engram_layer_ids"]:
                X = self.engram(X, hashes[:, :, c["engram_layer_ids"].index(l)], l)
            if l in self.targets:
                feats.append(X.mean(-2))
            attn_pre, attn_post, attn_C = self.hc_mixes(X, lp + ".hc_attn")
            xin = rms(self.collapse(X, pre_mix), eps, self.W(lp + ".attn_norm.weight"))
            X = self.merge(X, self.attention(xin, l, S, shared), attn_post, attn_C)
            ffn_pre, ffn_post, ffn_C = self.hc_mixes(X, lp + ".hc_ffn")
            fin = rms(self.collapse(X, attn_pre), eps, self.W(lp + ".ffn_norm.weight"))
            fo, _ = self.moe(fin, lp + ".ffn", c["num_experts_per_tok"])
            X = self.merge(X, fo, ffn_post, ffn_C)
            pre_mix = ffn_pre
        h = rms(self.collapse(X, pre_mix), eps, self.W("norm.weight"))
        if want_features:
            return h, torch.cat(feats, -1)
        return h

    # ---- DSpark drafter -------------------------------------------------------------------
    def draft(self, feats, ids, anchors, next_ids):
        """Teacher-forced DSpark blocks. feats [B, S, F] (backbone context features, no grad),
        ids [B, S], anchors [B, A] positions P >= 1 whose block is [ids[P], noise x (B-1)] at
        positions P..P+Bk-1 with context window rows of positions P-W..P-1; next_ids [B, A, Bk]
        the true tokens of positions P+1..P+Bk (the Markov correction of row i reads the true
        token before it). Returns (hidden [B, A, Bk, D] before the final norm, markov embeddings
        [B, A, Bk, R], markov logits term input) to be scored by the caller."""
        c = self.c
        Bsz, S = ids.shape
        A = anchors.shape[1]
        Bk, N, eps, Wn = c["dspark_block_size"], c["hc_mult"], c["rms_norm_eps"], c["sliding_window"]
        H, d = c["num_attention_heads"], c["head_dim"]
        main_x = rms(feats @ self.W("mtp.0.main_proj.weight").T, eps, self.W("mtp.0.main_norm.weight"))
        cos_all, sin_all = self.cs(np.arange(S + Bk), self.f_main)
        # context rows: positions P-W .. P-1 (clamped; rows before 0 masked out)
        off = torch.arange(-Wn, 0)
        cpos = anchors[..., None] + off  # [B, A, W]
        cvalid = cpos >= 0
        cposc = cpos.clamp(min=0)
        bpos = anchors[..., None] + torch.arange(Bk)  # [B, A, Bk]
        tok = torch.full((Bsz, A, Bk), c["dspark_noise_token_id"], dtype=torch.long)
        tok[..., 0] = torch.gather(ids, 1, anchors)
        X = self.W("embed.weight")[tok][..., None, :].expand(Bsz, A, Bk, N, -1)
        pre_mix = torch.zeros(Bsz, A, Bk, N, dtype=self.dtype)
        pre_mix[..., 0] = 1.0
        bcos, bsin = cos_all[bpos], sin_all[bpos]  # [B, A, Bk, r/2]
        ccos, csin = cos_all[cposc], sin_all[cposc]
        topk = c["dspark_num_experts_per_tok"] or c["num_experts_per_tok"]
        gidx = cposc.reshape(Bsz, A * Wn)
        for j in range(self.n_stages):
            lp = f"mtp.{j}"
            p = lp + ".attn"
            ctx = rms(main_x @ self.W(p + ".wkv.weight").T, eps, self.W(p + ".kv_norm.weight"))
            ctx = torch.gather(ctx, 1, gidx[..., None].expand(-1, -1, ctx.shape[-1])).view(Bsz, A, Wn, -1)
            ctx = rope(ctx, ccos, csin)
            attn_pre, attn_post, attn_C = self.hc_mixes(X, lp + ".hc_attn")
            xin = rms(self.collapse(X, pre_mix), eps, self.W(lp + ".attn_norm.weight"))
            qr = rms(xin @ self.W(p + ".wq_a.weight").T, eps, self.W(p + ".q_norm.weight"))
            q = rope((qr @ self.W(p + ".wq_b.weight").T).unflatten(-1, (H, d)), bcos[..., None, :], bsin[..., None, :])
            kv = rope(rms(xin @ self.W(p + ".wkv.weight").T, eps, self.W(p + ".kv_norm.weight")), bcos, bsin)
            keys = torch.cat([ctx, kv], 2)  # [B, A, W + Bk, d]
            allow = torch.cat([cvalid, torch.ones(Bsz, A, Bk, dtype=torch.bool)], -1)
            lg = torch.einsum("bashd,bajd->bashj", q, keys) / math.sqrt(d)
            lg = lg.masked_fill(~allow[:, :, None, None, :], float("-inf"))
            sink = self.W(p + ".attn_sink")[:, None]
            mx = torch.maximum(lg.amax(-1, keepdim=True), sink).detach()
            e = torch.exp(lg - mx)
            prob = e / (e.sum(-1, keepdim=True) + torch.exp(sink - mx))
            o = rope(torch.einsum("bashj,bajd->bashd", prob, keys), bcos[..., None, :], bsin[..., None, :], sign=-1.0)
            G, Ro = c["o_groups"], c["o_lora_rank"]
            Wa = self.W(p + ".wo_a.weight").view(G, Ro, H * d // G)
            z = torch.einsum("basgi,gri->basgr", o.reshape(Bsz, A, Bk, G, H * d // G), Wa).flatten(-2)
            X = self.merge(X, z @ self.W(p + ".wo_b.weight").T, attn_post, attn_C)
            ffn_pre, ffn_post, ffn_C = self.hc_mixes(X, lp + ".hc_ffn")
            fin = rms(self.collapse(X, attn_pre), eps, self.W(lp + ".ffn_norm.weight"))
            fo, _ = self.moe(fin, lp + ".ffn", topk)
            X = self.merge(X, fo, ffn_post, ffn_C)
            pre_mix = ffn_pre
        last = f"mtp.{self.n_stages - 1}"
        hid = self.collapse(X, pre_mix)
        prev = torch.cat([tok[..., :1], next_ids[..., :-1]], -1)  # token before each row's target
        m = self.W(last + ".markov_head.embed.weight")[prev]
        return hid, rms(hid, eps, self.W(last + ".norm.weight")), m


class EngramHasher:
    """Engram n-gram bucket ids, vectorised over a batch; the same integers as the reference."""

    def __init__(self, c, token_map):
        self.n, self.heads = c["engram_max_ngram_size"], c["engram_n_heads"]
        self.token_map = np.asarray(token_map, dtype=np.int64)
        self.pad = int(self.token_map[c["engram_pad_token_id"]])
        seen, self.primes = set(), []
        for _ in c["engram_layer_ids"]:
            per_n = []
            for _ in range(self.n - 1):
                cur, sizes = c["engram_vocab_size"] - 1, []
                for _ in range(self.heads):
                    cur += 1
                    while not _is_prime(cur) or cur in seen:
                        cur += 1
                    seen.add(cur)
                    sizes.append(cur)
                per_n.append(sizes)
            self.primes.append(per_n)
        bound = max(1, (np.iinfo(np.int64).max // c["engram_compressed_vocab_size"]) // 2)
        self.mult = np.stack([np.random.default_rng(10007 * lid).integers(0, bound, size=(self.n,), dtype=np.int64) * 2 + 1
                              for lid in c["engram_layer_ids"]])
        self.offsets = []
        for li, per_n in enumerate(self.primes):
            flat = [p for sizes in per_n for p in sizes]
            self.offsets.append(np.cumsum([0] + flat[:-1]).astype(np.int64))
            assert sum(flat) == c["engram_num_embeddings"][li], "engram_num_embeddings disagrees with the primes"

    def __call__(self, ids):
        """ids int64 [B, S] (each row from position 0) -> int64 [B, S, layers, (n-1)*heads]."""
        ids = np.asarray(ids, np.int64)
        Bn, S = ids.shape
        mapped = self.token_map[ids]
        shifted = [mapped]
        for sh in range(1, self.n):
            v = np.full_like(mapped, self.pad)
            v[:, sh:] = mapped[:, :-sh]
            shifted.append(v)
        out = np.zeros((Bn, S, len(self.primes), (self.n - 1) * self.heads), np.int64)
        with np.errstate(over="ignore"):
            for li in range(len(self.primes)):
                rolling = shifted[0] * self.mult[li, 0]
                for sh in range(1, self.n):
                    rolling = rolling ^ (shifted[sh] * self.mult[li, sh])
                    for h in range(self.heads):
                        col = (sh - 1) * self.heads + h
                        out[:, :, li, col] = np.mod(rolling, self.primes[li][sh - 1][h]) + self.offsets[li][col]
        return out


def _is_prime(n):
    if n < 2:
        return False
    for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d //= 2
        r += 1
    for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True

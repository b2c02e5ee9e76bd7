#!/usr/bin/env python3
"""Write the tiny DeepSeek V4 checkpoint that the peers and our engine all load.

`deepseek_v4`, hidden 256, 6 layers, 8 routed experts top-2, vocab 129,280; the other fields
follow the v4-tiny-dev oracle fixture, widened 4x with the hidden size, with the real V4
compression ratios (4 and 128: llama.cpp's deepseek4 loader accepts no others).
Random weights from a fixed seed, scaled so activations and logits stay O(1) (like the
fixture's), saved with transformers' save_pretrained (safetensors).

Outputs (under --root, default /work/peers):
  v4-tiny-256/            f32, HF names (what transformers and `deepinfer` load)
  v4-tiny-256-bf16/       the same weights rounded to bf16 (HF names)
  v4-tiny-256-upstream/   f32 under DeepSeek's checkpoint names + DeepSeek config keys and the
                          V4 tokenizer: the input of llama.cpp's convert_hf_to_gguf.py
  v4-tiny-256-upstream-bf16/  the same in bf16

Usage: venv/bin/python make_model.py [--root DIR] [--seed 0] [--check-mapping ORACLE_DIR]
"""

import argparse
import json
import math
import os
import shutil
import sys

import torch

CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "vocab_size": 129280,
    "hidden_size": 256,
    "num_hidden_layers": 6,
    "layer_types": [
        "sliding_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "sliding_attention",
    ],
    "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe", "moe", "moe"],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
    "compress_rope_theta": 160000.0,
    "num_attention_heads": 8,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "partial_rotary_factor": 0.25,
    "q_lora_rank": 128,
    "o_groups": 2,
    "o_lora_rank": 64,
    "index_n_heads": 16,
    "index_head_dim": 64,
    "index_topk": 64,
    "sliding_window": 128,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 128,
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "scoring_func": "sqrtsoftplus",
    "swiglu_limit": 2.0,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-06,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "rope_parameters": {
        "main": {"partial_rotary_factor": 0.25, "rope_theta": 10000.0, "rope_type": "default"},
        "compress": {
            "attention_factor": 1.0,
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 16.0,
            "original_max_position_embeddings": 65536,
            "partial_rotary_factor": 0.25,
            "rope_theta": 160000.0,
            "rope_type": "yarn",
        },
    },
    "max_position_embeddings": 1048576,
    "num_nextn_predict_layers": 0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": None,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
    "use_cache": True,
    "dtype": "float32",
}


def randomize(model, cfg, seed):
    """Fixed-seed weights with the oracle fixture's scales: linears N(0, 1/fan_in), norms
    1 + N(0, 0.1), embeddings N(0, 1), mHC/sink/position parameters O(1), hash routing a
    random distinct expert pair per token."""
    g = torch.Generator().manual_seed(seed)

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=g, dtype=torch.float64).mul(std).add(mean).float()

    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            s = tuple(p.shape)
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith("embed_tokens.weight"):
                v = normal(s, 1.0)
            elif name.endswith("lm_head.weight"):
                v = normal(s, 1.0 / math.sqrt(s[1]))
            elif "norm" in name and p.dim() == 1:
                v = normal(s, 0.1, 1.0)
            elif leaf in ("gate_up_proj", "down_proj") and p.dim() == 3:
                v = normal(s, 1.0 / math.sqrt(s[2]))
            elif leaf in ("fn", "hc_fn"):
                v = normal(s, 1.0 / math.sqrt(s[1]))
            elif leaf in ("base", "hc_base"):
                v = normal(s, 0.5)
            elif leaf in ("scale", "hc_scale"):
                v = normal(s, 0.1, 1.0)
            elif leaf in ("sinks", "position_bias"):
                v = normal(s, 0.5)
            elif p.dim() == 2:
                v = normal(s, 1.0 / math.sqrt(s[1]))
            else:
                raise SystemExit(f"no init rule for {name} {s}")
            p.copy_(v)
        for name, b in sorted(model.named_buffers()):
            if name.endswith("tid2eid"):
                n_exp, k = cfg.n_routed_experts, cfg.num_experts_per_tok
                keys = torch.rand((b.shape[0], n_exp), generator=g)
                b.copy_(keys.argsort(dim=-1)[:, :k].to(b.dtype))
            elif name.endswith("e_score_correction_bias"):
                b.copy_(normal(tuple(b.shape), 0.1))


# --- HF module names -> DeepSeek checkpoint names (checked against the oracle fixture) ---
_ATTN = {
    "self_attn.q_a_proj.weight": "attn.wq_a.weight",
    "self_attn.q_a_norm.weight": "attn.q_norm.weight",
    "self_attn.q_b_proj.weight": "attn.wq_b.weight",
    "self_attn.kv_proj.weight": "attn.wkv.weight",
    "self_attn.kv_norm.weight": "attn.kv_norm.weight",
    "self_attn.o_a_proj.weight": "attn.wo_a.weight",
    "self_attn.o_b_proj.weight": "attn.wo_b.weight",
    "self_attn.sinks": "attn.attn_sink",
    "self_attn.compressor.kv_proj.weight": "attn.compressor.wkv.weight",
    "self_attn.compressor.gate_proj.weight": "attn.compressor.wgate.weight",
    "self_attn.compressor.kv_norm.weight": "attn.compressor.norm.weight",
    "self_attn.compressor.position_bias": "attn.compressor.ape",
    "self_attn.compressor.indexer.kv_proj.weight": "attn.indexer.compressor.wkv.weight",
    "self_attn.compressor.indexer.gate_proj.weight": "attn.indexer.compressor.wgate.weight",
    "self_attn.compressor.indexer.kv_norm.weight": "attn.indexer.compressor.norm.weight",
    "self_attn.compressor.indexer.position_bias": "attn.indexer.compressor.ape",
    "self_attn.compressor.indexer.q_b_proj.weight": "attn.indexer.wq_b.weight",
    "self_attn.compressor.indexer.scorer.weights_proj.weight": "attn.indexer.weights_proj.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "attn_hc.fn": "hc_attn_fn",
    "attn_hc.base": "hc_attn_base",
    "attn_hc.scale": "hc_attn_scale",
    "ffn_hc.fn": "hc_ffn_fn",
    "ffn_hc.base": "hc_ffn_base",
    "ffn_hc.scale": "hc_ffn_scale",
    "mlp.gate.weight": "ffn.gate.weight",
    "mlp.gate.e_score_correction_bias": "ffn.gate.bias",
    "mlp.shared_experts.gate_proj.weight": "ffn.shared_experts.w1.weight",
    "mlp.shared_experts.up_proj.weight": "ffn.shared_experts.w3.weight",
    "mlp.shared_experts.down_proj.weight": "ffn.shared_experts.w2.weight",
}
_ROOT = {
    "model.embed_tokens.weight": "embed.weight",
    "lm_head.weight": "head.weight",
    "model.norm.weight": "norm.weight",
    "model.hc_head.hc_fn": "hc_head_fn",
    "model.hc_head.hc_base": "hc_head_base",
    "model.hc_head.hc_scale": "hc_head_scale",
}


def to_upstream(sd):
    """HF state dict -> DeepSeek checkpoint tensors (unfused experts, i32 tid2eid)."""
    out = {}
    for name, t in sd.items():
        if name in _ROOT:
            out[_ROOT[name]] = t
            continue
        parts = name.split(".")
        assert parts[0] == "model" and parts[1] == "layers", name
        i, rest = parts[2], ".".join(parts[3:])
        pre = f"layers.{i}."
        if rest in _ATTN:
            out[pre + _ATTN[rest]] = t
        elif rest == "mlp.gate.tid2eid":
            out[pre + "ffn.gate.tid2eid"] = t.to(torch.int32)
        elif rest == "mlp.experts.gate_up_proj":
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[pre + f"ffn.experts.{e}.w1.weight"] = t[e, :inter].contiguous()
                out[pre + f"ffn.experts.{e}.w3.weight"] = t[e, inter:].contiguous()
        elif rest == "mlp.experts.down_proj":
            for e in range(t.shape[0]):
                out[pre + f"ffn.experts.{e}.w2.weight"] = t[e].contiguous()
        else:
            raise SystemExit(f"no upstream name for {name}")
    return out


def check_mapping(oracle_dir):
    """The mapping must turn the oracle's HF-named weights into its upstream-named ones exactly."""
    from safetensors.torch import load_file

    hf = load_file(os.path.join(oracle_dir, "model.safetensors"))
    up = load_file(os.path.join(oracle_dir, "model.upstream.safetensors"))
    mine = to_upstream(hf)
    assert set(mine) == set(up), (set(mine) ^ set(up))
    for k in up:
        assert mine[k].dtype == up[k].dtype and torch.equal(mine[k], up[k]), k
    print(f"mapping check: {len(up)} upstream tensors identical to {oracle_dir}")


def upstream_config(cfg):
    """DeepSeek-style config keys that llama.cpp's converter reads (legacy V4 names)."""
    c = dict(cfg)
    rates = cfg["compress_rates"]
    c["compress_ratios"] = [rates.get(t, 0) for t in cfg["layer_types"]]
    c["num_hash_layers"] = cfg["mlp_layer_types"].count("hash_moe")
    assert cfg["mlp_layer_types"] == ["hash_moe"] * c["num_hash_layers"] + ["moe"] * (
        len(cfg["mlp_layer_types"]) - c["num_hash_layers"]
    )
    c["qk_rope_head_dim"] = int(cfg["head_dim"] * cfg["partial_rotary_factor"])
    comp = cfg["rope_parameters"]["compress"]
    c["rope_scaling"] = {
        "type": "yarn",
        "factor": comp["factor"],
        "original_max_position_embeddings": comp["original_max_position_embeddings"],
        "beta_fast": comp["beta_fast"],
        "beta_slow": comp["beta_slow"],
    }
    del c["rope_parameters"]
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default="/work/peers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", default=None, help="dir with tokenizer.json (default ROOT/tokenizer)")
    ap.add_argument("--check-mapping", default="/work/shared/oracle/v4-tiny-dev")
    args = ap.parse_args()

    from safetensors.torch import save_file
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    if args.check_mapping and os.path.isdir(args.check_mapping):
        check_mapping(args.check_mapping)

    torch.manual_seed(args.seed)
    cfg = DeepseekV4Config(**{k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type")})
    model = DeepseekV4ForCausalLM(cfg).eval()
    randomize(model, cfg, args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    tok_dir = args.tokenizer or os.path.join(args.root, "tokenizer")

    out = os.path.join(args.root, "v4-tiny-256")
    model.save_pretrained(out, safe_serialization=True)
    print(f"wrote {out} ({n_params / 1e6:.1f} M parameters, f32)")
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out_bf = out + "-bf16"
    model.to(torch.bfloat16).save_pretrained(out_bf, safe_serialization=True)  # in place: last use
    print(f"wrote {out_bf} (bf16)")
    for d in (out, out_bf):
        for n in ("tokenizer.json", "tokenizer_config.json"):
            if os.path.exists(os.path.join(tok_dir, n)):
                shutil.copy(os.path.join(tok_dir, n), d)

    with open(os.path.join(out, "config.json")) as f:
        saved_cfg = json.load(f)
    ucfg = upstream_config(saved_cfg)
    for suffix, dtype in (("-upstream", torch.float32), ("-upstream-bf16", torch.bfloat16)):
        d = out + suffix
        os.makedirs(d, exist_ok=True)
        up = to_upstream(sd)
        up = {
            k: (v if v.dtype == torch.int32 or v.dim() < 2 else v.to(dtype)).contiguous()
            for k, v in up.items()
        }
        save_file(up, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        c = dict(ucfg)
        c["dtype"] = "float32" if dtype == torch.float32 else "bfloat16"
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f, indent=2)
        for n in ("tokenizer.json", "tokenizer_config.json"):
            if os.path.exists(os.path.join(tok_dir, n)):
                shutil.copy(os.path.join(tok_dir, n), d)
        print(f"wrote {d}")


if __name__ == "__main__":
    sys.exit(main())

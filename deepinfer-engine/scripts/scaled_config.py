"""Writes a scaled-up copy of the embedded default V4.1 config (random-weight benchmarks).

    python3 deepinfer-engine/scripts/scaled_config.py OUT.json [HIDDEN]

Hidden size HIDDEN (default 1024) with heads, LoRA ranks, experts and the vocabulary scaled to
match; the layer pattern and every other field stay as in the embedded default.
"""
import json
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
cfg = json.loads((here.parent / "src/runtime/default_config.json").read_text())
hidden = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
t = cfg["text_config"]
f = hidden // t["hidden_size"]
t.update(
    hidden_size=hidden,
    num_attention_heads=t["num_attention_heads"] * 4,
    head_dim=128,
    q_lora_rank=t["q_lora_rank"] * f,
    o_lora_rank=t["o_lora_rank"] * f,
    moe_intermediate_size=t["moe_intermediate_size"] * f,
    n_routed_experts=32,
    num_experts_per_tok=4,
)
Path(sys.argv[1]).write_text(json.dumps(cfg, indent=1))

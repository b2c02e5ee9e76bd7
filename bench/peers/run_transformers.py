#!/usr/bin/env python3
"""Hugging Face transformers (PyTorch CPU) figures on the tiny V4 checkpoint.

  venv/bin/python run_transformers.py --model /work/peers/v4-tiny-256 --dtype f32 --threads 2

Prints one JSON line per dtype:
  prefill_tok_s    one 1,024-token prompt, one forward with the cache on (best of --repeat)
  decode_tok_s     batch 1: after a 16-token prompt, 64 greedy steps with the KV cache, one token
                   per forward (tokens / wall time of the 64 steps)
  offline_*        16 prompts x 256 tokens -> 64 new tokens each, one batched greedy generate
                   (no EOS stop): total = (16*256 + 16*64) / wall, gen = 16*64 / wall
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch


def ids(n, vocab, seed, batch=1):
    rng = np.random.default_rng(seed)
    return torch.tensor(rng.integers(2, vocab, size=(batch, n)), dtype=torch.long)


def prefill(model, prompt, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        with torch.no_grad():
            model(prompt, use_cache=True)
        times.append(time.perf_counter() - t)
    n = prompt.shape[1]
    return n / min(times), n / statistics.median(times)


def decode(model, prompt, steps):
    with torch.no_grad():
        out = model(prompt, use_cache=True)
        pkv = out.past_key_values
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        t = time.perf_counter()
        for _ in range(steps):
            out = model(tok, past_key_values=pkv, use_cache=True)
            pkv = out.past_key_values
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
        dt = time.perf_counter() - t
    return steps / dt


def offline(model, prompts, new_tokens):
    t = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            prompts,
            attention_mask=torch.ones_like(prompts),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    dt = time.perf_counter() - t
    b, n = prompts.shape
    gen = out.shape[1] - n
    assert gen == new_tokens, (gen, new_tokens)
    return (b * (n + gen)) / dt, (b * gen) / dt, dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/work/peers/v4-tiny-256")
    ap.add_argument("--dtype", default="f32,bf16", help="comma list of f32, bf16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--batch-prompt-len", type=int, default=256)
    ap.add_argument("--batch-new-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip", default="", help="comma list of parts to skip: prefill,decode,offline")
    args = ap.parse_args()

    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    skip = set(filter(None, args.skip.split(",")))

    for dt_name in args.dtype.split(","):
        dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dt_name]
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).eval()
        model.generation_config.eos_token_id = None
        vocab = model.config.vocab_size
        res = {
            "peer": "transformers",
            "version": transformers.__version__,
            "torch": torch.__version__,
            "dtype": dt_name,
            "threads": args.threads,
        }
        # warm-up: allocator, kernels, lazy inits
        with torch.no_grad():
            model(ids(64, vocab, 7), use_cache=True)
        if "prefill" not in skip:
            best, med = prefill(model, ids(args.prompt_len, vocab, 1), args.repeat)
            res.update(prefill_len=args.prompt_len, prefill_tok_s=round(best, 1), prefill_tok_s_median=round(med, 1))
        if "decode" not in skip:
            res.update(decode_steps=args.decode_tokens,
                       decode_tok_s=round(decode(model, ids(16, vocab, 2), args.decode_tokens), 2))
        if "offline" not in skip:
            total, gen, wall = offline(model, ids(args.batch_prompt_len, vocab, 3, args.batch), args.batch_new_tokens)
            res.update(offline=f"{args.batch}x{args.batch_prompt_len}->{args.batch_new_tokens}",
                       offline_total_tok_s=round(total, 1), offline_gen_tok_s=round(gen, 1),
                       offline_wall_s=round(wall, 2))
        print(json.dumps(res), flush=True)
        del model
    return 0


if __name__ == "__main__":
    sys.exit(main())

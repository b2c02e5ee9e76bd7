"""Side-by-side baseline for the `trace` bench of deepinfer-kv.

A small re-implementation, written for this comparison, of the block-manager algorithm of
nano-vllm (https://github.com/GeeeekExplorer/nano-vllm, nanovllm/engine/block_manager.py), as
its source describes it: a deque of free block ids (allocation takes the front and removes the id
with deque.remove), a set of used ids, a dict from chained xxh64 hash to block id, token lists
compared on hit, hashes computed over numpy bytes of the token ids, a new block allocated when a
decoded token starts one and the last block hashed when a decoded token fills it. Only the block
manager is modelled; the scheduler loop is the same as the Rust trace (benches/trace.rs).

Run: python3 benches/compare/nano_vllm_trace.py   (needs: pip install xxhash numpy)
and compare with: cargo run --release -p deepinfer-kv --example cpu_figures
"""

import time
from collections import deque

import numpy as np
import xxhash

REQUESTS = 10_000
SYSTEM_PROMPTS = 8
SYSTEM_LEN = 2_048
DECODE = 128
BLOCK = 256
RUNNING = 256
POOL = 8_192


class Seq:
    def __init__(self, tokens):
        self.tokens = list(tokens)
        self.table = []
        self.cached_tokens = 0

    def __len__(self):
        return len(self.tokens)

    def num_blocks(self):
        return (len(self.tokens) + BLOCK - 1) // BLOCK

    def block(self, i):
        return self.tokens[i * BLOCK:(i + 1) * BLOCK]


class Blk:
    __slots__ = ("bid", "refs", "h", "toks")

    def __init__(self, bid):
        self.bid, self.refs, self.h, self.toks = bid, 0, -1, []


class NanoBlockManager:
    def __init__(self, n):
        self.blocks = [Blk(i) for i in range(n)]
        self.by_hash = {}
        self.free = deque(range(n))
        self.used = set()

    @staticmethod
    def chain_hash(toks, parent=-1):
        x = xxhash.xxh64()
        if parent != -1:
            x.update(parent.to_bytes(8, "little"))
        x.update(np.array(toks).tobytes())
        return x.intdigest()

    def _take(self, bid):
        b = self.blocks[bid]
        b.refs, b.h, b.toks = 1, -1, []
        self.free.remove(bid)
        self.used.add(bid)
        return b

    def allocate(self, seq):
        h, miss = -1, False
        for i in range(seq.num_blocks()):
            toks = seq.block(i)
            h = self.chain_hash(toks, h) if len(toks) == BLOCK else -1
            bid = self.by_hash.get(h, -1)
            if bid == -1 or self.blocks[bid].toks != toks:
                miss = True
            if miss:
                b = self._take(self.free[0])
            else:
                seq.cached_tokens += BLOCK
                if bid in self.used:
                    b = self.blocks[bid]
                    b.refs += 1
                else:
                    b = self._take(bid)
            if h != -1:
                b.h, b.toks = h, toks
                self.by_hash[h] = b.bid
            seq.table.append(b.bid)

    def deallocate(self, seq):
        for bid in reversed(seq.table):
            b = self.blocks[bid]
            b.refs -= 1
            if b.refs == 0:
                self.used.remove(bid)
                self.free.append(bid)
        seq.table.clear()

    def may_append(self, seq):
        last = self.blocks[seq.table[-1]]
        r = len(seq) % BLOCK
        if r == 1:
            seq.table.append(self._take(self.free[0]).bid)
        elif r == 0:
            toks = seq.block(seq.num_blocks() - 1)
            parent = self.blocks[seq.table[-2]].h if len(seq.table) > 1 else -1
            h = self.chain_hash(toks, parent)
            last.h, last.toks = h, toks
            self.by_hash[h] = last.bid


def prompt(i):
    sys_id = i % SYSTEM_PROMPTS
    suffix = 64 + (i * 37) % 449
    p = [sys_id * 10_000 + t for t in range(SYSTEM_LEN)]
    p += [1_000_000 + i * 1_000 + t for t in range(suffix)]
    return p


def run(prompts):
    m = NanoBlockManager(POOL)
    running, nxt, hit, asked = [], 0, 0, 0
    while nxt < len(prompts) or running:
        while len(running) < RUNNING and nxt < len(prompts):
            s = Seq(prompts[nxt])
            m.allocate(s)
            hit += s.cached_tokens
            asked += len(s)
            running.append([s, 0])
            nxt += 1
        i = 0
        while i < len(running):
            s, done = running[i]
            s.tokens.append(7 + done)
            m.may_append(s)
            running[i][1] = done + 1
            if done + 1 == DECODE:
                m.deallocate(s)
                running[i] = running[-1]
                running.pop()
            else:
                i += 1
    return hit / asked


if __name__ == "__main__":
    prompts = [prompt(i) for i in range(REQUESTS)]
    best_wall = best_cpu = float("inf")
    for _ in range(2):
        t, c = time.perf_counter(), time.process_time()
        rate = run(prompts)
        best_wall = min(best_wall, time.perf_counter() - t)
        best_cpu = min(best_cpu, time.process_time() - c)
    print(f"nano-vllm block manager (python re-implementation): best of 2: "
          f"{REQUESTS / best_wall:.1f} requests/s by wall time, "
          f"{REQUESTS / best_cpu:.1f} requests/s by CPU time, hit rate {rate:.4f}")

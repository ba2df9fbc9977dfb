#!/usr/bin/env python3
"""Time HF `tokenizers` encode on the same workloads as `deepinfer bench tokenizer` (single thread).

Workloads (identical to tools/bench_tokenizer.c):
  doc       the corpus strings joined by "\\n" into one document, encoded whole
  messages  every corpus string encoded on its own call
each with added-token recognition (HF's default encode, add_special_tokens=False).
Prints one JSON object: {"doc_mb_s": .., "messages_mb_s": .., "doc_tokens": .., "version": ..}.

usage: bench_tokenizer_hf.py --tokenizer FILE --corpus CORPUS.jsonl [--seconds S]
"""
import argparse
import json
import os
import time

# one thread: the Rust side would otherwise parallelise batch calls; single encodes are sequential anyway
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import tokenizers  # noqa: E402  (after the environment is set)
from tokenizers import Tokenizer  # noqa: E402


def rate(fn, nbytes, seconds):
    """MB/s of fn() over at least `seconds` and 3 runs (after one warm-up run)."""
    fn()
    runs, t0 = 0, time.perf_counter()
    while True:
        fn()
        runs += 1
        dt = time.perf_counter() - t0
        if runs >= 3 and dt >= seconds:
            return nbytes * runs / dt / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--seconds", type=float, default=1.0)
    a = ap.parse_args()
    tok = Tokenizer.from_file(a.tokenizer)
    with open(a.corpus, encoding="utf-8") as f:
        texts = [json.loads(line)["t"] for line in f]
    doc = "\n".join(texts)
    doc_bytes = len(doc.encode())
    msg_bytes = sum(len(t.encode()) for t in texts)
    out = {
        "version": tokenizers.__version__,
        "doc_tokens": len(tok.encode(doc, add_special_tokens=False).ids),
        "doc_mb_s": rate(lambda: tok.encode(doc, add_special_tokens=False), doc_bytes, a.seconds),
        "messages_mb_s": rate(lambda: [tok.encode(t, add_special_tokens=False) for t in texts], msg_bytes, a.seconds),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()

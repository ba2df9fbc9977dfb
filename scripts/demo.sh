#!/bin/sh
# `make demo`: the main job on the embedded default model. Writes the tiny random-weight checkpoint
# (real V4.1 layout, real vocabulary size) under models/tiny, inspects it and generates from it:
# greedy, then sampled with DSpark drafting at every decode step (tokens/s on stderr).
set -e
bin="$1"
out=models/tiny
"$bin" mkmodel --preset tiny --seed 1 --out "$out"
"$bin" inspect --model "$out"
"$bin" generate --model "$out" --prompt-ids 0,128803,1000,2000,128804 --max-tokens 16 --temperature 0
"$bin" generate --model "$out" --prompt-ids 0,128803,1000,2000,128804 --max-tokens 16 --temperature 0.6 --seed 1 \
    --dspark
# text in, text out through the V4 vocabulary (V4.1 reuses it) when the tokenizer is in the tree
tok=data/tokenizer/deepseek-v4
if [ -f "$tok/tokenizer.json" ]; then
    "$bin" generate --model "$out" --tokenizer "$tok" --prompt "<｜User｜>Hello!<｜Assistant｜>" --max-tokens 8 \
        --temperature 0
fi

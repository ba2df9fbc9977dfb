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

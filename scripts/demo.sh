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
# text in, text out: the model ships its tokenizer (models/tiny/TOKENIZER.md says which)
"$bin" generate --model "$out" --prompt "<｜User｜>Hello!<｜Assistant｜>" --max-tokens 8 --temperature 0
# an offline batch of chat requests (OpenAI batch format) through the engine
printf '%s\n' \
  '{"custom_id":"demo-1","url":"/v1/chat/completions","body":{"model":"DeepSeek-V4.1-Flash","messages":[{"role":"user","content":"Hello!"}],"max_tokens":12,"seed":7}}' \
  '{"custom_id":"demo-2","url":"/v1/chat/completions","body":{"model":"DeepSeek-V4.1-Flash","messages":[{"role":"user","content":"Give me a date."}],"max_tokens":12,"thinking":{"type":"disabled"},"response_format":{"type":"regex","regex":"20[0-9]{2}-[01][0-9]-[0-3][0-9]"}}}' \
  > models/demo-requests.jsonl
"$bin" run --model "$out" --input models/demo-requests.jsonl --output models/demo-results.jsonl
cat models/demo-results.jsonl

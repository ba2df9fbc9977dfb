#!/usr/bin/env python3
"""Generate the chat-encoding / request-conversion golden data in tests/data/chat/.

The reference is the `deepseek-recipe` Python package (PyPI, 0.2.0), DeepSeek's own request
converter and V4.1 prompt encoder. Each case is a protocol request body; the reference converts
it (or rejects it) and renders the V4.1 prompt. We record, per case:
  api, request                   the input
  error {status, type, message}  when the reference rejects the request
  prompt                         the rendered prompt (UTF-8)
  special                        [[start, end], ...] UTF-8 byte ranges of template special tokens
  ids / ids_error                prompt token ids with --tokenizer, or the reference's encoding error
  options                        what conversion extracted (sampling, parsing, constraint)

usage: pip install deepseek-recipe==0.2.0
       python3 scripts/gen_chat_golden.py [--tokenizer data/tokenizer/deepseek-v4/tokenizer.json]
The committed ids were made with data/tokenizer/deepseek-v4/tokenizer.json (the official V4 file; the
V4.1 file was not obtainable): same BPE, but no <｜System｜> token, so prompts that need it have
"ids_error" (the reference's own failure) instead of "ids".
"""
import argparse
import json
import os
import sys

import deepseek_recipe as dr

M = "DeepSeek-V4.1-Flash"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Web search — returns snippets",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "limit": {"type": "integer"},
        "filters": {"type": "object", "properties": {"lang": {"type": "string"}}}}}}}
NOPARAM = {"type": "function", "function": {"name": "now"}}


def tc(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


def chat(messages, **kw):
    body = {"model": M, "messages": messages}
    body.update(kw)
    return ("chat", body)


U = lambda c: {"role": "user", "content": c}
S = lambda c: {"role": "system", "content": c}
A = lambda c, **kw: dict({"role": "assistant", "content": c}, **kw)
T = lambda i, c: {"role": "tool", "tool_call_id": i, "content": c}
OFF = {"thinking": {"type": "disabled"}}
ON = {"thinking": {"type": "enabled"}}

CASES = [
    # --- basic roles, thinking on/off -----------------------------------------------------
    ("empty_user_nothink", chat([U("")], **OFF)),
    ("special_literal_user_nothink", chat([U("<｜User｜>")], **OFF)),
    ("think_literal_user_nothink", chat([U("<think>")], **OFF)),
    ("x_user_nothink", chat([U("x")], **OFF)),
    ("hello_think_default", chat([U("Hello!")])),
    ("hello_think_on", chat([U("Hello!")], **ON)),
    ("system_user_nothink", chat([S("You are terse."), U("Hi")], **OFF)),
    ("system_user_think", chat([S("You are terse."), U("Hi")])),
    ("two_systems", chat([S("A"), S("B"), U("Hi")])),
    ("mid_system", chat([U("q1"), A("a1"), S("new rule"), U("q2")], **OFF)),
    ("mid_system_last", chat([U("q1"), A("a1"), S("new rule")])),
    ("system_only", chat([S("only system")], **OFF)),
    ("latest_reminder", chat([S("s"), U("q"), {"role": "latest_reminder", "content": "remember"}])),
    ("latest_reminder_nothink", chat([U("q"), {"role": "latest_reminder", "content": "r"}], **OFF)),
    ("unicode_mix", chat([U("日本語テキスト 🚀 émigré \u00a0 tabs\t\tand\nnewlines\r\n")], **OFF)),
    ("special_literals_everywhere", chat([S("<｜System｜><｜end▁of▁sentence｜>"),
                                          U("</think><｜Assistant｜><｜DSML｜ calls>"),
                                          A("<｜User｜>", reasoning_content="<think>"),
                                          U("<｜begin▁of▁sentence｜>")])),
    ("content_parts", chat([U([{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}])], **OFF)),
    ("system_parts", chat([{"role": "system", "content": [{"type": "text", "text": "s1"}, {"type": "text", "text": "s2"}]}, U("u")], **OFF)),
    ("consecutive_users", chat([U("a"), U("b")], **OFF)),
    ("null_assistant_content", chat([U("a"), {"role": "assistant", "content": None}, U("b")], **OFF)),
    # --- reasoning effort ----------------------------------------------------------------
    ("effort_low", chat([U("q")], reasoning_effort="low")),
    ("effort_minimal", chat([U("q")], reasoning_effort="minimal")),
    ("effort_medium", chat([U("q")], reasoning_effort="medium")),
    ("effort_high", chat([U("q")], reasoning_effort="high")),
    ("effort_xhigh", chat([U("q")], reasoning_effort="xhigh")),
    ("effort_ultra", chat([U("q")], reasoning_effort="ultra")),
    ("effort_max", chat([U("q")], reasoning_effort="max")),
    ("effort_none", chat([U("q")], reasoning_effort="none")),
    ("effort_max_nothink", chat([U("q")], reasoning_effort="max", **OFF)),
    ("effort_bad", chat([U("q")], reasoning_effort="extreme")),
    ("effort_int", chat([U("q")], reasoning_effort=37)),
    # --- multi-turn and reasoning dropping -------------------------------------------------
    ("multiturn_think_drop", chat([U("q1"), A("a1", reasoning_content="r1"), U("q2")])),
    ("multiturn_nothink", chat([U("q1"), A("a1", reasoning_content="r1"), U("q2")], **OFF)),
    ("multiturn_three", chat([S("sys"), U("q1"), A("a1", reasoning_content="r1"), U("q2"),
                              A("a2", reasoning_content="r2"), U("q3")])),
    ("assistant_last_think", chat([U("q1"), A("a1", reasoning_content="r1")])),
    ("assistant_last_nothink", chat([U("q1"), A("a1")], **OFF)),
    ("assistant_missing_reasoning", chat([U("q1"), A("a1"), U("q2"), A("a2")])),
    ("prefix_continuation", chat([U("q1"), A("The answer is", prefix=True)], **OFF)),
    ("prefix_continuation_think", chat([U("q1"), A("", reasoning_content="Let me", prefix=True)])),
    # --- tools ---------------------------------------------------------------------------
    ("tools_nothink", chat([U("Weather in Paris?")], tools=[WEATHER], **OFF)),
    ("tools_think", chat([S("Be brief."), U("Weather in Paris?")], tools=[WEATHER])),
    ("tools_three", chat([U("x")], tools=[WEATHER, SEARCH, NOPARAM], **OFF)),
    ("tools_choice_none", chat([U("x")], tools=[WEATHER], tool_choice="none", **OFF)),
    ("tools_choice_required_nothink", chat([U("x")], tools=[WEATHER], tool_choice="required", **OFF)),
    ("tools_choice_required_think", chat([U("x")], tools=[WEATHER], tool_choice="required")),
    ("tools_choice_named", chat([U("x")], tools=[WEATHER, SEARCH], tool_choice={"type": "function", "function": {"name": "search"}}, **OFF)),
    ("tools_choice_unknown_name", chat([U("x")], tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}, **OFF)),
    ("tool_call_roundtrip_nothink", chat([U("Weather in Paris and Rome?"),
        A("", tool_calls=[tc("call_a", "get_weather", "{\"city\": \"Paris\", \"unit\": \"c\"}"),
                          tc("call_b", "get_weather", "{\"city\":\"Rome\"}")]),
        T("call_b", "22C sunny"), T("call_a", "15C rain")], tools=[WEATHER], **OFF)),
    ("tool_call_roundtrip_think", chat([U("Weather in Paris?"),
        A("Checking.", reasoning_content="I need the tool.", tool_calls=[tc("c1", "get_weather", "{\"city\":\"Paris\"}")]),
        T("c1", "15C")], tools=[WEATHER])),
    ("tool_call_then_answer", chat([U("Weather?"),
        A("", reasoning_content="r1", tool_calls=[tc("c1", "get_weather", "{\"city\":\"Paris\"}")]),
        T("c1", "15C"), A("It is 15C.", reasoning_content="r2"), U("And tomorrow?")], tools=[WEATHER])),
    ("tool_call_nontrivial_args", chat([U("s"),
        A(None, tool_calls=[tc("c1", "search", "{\"query\":\"a \\\"quoted\\\" <b>\",\"limit\":5,\"filters\":{\"lang\":\"fr\"},\"flag\":true,\"none\":null,\"list\":[1,2.5,\"x\"]}")]),
        T("c1", "results")], tools=[SEARCH], **OFF)),
    ("tool_call_empty_args", chat([U("time?"), A("", tool_calls=[tc("c1", "now", "{}")]), T("c1", "noon")], tools=[NOPARAM], **OFF)),
    ("tool_result_then_user", chat([U("w"), A("", tool_calls=[tc("c1", "get_weather", "{\"city\":\"X\"}")]),
        T("c1", "ok"), U("thanks")], tools=[WEATHER], **OFF)),
    ("tool_without_call", chat([U("x"), T("zz", "y")], **OFF)),
    ("tool_wrong_id", chat([U("x"), A("", tool_calls=[tc("c1", "now", "{}")]), T("c2", "y")], tools=[NOPARAM], **OFF)),
    ("tool_calls_no_tools_declared", chat([U("x"), A("", tool_calls=[tc("c1", "now", "{}")]), T("c1", "y")], **OFF)),
    ("tool_call_bad_args", chat([U("x"), A("", tool_calls=[tc("c1", "now", "[1,2]")]), T("c1", "y")], tools=[NOPARAM], **OFF)),
    ("tool_call_invalid_json_args", chat([U("x"), A("", tool_calls=[tc("c1", "now", "{not json")]), T("c1", "y")], tools=[NOPARAM], **OFF)),
    ("tool_missing_result", chat([U("x"), A("", tool_calls=[tc("c1", "now", "{}")]), U("next")], tools=[NOPARAM], **OFF)),
    ("tool_result_parts", chat([U("x"), A("", tool_calls=[tc("c1", "now", "{}")]),
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "p1"}, {"type": "text", "text": "p2"}]}], tools=[NOPARAM], **OFF)),
    # --- response_format -----------------------------------------------------------------
    ("json_object_ok", chat([U("Reply in JSON please")], response_format={"type": "json_object"}, **OFF)),
    ("json_object_no_word", chat([U("q1")], response_format={"type": "json_object"})),
    ("json_object_with_system", chat([S("Answer as json."), U("q")], response_format={"type": "json_object"})),
    ("json_schema", chat([U("q1")], response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}, **OFF)),
    ("json_schema_with_tools", chat([S("sys"), U("q1")], tools=[WEATHER], response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string"}}}, **OFF)),
    ("response_format_text", chat([U("q1")], response_format={"type": "text"}, **OFF)),
    ("response_format_bad", chat([U("q1")], response_format={"type": "yaml"}, **OFF)),
    # --- sampling options and validation ---------------------------------------------------
    ("sampling_all", chat([U("q")], temperature=0.3, top_p=0.9, max_tokens=100, stop=["END", "\n\n"], seed=7,
                          logprobs=True, top_logprobs=5, presence_penalty=0.5, frequency_penalty=0.25, **OFF)),
    ("sampling_think_temp_ignored", chat([U("q")], temperature=0.3, top_p=0.5)),
    ("stop_string", chat([U("q")], stop="STOP", **OFF)),
    ("max_completion_tokens", chat([U("q")], max_completion_tokens=64, **OFF)),
    ("max_tokens_zero", chat([U("q")], max_tokens=0, **OFF)),
    ("max_tokens_huge", chat([U("q")], max_tokens=10**7, **OFF)),
    ("temperature_bad", chat([U("q")], temperature=3.5, **OFF)),
    ("top_p_bad", chat([U("q")], top_p=1.5, **OFF)),
    ("top_logprobs_bad", chat([U("q")], logprobs=True, top_logprobs=21, **OFF)),
    ("n_two", chat([U("q")], n=2, **OFF)),
    ("stream_usage", chat([U("q")], stream=True, stream_options={"include_usage": True}, **OFF)),
    ("empty_body", ("chat", {})),
    ("empty_messages", chat([])),
    ("bad_role", chat([{"role": "bogus", "content": "x"}])),
    ("developer_role", chat([{"role": "developer", "content": "dev"}, U("x")])),
    ("bad_model", ("chat", {"model": "gpt-4", "messages": [U("x")]})),
    ("messages_not_array", ("chat", {"model": M, "messages": "hi"})),
    ("content_number", chat([{"role": "user", "content": 5}])),
    ("image_part", chat([U([{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}])], **OFF)),
    # --- Responses API ---------------------------------------------------------------------
    ("resp_string_input", ("responses", {"model": M, "input": "hello"})),
    ("resp_instructions", ("responses", {"model": M, "input": "hello", "instructions": "be nice", "reasoning": {"effort": "max"}})),
    ("resp_items", ("responses", {"model": M, "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "-3C"}],
        "tools": [{"type": "function", "name": "get_weather", "description": "w", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "reasoning": {"effort": "low"}})),
    ("resp_nothink", ("responses", {"model": M, "input": [{"role": "user", "content": "hi"}], "thinking": {"type": "disabled"},
                                   "max_output_tokens": 50, "temperature": 0.5, "top_p": 0.8})),
    ("resp_reasoning_item", ("responses", {"model": M, "input": [
        {"role": "user", "content": "q1"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thought"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a1"}]},
        {"role": "user", "content": "q2"}]})),
    ("resp_json_schema", ("responses", {"model": M, "input": "q", "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}}})),
    ("resp_empty", ("responses", {})),
    ("resp_bad_output", ("responses", {"model": M, "input": [{"type": "function_call_output", "call_id": "zz", "output": "x"}]})),
    ("resp_developer", ("responses", {"model": M, "input": [{"role": "developer", "content": "dev rules"}, {"role": "user", "content": "hi"}]})),
    # --- Anthropic Messages API ----------------------------------------------------------------
    ("msg_basic", ("messages", {"model": M, "max_tokens": 100, "system": "sys", "messages": [U("hello")]})),
    ("msg_thinking", ("messages", {"model": M, "max_tokens": 100, "messages": [U("hello")], "thinking": {"type": "enabled", "budget_tokens": 2000}})),
    ("msg_nothink", ("messages", {"model": M, "max_tokens": 100, "messages": [U("hello")], "thinking": {"type": "disabled"}})),
    ("msg_system_blocks", ("messages", {"model": M, "max_tokens": 10, "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "messages": [U("hello")]})),
    ("msg_tools", ("messages", {"model": M, "max_tokens": 100, "thinking": {"type": "disabled"},
        "tools": [{"name": "get_weather", "description": "w", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "messages": [U("Weather?"),
                     {"role": "assistant", "content": [{"type": "text", "text": "Let me check."},
                                                       {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Lima"}},
                                                       {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {"city": "Quito"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "18C"},
                                                  {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "20C"}]},
                                                  {"type": "text", "text": "and?"}]}]})),
    ("msg_thinking_history", ("messages", {"model": M, "max_tokens": 100, "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [U("q1"), {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"}, {"type": "text", "text": "a1"}]}, U("q2")]})),
    ("msg_tool_choice_any", ("messages", {"model": M, "max_tokens": 100, "thinking": {"type": "disabled"}, "tool_choice": {"type": "any"},
        "tools": [{"name": "f", "input_schema": {"type": "object"}}], "messages": [U("x")]})),
    ("msg_stop_sequences", ("messages", {"model": M, "max_tokens": 100, "stop_sequences": ["###"], "temperature": 0.2, "top_k": 5, "messages": [U("x")], "thinking": {"type": "disabled"}})),
    ("msg_no_max_tokens", ("messages", {"model": M, "messages": [U("x")]})),
    ("msg_empty", ("messages", {})),
    ("msg_bad_tool_result", ("messages", {"model": M, "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}]})),
    # --- more edges -----------------------------------------------------------------------
    ("stop_16", chat([U("q")], stop=[f"s{i}" for i in range(16)], **OFF)),
    ("stop_17", chat([U("q")], stop=[f"s{i}" for i in range(17)], **OFF)),
    ("seed_big", chat([U("q")], seed=2**62, **OFF)),
    ("extension_fields_ignored", chat([U("q")], top_k=40, min_p=0.05, repetition_penalty=1.1, logit_bias={"15": 2.0}, user="u1", **OFF)),
    ("json_word_in_assistant", chat([U("q1"), A("here is JSON"), U("q2")], response_format={"type": "json_object"}, **OFF)),
    ("prefix_not_last", chat([U("q1"), A("a", prefix=True), U("q2")], **OFF)),
    ("unknown_part_type", chat([U([{"type": "input_audio", "input_audio": {"data": "x"}}])], **OFF)),
    ("tool_content_null", chat([U("x"), A("", tool_calls=[tc("c1", "now", "{}")]), {"role": "tool", "tool_call_id": "c1", "content": None}], tools=[NOPARAM], **OFF)),
    ("tool_no_id", chat([U("x"), A("", tool_calls=[tc("c1", "now", "{}")]), {"role": "tool", "content": "r"}], tools=[NOPARAM], **OFF)),
    ("two_tool_rounds_think", chat([U("w"), A("", reasoning_content="r1", tool_calls=[tc("c1", "get_weather", "{\"city\":\"A\"}")]), T("c1", "1"),
        A("", reasoning_content="r2", tool_calls=[tc("c2", "get_weather", "{\"city\":\"B\"}"), tc("c3", "now", "{}")]), T("c3", "3"), T("c2", "2")],
        tools=[WEATHER, NOPARAM])),
    ("reminder_then_assistant", chat([U("q"), {"role": "latest_reminder", "content": "r"}, A("a"), U("q2")])),
    ("thinking_adaptive", chat([U("q")], thinking={"type": "adaptive"})),
    ("effort_with_thinking_off", chat([U("q")], reasoning_effort="low", **OFF)),
    ("tools_empty_list", chat([U("q")], tools=[], **OFF)),
    ("tool_choice_required_no_tools", chat([U("q")], tool_choice="required", **OFF)),
    ("temperature_zero", chat([U("q")], temperature=0, **OFF)),
    ("top_p_zero", chat([U("q")], top_p=0, **OFF)),
    ("presence_bad", chat([U("q")], presence_penalty=2.5, **OFF)),
    ("frequency_edge", chat([U("q")], frequency_penalty=-2, **OFF)),
    ("logprobs_only", chat([U("q")], logprobs=True, **OFF)),
    ("float_params_in_schema", chat([U("q")], tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "number", "minimum": 0.5, "maximum": 1e21, "default": -3.25}}}}}], **OFF)),
    ("resp_calls_after_text", ("responses", {"model": M, "input": [
        {"role": "user", "content": "w"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "checking"}]},
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{\"k\":1}"},
        {"type": "function_call", "call_id": "b", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "b", "output": "B"},
        {"type": "function_call_output", "call_id": "a", "output": "A"}],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}], "reasoning": {"effort": "none"}})),
    ("resp_tool_choice_named", ("responses", {"model": M, "input": "x", "reasoning": {"effort": "none"},
        "tools": [{"type": "function", "name": "f", "parameters": {}}, {"type": "function", "name": "g"}], "tool_choice": {"type": "function", "name": "g"}})),
    ("resp_json_object", ("responses", {"model": M, "input": "give json", "text": {"format": {"type": "json_object"}}})),
    ("resp_stop_fields", ("responses", {"model": M, "input": "x", "max_output_tokens": 0})),
    ("resp_top_logprobs", ("responses", {"model": M, "input": "x", "top_logprobs": 5})),
    ("resp_input_image", ("responses", {"model": M, "input": [{"role": "user", "content": [{"type": "input_text", "text": "see"}, {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}]})),
    ("msg_tool_choice_tool", ("messages", {"model": M, "max_tokens": 10, "thinking": {"type": "disabled"}, "tool_choice": {"type": "tool", "name": "g"},
        "tools": [{"name": "f", "input_schema": {"type": "object"}}, {"name": "g", "input_schema": {"type": "object"}}], "messages": [U("x")]})),
    ("msg_max_tokens_clamped", ("messages", {"model": M, "max_tokens": 10**7, "messages": [U("x")]})),
    ("msg_adaptive", ("messages", {"model": M, "max_tokens": 10, "thinking": {"type": "adaptive"}, "messages": [U("x")]})),
    ("msg_image", ("messages", {"model": M, "max_tokens": 10, "thinking": {"type": "disabled"}, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}, {"type": "text", "text": "what?"}]}]})),
    ("msg_top_k_top_p", ("messages", {"model": M, "max_tokens": 10, "top_p": 0.5, "top_k": 3, "temperature": 1.5, "thinking": {"type": "disabled"}, "messages": [U("x")]})),
    ("msg_consecutive_users", ("messages", {"model": M, "max_tokens": 10, "thinking": {"type": "disabled"}, "messages": [U("a"), U("b")]})),
    ("msg_bad_role", ("messages", {"model": M, "max_tokens": 10, "messages": [{"role": "system", "content": "x"}]})),
    # --- V4-vocabulary id coverage: thinking off, no system text, no declared tools -----------
    ("ids_code", chat([U("```python\ndef f(x):\n    return x ** 2  # square\n```\nExplain   this.\t\t")], **OFF)),
    ("ids_cjk_emoji", chat([U("你好，世界！こんにちは 🚀🔥 Привет мир ñandú 1234567890")], **OFF)),
    ("ids_whitespace", chat([U("  leading\n\n\n   trailing   \r\n\u3000 ideographic space")], **OFF)),
    ("ids_history_calls", chat([U("Weather in Paris and Rome?"),
        A("Let me check.", tool_calls=[tc("a", "get_weather", "{\"city\": \"Paris\", \"days\": [1, 2], \"metric\": true}"),
                                       tc("b", "get_weather", "{\"city\": \"Rome\"}")]),
        T("b", "{\"temp\": 22}"), T("a", "{\"temp\": 15}"), A("Paris 15C, Rome 22C."), U("Thanks! 谢谢")], **OFF)),
    ("ids_special_literals", chat([U("<｜begin▁of▁sentence｜><｜Assistant｜></think><｜DSML｜ calls><｜end▁of▁sentence｜><|EOT|>"),
        A("<think>not special</think>"), U("<｜place▁holder▁no▁1｜><｜fim▁hole｜>")], **OFF)),
    ("ids_reminder", chat([U("q"), {"role": "latest_reminder", "content": "Be concise. 简洁"}, A("ok"), U("again")], **OFF)),
    ("ids_prefix", chat([U("Write a haiku"), A("Autumn moonlight—\n", prefix=True)], **OFF)),
    ("ids_msg_tools_history", ("messages", {"model": M, "max_tokens": 50, "thinking": {"type": "disabled"}, "messages": [
        U("list files"), {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {"path": "/tmp", "all": False}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.txt\nb.txt"}]}]})),
    ("msg_assistant_prefill", ("messages", {"model": M, "max_tokens": 5, "thinking": {"type": "disabled"}, "messages": [U("x"), {"role": "assistant", "content": "Sure,"}]})),
]

REQ = {"chat": dr.ChatCompletionRequest, "responses": dr.ResponsesRequest, "messages": dr.MessagesRequest}


def char_to_byte_ranges(prompt, ranges):
    out = []
    for s, e in ranges:
        bs = len(prompt[:s].encode("utf-8"))
        out.append([bs, bs + len(prompt[s:e].encode("utf-8"))])
    return out


def options_of(c):
    io, po = c.inference_options, c.parsing_options
    oc = io.output_constraint
    stage = po.thinking_initial_stage
    return {
        "max_tokens": io.max_tokens, "temperature": io.temperature, "top_p": io.top_p,
        "logprobs": io.logprobs, "top_logprobs": io.top_logprobs, "seed": io.seed,
        "constraint": None if oc is None else {"kind": oc.kind, "schema": oc.schema},
        "thinking": c.conversation.thinking_mode, "reasoning_effort": c.conversation.reasoning_effort,
        "tool_choice": c.conversation.tool_choice, "response_format": c.conversation.response_format,
        "parse_tool_calls": po.parse_tool_calls, "starts_in_tool_calls": po.starts_in_tool_calls,
        "parse_json_output": po.parse_json_output,
        "initial_stage": None if stage is None else str(stage).split(".")[-1],
        "stop": list(po.stop_sequences), "stream": c.stream,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "chat", "cases.json"))
    args = ap.parse_args()
    enc = dr.DeepseekV41Encoding()
    if args.tokenizer:
        enc_ids = enc.with_tokenizer(dr.Tokenizer.from_file(args.tokenizer))
    opts = dr.ConversionOptions()
    out = []
    for name, (api, body) in CASES:
        rec = {"name": name, "api": api, "request": body}
        try:
            conv = REQ[api](json.dumps(body)).convert(opts)
        except dr.ConversionError as ex:
            err = json.loads(ex.body)["error"]
            rec["error"] = {"status": ex.status_code, "type": err["type"], "message": err["message"]}
            out.append(rec)
            continue
        except ValueError as ex:  # body did not deserialize: recipe reports these as 400s too
            rec["error"] = {"status": 400, "type": "invalid_request_error", "message": str(ex)}
            out.append(rec)
            continue
        rp = enc.render_conversation(conv.conversation)
        rec["prompt"] = rp.prompt
        rec["special"] = char_to_byte_ranges(rp.prompt, rp.special_ranges)
        rec["options"] = options_of(conv)
        if args.tokenizer:
            # V4.1 prompts need <｜System｜>, which the V4 vocabulary lacks: the reference then fails too
            try:
                rec["ids"] = enc_ids.encode(conv.conversation)
            except RuntimeError as ex:
                rec["ids_error"] = str(ex)
        out.append(rec)
    if args.tokenizer:  # which vocabulary the ids are in, for the test to find the same file
        import hashlib
        with open(args.tokenizer, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        for r in out:
            if "prompt" in r:
                r["ids_tokenizer_sha256"] = sha
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in out) + "\n]\n")
    n_err = sum(1 for r in out if "error" in r)
    print(f"{len(out)} cases ({n_err} rejected) -> {args.out}", file=sys.stderr)


# ---- stream parsing: model output text -> the reference's complete Chat Completions response ----

D = "｜DSML｜"
CALL1 = (f'<{D} calls>\n<{D} invoke name="get_weather">\n<{D} parameter name="city" string="true">Paris</{D} parameter>\n'
         f'<{D} parameter name="n" string="false">3</{D} parameter>\n</{D} invoke>\n</{D} calls>')
CALL2 = (f'<{D} calls>\n<{D} invoke name="get_weather">\n<{D} parameter name="city" string="true">a "q" \\ é\n'
         f'two</{D} parameter>\n</{D} invoke>\n<{D} invoke name="now">\n</{D} invoke>\n'
         f'<{D} invoke name="get_weather">\n<{D} parameter name="obj" string="false">{{"a": [1, 2]}}</{D} parameter>\n'
         f'</{D} invoke>\n</{D} calls>')
BODY_THINK = {"model": M, "messages": [U("q")]}
BODY_PLAIN = {"model": M, "messages": [U("q")], "thinking": {"type": "disabled"}}
BODY_TOOLS = {"model": M, "messages": [U("q")], "tools": [WEATHER, NOPARAM]}
BODY_TOOLS_PLAIN = dict(BODY_TOOLS, thinking={"type": "disabled"})
BODY_REQUIRED = dict(BODY_TOOLS_PLAIN, tool_choice="required")
BODY_JSON = {"model": M, "messages": [U("json please")], "thinking": {"type": "disabled"}, "response_format": {"type": "json_object"}}
BODY_STOP = dict(BODY_PLAIN, stop=["END", "xyz"])

STREAM_CASES = [
    ("plain", BODY_PLAIN, "Hello world!"),
    ("plain_newlines", BODY_PLAIN, "\n\nHello\n\nworld\n\n"),
    ("plain_special_text", BODY_PLAIN, "a </think> b <think> c"),
    ("think", BODY_THINK, "Let me think.\n</think>\n\nSure."),
    ("think_leading_newlines", BODY_THINK, "\n\nreason\n\n</think>answer\n"),
    ("think_unclosed", BODY_THINK, "still thinking..."),
    ("think_empty", BODY_THINK, "</think>direct"),
    ("think_second_close", BODY_THINK, "r</think>a</think>b"),
    ("think_partial_marker", BODY_THINK, "a </thin b</think>c </thi"),
    ("tools_think", BODY_TOOLS, "Need the tool.</think>\n\nSure.\n\n" + CALL1),
    ("tools_plain", BODY_TOOLS_PLAIN, "Checking.\n\n" + CALL1),
    ("tools_multi", BODY_TOOLS_PLAIN, CALL2),
    ("tools_trailing_text", BODY_TOOLS_PLAIN, CALL1 + "\n\ntrailing junk"),
    ("tools_unfinished", BODY_TOOLS_PLAIN, "x\n\n" + CALL1[:120]),
    ("tools_not_a_call", BODY_TOOLS_PLAIN, "text with <｜DSML｜ but not a block"),
    ("tools_dsml_text_no_tools", BODY_PLAIN, "x\n\n" + CALL1),
    ("required", BODY_REQUIRED, CALL1[len(f"<{D} calls>\n"):]),
    ("json_fence", BODY_JSON, "Here:\n```json\n{\"a\": 1}\n```\nbye"),
    ("json_bare", BODY_JSON, "noise {\"a\": [1, {\"b\": 2}]} tail"),
    ("stop_seq", BODY_STOP, "abc END def"),
    ("stop_seq_partial", BODY_STOP, "abc EN xy def xyz ghi"),
    ("unicode", BODY_PLAIN, "日本語 🚀 émigré"),
    ("only_newlines", BODY_PLAIN, "\n\n\n"),
    ("think_only_newlines", BODY_THINK, "\n\n</think>\n\n"),
    ("think_dsml_in_reasoning", BODY_TOOLS, "maybe <｜DSML｜ calls> later</think>ok"),
    ("tools_no_content", BODY_TOOLS, "r</think>" + CALL1),
    ("tools_newline_runs", BODY_TOOLS_PLAIN, "a\n\n\nb\n\n\n" + CALL1),
    ("tools_param_special_chars", BODY_TOOLS_PLAIN, f'<{D} calls>\n<{D} invoke name="f">\n<{D} parameter name="k\\" string="true">tab\tctl\x01 </{D} parameter>\n</{D} invoke>\n</{D} calls>'),
    ("tools_bad_flag", BODY_TOOLS_PLAIN, f'<{D} calls>\n<{D} invoke name="f">\n<{D} parameter name="k" string="maybe">v</{D} parameter>\n</{D} invoke>\n</{D} calls>'),
    ("tools_think_end_in_content", BODY_TOOLS, "r</think>a</think>b\n\n" + CALL1),
    ("stop_in_reasoning", dict(BODY_THINK, stop=["STOP"]), "thinking STOP more</think>answer STOP tail"),
    ("stop_two_overlapping", dict(BODY_PLAIN, stop=["abcd", "bc"]), "xxabcdyy"),
    ("json_fence_no_close", BODY_JSON, "```json\n{\"a\": 1}"),
    ("json_none", BODY_JSON, "no json here"),
    ("json_think", dict(BODY_JSON, thinking={"type": "enabled"}), "hmm { not this</think>```json\n[1, 2]\n```"),
    ("prefix_reasoning_continuation", {"model": M, "messages": [U("q"), A("", reasoning_content="Let me", prefix=True)]}, "\n more</think>\n\nanswer"),
    ("prefix_content_continuation", {"model": M, "messages": [U("q"), A("The answer", reasoning_content="r", prefix=True)]}, "\n\nis 4"),
    ("prefix_nothink_continuation", {"model": M, "messages": [U("q"), A("The", prefix=True)], "thinking": {"type": "disabled"}}, "\n answer"),
    ("empty", BODY_PLAIN, ""),
]


PROTOCOL_CASES = [
    ("resp_tools", "responses", {"model": M, "input": "q", "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]},
     "Think.</think>Sure.\n\n" + CALL1),
    ("resp_plain", "responses", {"model": M, "input": "q", "reasoning": {"effort": "none"}}, "Hello world!"),
    ("msg_tools", "messages", {"model": M, "max_tokens": 100, "messages": [U("q")], "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]},
     "Think.</think>Sure.\n\n" + CALL1),
    ("msg_plain", "messages", {"model": M, "max_tokens": 100, "messages": [U("q")], "thinking": {"type": "disabled"}}, "Hello world!"),
]

RESP = {"chat": dr.ChatCompletionResponse, "responses": dr.ResponsesResponse, "messages": dr.MessagesResponse}


def stream_golden(tokenizer=None):
    out = []
    cases = [(n, "chat", b, t) for n, b, t in STREAM_CASES] + PROTOCOL_CASES
    for name, api, body, text in cases:
        conv = REQ[api](json.dumps(body)).convert(dr.ConversionOptions())
        gen = REQ[api].chunk_generator(conv, "id", M)
        sp = dr.StreamProcessor(gen, conv.parsing_options)
        resp = RESP[api]("id", M, 0, 10, 4)
        evs = sp.push(dr.InferenceChunk.ready(prompt_usage=dr.PromptUsage(prompt_tokens=10, prompt_cache_hit_tokens=4)))
        evs += sp.push(dr.InferenceChunk.text(text, 7))
        if not sp.finished:  # a stop sequence ends the stream by itself
            evs += sp.push(dr.InferenceChunk.finish(dr.InferenceFinishReason.Stop))
            evs += sp.finish()
        names = []
        for e in evs:
            n = RESP[api].sse_event_name(e) or "chunk"
            if not names or names[-1] != n:  # deltas are split differently; compare the shape
                names.append(n)
            resp.accumulate(e)
        full = json.loads(resp.to_json())
        if api != "chat":
            out.append({"name": name, "api": api, "request": body, "output": text, "response": full, "events": names})
            continue
        msg = full["choices"][0]["message"]
        calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in (msg.get("tool_calls") or [])]
        out.append({"name": name, "api": "chat", "request": body, "output": text, "response": full, "events": names,
                    "reasoning": msg.get("reasoning_content"), "content": msg.get("content"),
                    "tool_calls": calls, "finish_reason": full["choices"][0]["finish_reason"],
                    "usage": full["usage"]})
    return out


# ---- random outputs assembled from the fragments the parser cares about ----

FRAGMENTS = ["</think>", "<think>", "\n", "\n\n", " ", "x", "text", "é", "🚀", "{", "}", "[1]", "```json\n", "```",
             "\n```", f"<{D}", f"<{D} calls>", f"</{D} calls>", f"<{D} invoke name=\"f\">", f"</{D} invoke>",
             f"<{D} parameter name=\"k\" string=\"true\">", f"<{D} parameter name=\"n\" string=\"false\">",
             f"</{D} parameter>", "STOP", "ST", "\"", "\\"]
RANDOM_BODIES = [("think", BODY_THINK), ("plain", BODY_PLAIN), ("tools_think", BODY_TOOLS), ("tools_plain", BODY_TOOLS_PLAIN),
                 ("required", BODY_REQUIRED), ("json", BODY_JSON), ("stop", dict(BODY_PLAIN, stop=["STOP"]))]


def random_golden(n_per_body=40, seed=1234):
    import random
    rng = random.Random(seed)
    out = []
    for tag, body in RANDOM_BODIES:
        for i in range(n_per_body):
            text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 14)))
            conv = dr.ChatCompletionRequest(json.dumps(body)).convert(dr.ConversionOptions())
            sp = dr.StreamProcessor(dr.ChatCompletionRequest.chunk_generator(conv, "id", M), conv.parsing_options)
            resp = dr.ChatCompletionResponse("id", M, 0, 10, 4)
            evs = sp.push(dr.InferenceChunk.ready(prompt_usage=dr.PromptUsage(prompt_tokens=10, prompt_cache_hit_tokens=4)))
            evs += sp.push(dr.InferenceChunk.text(text, 1))
            if not sp.finished:
                evs += sp.push(dr.InferenceChunk.finish(dr.InferenceFinishReason.Stop))
                evs += sp.finish()
            for e in evs:
                resp.accumulate(e)
            full = json.loads(resp.to_json())
            msg = full["choices"][0]["message"]
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in (msg.get("tool_calls") or [])]
            out.append({"name": f"random_{tag}_{i}", "api": "chat", "request": body, "output": text,
                        "reasoning": msg.get("reasoning_content"), "content": msg.get("content"),
                        "tool_calls": calls, "finish_reason": full["choices"][0]["finish_reason"]})
    return out


def main_stream():
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "chat", "stream_cases.json")
    out = stream_golden()
    with open(path, "w", encoding="utf-8") as f:
        f.write("[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in out) + "\n]\n")
    print(f"{len(out)} stream cases -> {path}", file=sys.stderr)
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "chat", "stream_random.json")
    out = random_golden()
    with open(path, "w", encoding="utf-8") as f:
        f.write("[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in out) + "\n]\n")
    print(f"{len(out)} random stream outputs -> {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
    main_stream()

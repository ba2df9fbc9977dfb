#!/usr/bin/env python3
"""Generates tests/data/grammar/json_schema_logic.json for tests/test_json_schema_logic.c: schemas using
if/then/else, not, allOf combinations, dependencies, min/maxProperties, lengths and bounds beside
enum, oneOf of closed objects and propertyNames, each with candidate instances (every
subset of a few keys, in the schema's property order, times a few values; compact JSON) labelled
valid/invalid by Python jsonschema (the schema's draft, Draft 7 by default) and, when llguidance and
the DeepSeek tokenizer are available, with llguidance's decision. Test tooling only:
pip install jsonschema llguidance tokenizers."""
import itertools
import json
import os
import sys

import jsonschema

# (schema, {key: [values]} for object candidates, [extra non-object instances])
CASES = [
    ({"type": "object", "properties": {"kind": {"enum": ["x", "y"]}, "a": {"type": "integer"}},
      "if": {"properties": {"kind": {"const": "x"}}}, "then": {"required": ["a"]}, "else": {"properties": {"a": False}}},
     {"kind": ["x", "y", "w"], "a": [1, "s"], "z": [1]}, ["x", 1]),
    ({"type": "object", "properties": {"t": {"type": "string"}, "b": {"type": "boolean"}},
      "if": {"properties": {"t": {"const": "on"}}, "required": ["t"]}, "then": {"required": ["b"]},
      "else": {"not": {"required": ["b"]}}},
     {"t": ["on", "off", 3], "b": [True, 0], "z": [None]}, [None]),
    ({"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "not": {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}},
     {"a": [1], "b": [1], "c": [1, "q"], "z": [2]}, ["a", []]),
    ({"properties": {"a": {}, "b": {}}, "not": {"allOf": [{"required": ["a"]}, {"required": ["b"]}]}},
     {"a": [1, None], "b": [1], "z": [1]}, ["s", 3]),
    ({"type": "object", "properties": {"s": {"type": "string", "not": {"enum": ["logs", "x", 1]}}}, "required": ["s"]},
     {"s": ["logs", "x", "y", "xy", "", "log", 1, None], "z": [1]}, []),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "maxProperties": 2},
     {"a": [1, "s"], "b": [1], "c": [True]}, [{}]),
    ({"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a"], "minProperties": 2, "maxProperties": 3},
     {"a": [1], "b": [1], "c": [1], "d": [1]}, []),
    ({"type": "object", "minProperties": 3},
     {"a": [1], "b": ["x"], "c": [None], "d": [1]}, []),
    ({"allOf": [{"type": ["integer", "string"]}, {"type": ["number", "boolean"]}, {"minimum": 2}, {"minimum": -1, "maximum": 9}]},
     {}, [-2, -1, 0, 1, 2, 3, 9, 10, "5", True, None, 2.5]),
    ({"allOf": [{"enum": ["a", "b", "c"]}, {"enum": ["b", "c", "d"]}, {"not": {"const": "c"}}]},
     {}, ["a", "b", "c", "d", "e", 1]),
    ({"type": "object", "properties": {"p": {"enum": ["u", "v"]}, "q": {"type": "integer"}, "r": {"type": "integer"}},
      "allOf": [{"if": {"properties": {"p": {"const": "u"}}}, "then": {"required": ["q"]}},
                {"if": {"properties": {"p": {"const": "v"}}}, "then": {"required": ["r"]}}]},
     {"p": ["u", "v", "w"], "q": [1, "1"], "r": [2]}, []),
    ({"type": "object", "properties": {"mode": {"type": "string"}, "n": {"type": "integer"}},
      "not": {"properties": {"mode": {"const": "off"}}}},
     {"mode": ["off", "on", 1], "n": [1]}, []),
    ({"type": "object", "properties": {"on": {"type": "boolean"}, "x": {"type": "integer"}},
      "if": {"properties": {"on": {"const": False}}}, "then": {"properties": {"x": {"maximum": 0}}},
      "else": {"required": ["x"]}},
     {"on": [True, False], "x": [-1, 5]}, []),
    ({"anyOf": [{"required": ["a"]}, {"required": ["b"]}], "allOf": [{"anyOf": [{"required": ["c"]}, {"required": ["a"]}]}],
      "properties": {"a": {}, "b": {}, "c": {}}},
     {"a": [1], "b": [1], "c": [1]}, []),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "string"}},
      "dependencies": {"a": {"required": ["b"]}, "c": {"properties": {"b": {"minimum": 5}}}}},
     {"a": [1], "b": [2, 7], "c": ["s"], "z": [0]}, []),
    ({"type": "object", "oneOf": [
        {"properties": {"x": {"type": "integer"}, "k": {}}, "required": ["x"], "additionalProperties": False},
        {"properties": {"y": {"type": "string"}, "k": {}}, "required": ["y"], "additionalProperties": False}]},
     {"x": [1, "s"], "y": ["s"], "k": [0]}, []),
    ({"enum": [1, 2, 3, 2.5, 0.1, "x", None], "minimum": 0.1, "exclusiveMaximum": 3},
     {}, [1, 2, 3, 2.5, 0.1, "x", None, 0]),
    ({"$schema": "http://json-schema.org/draft-04/schema#", "enum": [1, 2, 3], "minimum": 2, "exclusiveMinimum": True},
     {}, [1, 2, 3]),
    ({"type": "object", "propertyNames": {"pattern": "^(\\w\\d)+$"}, "additionalProperties": {"type": "integer"}},
     {"a1": [1, "s"], "b": [2], "c3d4": [3], "_9": [0]}, []),
    ({"propertyNames": False}, {"a": [1]}, [1, "s"]),
    ({"enum": ["a", "ab", "abc", "\u00e9\u00e9", "\U0001F600", 1, None], "minLength": 2, "maxLength": 2},
     {}, ["a", "ab", "abc", "\u00e9\u00e9", "\U0001F600", 1, None, "zz"]),
]


def candidates(keys, extra):
    out = list(extra)
    names = list(keys)
    for mask in range(1 << len(names)):
        chosen = [k for i, k in enumerate(names) if mask >> i & 1]
        for vals in itertools.product(*[keys[k] for k in chosen]):
            out.append(dict(zip(chosen, vals)))
    return out


def llg_decider():
    try:
        import llguidance as llg
        from tokenizers import Tokenizer
    except ImportError:
        return None
    tok = os.path.join(os.path.dirname(__file__), "..", "data", "tokenizer", "deepseek-v4", "tokenizer.json")
    if not os.path.exists(tok):
        return None
    tk = Tokenizer.from_file(tok)
    with open(tok, encoding="utf-8") as fh:
        lt = llg.LLTokenizer(fh.read(), n_vocab=129280, eos_token=1)

    def decide(schema, texts):
        g = llg.grammar_from("json_schema", json.dumps(schema))
        if llg.LLMatcher.validate_grammar(g, lt):
            return None
        res = []
        for t in texts:
            m = llg.LLMatcher(lt, g, log_level=0)
            ok = m.consume_tokens(tk.encode(t, add_special_tokens=False).ids) and m.is_accepting() and not m.is_error()
            res.append(bool(ok))
        return res
    return decide


def main():
    decide = llg_decider()
    out = []
    for schema, keys, extra in CASES:
        v = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)(schema)
        inst = candidates(keys, extra)
        texts = [json.dumps(x, separators=(",", ":"), ensure_ascii=False) for x in inst]
        case = {"schema": schema, "instances": [[t, v.is_valid(x)] for t, x in zip(texts, inst)]}
        if decide:
            case["llguidance"] = decide(schema, texts)
        out.append(case)
    path = os.path.join(os.path.dirname(__file__), "data", "grammar", "json_schema_logic.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(out, fh, separators=(",", ":"), ensure_ascii=False)
        fh.write("\n")
    n = sum(len(c["instances"]) for c in out)
    print(f"{path}: {len(out)} schemas, {n} instances, llguidance {'yes' if decide else 'no'}", file=sys.stderr)


if __name__ == "__main__":
    main()

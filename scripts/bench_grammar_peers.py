#!/usr/bin/env python3
"""Time llguidance and xgrammar on the inputs of `deepinfer bench grammar` and print the ratios.

Test tooling only (pip install llguidance xgrammar tokenizers transformers torch). Every input in the
bench directory is a grammar (NAME.json = JSON Schema, NAME.regex, NAME.gbnf) plus NAME.instance, a
valid output. The instance is tokenized with the same tokenizer.json (plain BPE, no special tokens)
and replayed token by token: the full next-token bitmask is computed and timed before each token,
then the token is consumed. Compile time is the median of --repeat compilations. deepinfer's own
numbers come from `deepinfer bench grammar --json` run on the same inputs in the same process tree
(the first request on each compiled grammar, "cold"; the "(warm)" line is the second request). With
--json the report can be fed back: `deepinfer bench grammar --peers FILE` prints the ratios per input.

usage: scripts/bench_grammar_peers.py [--deepinfer build/deepinfer] [--tokenizer PATH] [--inputs DIR]
                                      [--steps N] [--repeat N] [--runs N] [--json]
       scripts/bench_grammar_peers.py --schemas DIR [--limit N]   (decisions on MaskBench data)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

DEFAULT_TOKENIZERS = ["data/tokenizer/deepseek-v41/tokenizer.json", "data/tokenizer/deepseek-v4/tokenizer.json"]
EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"


def pct(xs, q):
    xs = sorted(xs)
    return xs[int((len(xs) - 1) * q)] if xs else float("nan")


def load_inputs(d):
    out = []
    for f in sorted(os.listdir(d)):
        name, ext = os.path.splitext(f)
        if ext not in (".json", ".regex", ".gbnf"):
            continue
        kind = {".json": "json-schema", ".regex": "regex", ".gbnf": "ebnf"}[ext]
        with open(os.path.join(d, f), encoding="utf-8") as fh:
            src = fh.read()
        with open(os.path.join(d, name + ".instance"), encoding="utf-8") as fh:
            inst = fh.read()
        out.append((name, kind, src, inst))
    return out


def time_llguidance(tok_json, V, eos, inputs, ids_of, steps, repeat):
    try:
        import llguidance as llg
    except ImportError as e:
        return {name: {"error": f"not installed ({e.name})"} for name, _, _, _ in inputs}

    lt = llg.LLTokenizer(tok_json, n_vocab=V, eos_token=eos)
    res = {}
    for name, kind, src, _ in inputs:
        fmt = {"json-schema": "json_schema", "regex": "regex", "ebnf": "gbnf"}[kind]
        try:
            grammar = llg.grammar_from(fmt, src)
            comp = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                m = llg.LLMatcher(lt, grammar, log_level=0)
                comp.append(time.perf_counter() - t0)
            if m.is_error():
                res[name] = {"error": m.get_error()}
                continue
            ts = []
            for t in ids_of[name][:steps]:
                t0 = time.perf_counter()
                mask = m.compute_bitmask()
                ts.append(time.perf_counter() - t0)
                if not (mask[t >> 3] >> (t & 7)) & 1:
                    raise RuntimeError(f"llguidance masks out instance token {t}")
                m.consume_token(t)
            res[name] = {"compile_ms": statistics.median(comp) * 1e3, "p50_us": pct(ts, 0.5) * 1e6,
                         "p99_us": pct(ts, 0.99) * 1e6, "tokens": len(ts)}
        except Exception as e:  # a peer failing on an input is a result, not a crash
            res[name] = {"error": str(e)[:200]}
    return res


def time_xgrammar(tok_path, V, inputs, ids_of, steps, repeat):
    try:
        import transformers
        import xgrammar as xgr
    except ImportError as e:  # a peer that is not installed is reported, not fatal
        return {name: {"error": f"not installed ({e.name})"} for name, _, _, _ in inputs}

    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=tok_path)
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=V)
    res = {}
    for name, kind, src, _ in inputs:
        try:
            comp = []
            for _ in range(repeat):
                compiler = xgr.GrammarCompiler(info, cache_enabled=False)
                t0 = time.perf_counter()
                if kind == "json-schema":
                    cg = compiler.compile_json_schema(src, any_whitespace=True)
                elif kind == "regex":
                    cg = compiler.compile_regex(src)
                else:
                    cg = compiler.compile_grammar(src)
                comp.append(time.perf_counter() - t0)
            m = xgr.GrammarMatcher(cg)
            bm = xgr.allocate_token_bitmask(1, V)
            ts = []
            for t in ids_of[name][:steps]:
                t0 = time.perf_counter()
                m.fill_next_token_bitmask(bm)
                ts.append(time.perf_counter() - t0)
                word = int(bm[0, t >> 5]) & 0xFFFFFFFF
                if not (word >> (t & 31)) & 1:
                    raise RuntimeError(f"xgrammar masks out instance token {t}")
                if not m.accept_token(t):
                    raise RuntimeError(f"xgrammar rejects instance token {t}")
            res[name] = {"compile_ms": statistics.median(comp) * 1e3, "p50_us": pct(ts, 0.5) * 1e6,
                         "p99_us": pct(ts, 0.99) * 1e6, "tokens": len(ts)}
        except Exception as e:
            res[name] = {"error": str(e)[:200]}
    return res


def compliance(a, tok_path, V, eos):
    """Decisions on MaskBench/JSONSchemaBench files: schemas compiled, valid instances accepted,
    invalid ones rejected, for deepinfer (via `bench grammar --schemas`), llguidance and xgrammar."""
    import glob
    import llguidance as llg
    import transformers
    import xgrammar as xgr
    from tokenizers import Tokenizer

    files = sorted(glob.glob(os.path.join(a.schemas, "*.json")))
    if a.limit and a.limit < len(files):  # an even sample, the same one `bench grammar --limit` takes
        step = len(files) / a.limit
        files = [files[int(i * step)] for i in range(a.limit)]
    tk = Tokenizer.from_file(tok_path)
    with open(tok_path, encoding="utf-8") as fh:
        lt = llg.LLTokenizer(fh.read(), n_vocab=V, eos_token=eos)
    info = xgr.TokenizerInfo.from_huggingface(transformers.PreTrainedTokenizerFast(tokenizer_file=tok_path), vocab_size=V)
    xc = xgr.GrammarCompiler(info, cache_enabled=False)
    stats = {e: dict(schemas=0, compiled=0, valid=0, valid_ok=0, invalid=0, invalid_ok=0, compile_s=0.0)
             for e in ("llguidance", "xgrammar")}
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                doc = json.load(fh)
        except Exception:
            continue
        if "schema" not in doc:
            continue
        schema = json.dumps(doc["schema"])
        tests = [(json.dumps(t["data"], separators=(",", ":"), ensure_ascii=False), bool(t.get("valid")))
                 for t in doc.get("tests") or []]
        # llguidance
        st = stats["llguidance"]
        st["schemas"] += 1
        t0 = time.perf_counter()
        try:
            g = llg.grammar_from("json_schema", schema)
            ok = llg.LLMatcher.validate_grammar(g, lt) == ""
        except Exception:
            ok = False
        st["compile_s"] += time.perf_counter() - t0
        if ok:
            st["compiled"] += 1
            for data, valid in tests:
                m = llg.LLMatcher(lt, g, log_level=0)
                acc = m.consume_tokens(tk.encode(data, add_special_tokens=False).ids) and m.is_accepting() and not m.is_error()
                st["valid" if valid else "invalid"] += 1
                st["valid_ok" if valid else "invalid_ok"] += int(acc if valid else not acc)
        # xgrammar
        st = stats["xgrammar"]
        st["schemas"] += 1
        t0 = time.perf_counter()
        try:
            cg = xc.compile_json_schema(schema, any_whitespace=True)
            ok = True
        except Exception:
            ok = False
        st["compile_s"] += time.perf_counter() - t0
        if ok:
            st["compiled"] += 1
            for data, valid in tests:
                try:
                    m = xgr.GrammarMatcher(cg)
                    acc = m.accept_string(data) and m.is_completed()
                except Exception:
                    acc = False
                st["valid" if valid else "invalid"] += 1
                st["valid_ok" if valid else "invalid_ok"] += int(acc if valid else not acc)
    cmd = [a.deepinfer, "bench", "grammar", "--json", "--schemas", a.schemas] + (["--limit", str(a.limit)] if a.limit else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    try:
        d = json.loads(p.stdout)
        stats["deepinfer"] = dict(schemas=d["schemas"], compiled=d["compiled"], valid=d["valid_total"],
                                  valid_ok=d["valid_accepted"], invalid=d["invalid_total"], invalid_ok=d["invalid_rejected"])
    except Exception:
        stats["deepinfer"] = {"error": (p.stdout + p.stderr)[-300:]}
    if a.json:
        print(json.dumps(stats, indent=1))
        return
    for e in ("deepinfer", "llguidance", "xgrammar"):
        s = stats[e]
        if "error" in s:
            print(f"{e:11} error: {s['error']}")
            continue
        print(f"{e:11} compiled {s['compiled']}/{s['schemas']}  valid accepted {s['valid_ok']}/{s['valid']}  "
              f"invalid rejected {s['invalid_ok']}/{s['invalid']}  (invalid accepted {s['invalid'] - s['invalid_ok']})")


def time_deepinfer(a, tok_path):
    ours = {}
    cmd = [a.deepinfer, "bench", "grammar", "--json", "--tokenizer", tok_path, "--inputs", a.inputs,
           "--steps", str(a.steps), "--repeat", str(a.repeat)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    try:
        doc = json.loads(p.stdout)
        for r in doc.get("inputs", []):
            ours[r["name"]] = {"compile_ms": r["compile_ms"], "p50_us": r["mask_p50_us"], "p99_us": r["mask_p99_us"],
                               "warm_p50_us": r["warm_mask_p50_us"], "warm_p99_us": r["warm_mask_p99_us"],
                               "tokens": r["tokens"]} if r.get("ok") else {"error": r.get("error", "?")}
        if not doc.get("ok", True):
            print("deepinfer bench grammar:", doc.get("error"), file=sys.stderr)
    except json.JSONDecodeError:
        print("deepinfer bench grammar failed:", p.stderr.strip()[-500:], file=sys.stderr)
    return ours


def median_runs(rs):
    """Per input, the median of every number over the runs (an input that failed in any run reports that error)."""
    out = {}
    for name in rs[0]:
        rows = [r.get(name) or {"error": "missing"} for r in rs]
        bad = next((r for r in rows if "error" in r), None)
        if bad:
            out[name] = bad
            continue
        out[name] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        if len(rows) > 1:
            out[name]["p50_us_runs"] = [r["p50_us"] for r in rows]
            out[name]["p99_us_runs"] = [r["p99_us"] for r in rows]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--deepinfer", default="build/deepinfer")
    ap.add_argument("--tokenizer")
    ap.add_argument("--inputs", default="tests/data/grammar/bench")
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--runs", type=int, default=1,
                    help="alternate the engines N times and report the median of each number (p99 is one slow mask "
                         "of a 9-164-mask request: single runs carry ~2x noise on a shared machine)")
    ap.add_argument("--schemas", help="MaskBench/JSONSchemaBench data directory: compare decisions instead of timing")
    ap.add_argument("--limit", type=int, default=0, help="with --schemas: an evenly spaced sample of N files")
    a = ap.parse_args()
    tok_path = a.tokenizer or next((p for p in DEFAULT_TOKENIZERS if os.path.exists(p)), None)
    if not tok_path:
        sys.exit("bench_grammar_peers: no tokenizer.json found; pass --tokenizer")
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(tok_path)
    V = 129280
    eos = tk.token_to_id(EOS)
    if a.schemas:
        compliance(a, tok_path, V, eos)
        return
    inputs = load_inputs(a.inputs)
    ids_of = {n: tk.encode(inst, add_special_tokens=False).ids for n, _, _, inst in inputs}
    with open(tok_path, encoding="utf-8") as fh:
        tok_json = fh.read()

    runs = {"deepinfer": [], "llguidance": [], "xgrammar": []}
    for k in range(a.runs):  # engines alternate, so load changes on a shared machine hit all of them alike
        if a.runs > 1:
            print(f"run {k + 1}/{a.runs}", file=sys.stderr)
        runs["deepinfer"].append(time_deepinfer(a, tok_path))
        runs["llguidance"].append(time_llguidance(tok_json, V, eos, inputs, ids_of, a.steps, a.repeat))
        runs["xgrammar"].append(time_xgrammar(tok_path, V, inputs, ids_of, a.steps, a.repeat))
    ours, llg, xgr = (median_runs(runs[e]) for e in ("deepinfer", "llguidance", "xgrammar"))
    report = {"tokenizer": tok_path, "runs": a.runs, "inputs": []}
    hdr = f"{'input':18} {'engine':11} {'compile_ms':>10} {'p50_us':>10} {'p99_us':>10}   ratio ours/peer (compile, p50, p99)"
    if not a.json:
        print(hdr)
    for name, kind, _, _ in inputs:
        row = {"name": name, "kind": kind, "deepinfer": ours.get(name), "llguidance": llg.get(name),
               "xgrammar": xgr.get(name)}
        report["inputs"].append(row)
        if a.json:
            continue
        o = ours.get(name) or {"error": "missing"}
        if "error" not in o:  # the second request on the grammar (state table and masks shared), for reference
            print(f"{name:18} {'(warm)':11} {'':>10} {o['warm_p50_us']:10.1f} {o['warm_p99_us']:10.1f}")
        for eng, r in (("deepinfer", o), ("llguidance", llg.get(name)), ("xgrammar", xgr.get(name))):
            if not r or "error" in r:
                print(f"{name:18} {eng:11} error: {(r or {}).get('error', 'missing')}")
                continue
            line = f"{name:18} {eng:11} {r['compile_ms']:10.3f} {r['p50_us']:10.1f} {r['p99_us']:10.1f}"
            if eng != "deepinfer" and "error" not in o:
                line += "   x{:.2f}, x{:.2f}, x{:.2f}".format(o["compile_ms"] / r["compile_ms"], o["p50_us"] / r["p50_us"],
                                                            o["p99_us"] / r["p99_us"])
            print(line)
    if a.json:
        print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

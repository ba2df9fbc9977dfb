#!/usr/bin/env python3
"""Generate the tokenizer golden data used by tests/test_tokenizer.c and tests/test_engram_map.c.

Expected values come from Hugging Face `tokenizers` (pip install tokenizers; test tooling only):
  * corpus.jsonl: one deterministic corpus of varied strings; per line
      {"t": text, "on": ids with added-token recognition, "off": ids as plain BPE (omitted when equal to
       "on"), "dec": HF decode(on, skip_special_tokens=False) (omitted when equal to text)}
    "on"  = Tokenizer.encode(text, add_special_tokens=False) on the tokenizer file as shipped;
    "off" = the same file with its added_tokens removed: pure BPE, which is how deepseek-recipe encodes
            message content (no added-vocabulary pass at all).
  * decode.jsonl: random id sequences (any ids, and single-byte tokens that split or break UTF-8) with
    HF decode(ids, skip_special_tokens=False): {"ids": [...], "text": ...}.
  * tiny_tokenizer.json + tiny.jsonl: a synthetic byte-level BPE with overlapping added tokens (some
    normalized, some not) and the ids HF gives for texts that make those overlaps matter.
  * engram_map.json: the Engram compressed-id table (model.md §4.3 step 1) recomputed with the
    reference algorithm and `tokenizers` normalizers: class count, FNV-1a-64 of the whole int32 table
    and a sample of (id, class) pairs.

usage: scripts/gen_tokenizer_golden.py [TOKENIZER_JSON] [OUT_DIR]
"""
import hashlib
import json
import random
import sys
from pathlib import Path

from tokenizers import Regex, Tokenizer, normalizers

ROOT = Path(__file__).resolve().parent.parent
TOK_PATH = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "data/tokenizer/deepseek-v4/tokenizer.json"
OUT = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "tests/data/tokenizer"

rng = random.Random(20261130)


def rand_chars(pool, lo, hi):
    return "".join(rng.choice(pool) for _ in range(rng.randint(lo, hi)))


def block(a, b):
    """Assigned, non-surrogate codepoints of a range as a string pool."""
    return "".join(chr(c) for c in range(a, b + 1) if not 0xD800 <= c <= 0xDFFF)


LATIN = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
DIGITS = "0123456789"
PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
CJK = block(0x4E00, 0x9FA5)
CJK_EXT = block(0x3400, 0x4DBF) + block(0x9FA6, 0x9FFF) + block(0xF900, 0xFAFF)
HIRA = block(0x3041, 0x3096)
KATA = block(0x30A1, 0x30FA) + "ー"
HANGUL = block(0xAC00, 0xD7A3)
CYR = block(0x0410, 0x044F) + "ёЁ"
GREEK = block(0x0391, 0x03A9) + block(0x03B1, 0x03C9)
ARABIC = block(0x0621, 0x064A) + block(0x0660, 0x0669)
HEBREW = block(0x05D0, 0x05EA)
DEVA = block(0x0905, 0x0939) + block(0x093E, 0x094D) + block(0x0966, 0x096F)
THAI = block(0x0E01, 0x0E3A) + block(0x0E40, 0x0E4E)
COMBINING = block(0x0300, 0x036F)
FULLWIDTH = block(0xFF01, 0xFF5E) + "、。「」『』【】・〜"
EMOJI = ["😀", "🎉", "👍", "👍🏽", "❤️", "🇯🇵", "🇺🇸", "👨‍👩‍👧‍👦", "🧑‍💻", "🤖", "🔥", "✅", "⚠️", "🙂", "🏳️‍🌈", "1️⃣", "🦀",
         "😂", "🥲", "🫠", "🐍", "🚀", "©", "™", "♥", "★"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ", "\u00a0", "\u3000", "\u2009", "\u200b",
          "\u2028", "\u2029", "\u0085", "\u000b", "\u000c", "\u180e", "\u202f", "\ufeff"]
WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there been one all we their has would when if so no what up out them who more "
         "function return import class def self None true false null const let var async await yield lambda "
         "tokenizer inference engine kernel attention expert routing prefill decode cache").split()
CHINESE_PHRASES = ["你好", "世界", "我们", "深度求索", "人工智能", "推理", "答案", "模型", "今天天气很好", "中华人民共和国",
                   "机器学习", "自然语言处理", "这是一个测试", "谢谢", "请问"]
JAPANESE_PHRASES = ["こんにちは", "ありがとう", "日本語のテキスト", "カタカナ", "東京都", "テスト", "ですます", "ひらがな"]


def code_snippet():
    name = rng.choice(["foo", "bar_baz", "computeLogits", "x", "MAX_LEN", "di_tok_encode", "__init__", "self.w1"])
    pieces = [
        f"def {name}(x, y=3):\n    return x ** 2 + y  # comment\n",
        f"int {name}(const char *s, size_t n) {{\n\tfor (size_t i = 0; i < n; i++) s[i] ^= 0x20;\n\treturn 0;\n}}\n",
        f"const {name} = async (a) => {{ await fetch(`/api/${{a}}`); }};",
        f'{{"{name}": [1, 2.5, -3e10, true, null], "nested": {{"k": "v\\n"}}}}',
        f"<div class=\"{name}\"><p>Hello &amp; welcome</p></div>",
        f"SELECT {name}, COUNT(*) FROM t WHERE id >= 42 GROUP BY 1;",
        f"#include <stdio.h>\n#define {name.upper()}(a,b) ((a)>(b)?(a):(b))\n",
        f"    if ({name} != NULL && {name}->next) {{\n        {name} = {name}->next;\n    }}\n",
        f"git commit -m \"fix: {name} off-by-one\" && make -j8 2>&1 | tee log.txt",
        f"https://example.com/path/{name}?q=1&lang=zh-CN#anchor",
        f"user_{rng.randint(0, 99999)}@mail.example.org",
        f"$ ./{name} --flag=value -v\n[INFO] 2026-11-30T10:00:00Z started pid=1234\n",
        f"for i in range(10):\n\tprint(f'{{i:03d}}')\n",
        f"```python\nimport numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\n```",
        f"| col1 | col2 |\n|------|------|\n| {name} | 3.14 |",
        f"\\begin{{equation}} E = mc^2 \\end{{equation}} % {name}",
    ]
    return rng.choice(pieces)


def numbers():
    forms = [
        lambda: str(rng.randint(0, 10 ** rng.randint(1, 30))),
        lambda: f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}",
        lambda: f"{rng.randint(1, 10 ** 12):,}",
        lambda: f"{rng.random():e}",
        lambda: "".join(rng.choice("٠١٢٣٤٥٦٧٨٩") for _ in range(rng.randint(1, 8))),
        lambda: "".join(rng.choice("０１２３４５６７８９") for _ in range(rng.randint(1, 8))),
        lambda: "x²+y³=z¹⁰ ½ ¾ Ⅻ ⑤",
        lambda: f"v{rng.randint(0, 9)}.{rng.randint(0, 99)}.{rng.randint(0, 999)}-rc{rng.randint(1, 5)}",
        lambda: f"{rng.randint(1000, 9999)}年{rng.randint(1, 12)}月{rng.randint(1, 28)}日",
        lambda: f"0x{rng.getrandbits(64):016x} 0b{rng.getrandbits(12):b} 1e-{rng.randint(1, 300)}",
    ]
    return " ".join(rng.choice(forms)() for _ in range(rng.randint(1, 4)))


def mixed_text(specials):
    parts = []
    for _ in range(rng.randint(1, 12)):
        k = rng.randint(0, 17)
        if k == 0: parts.append(rng.choice(WORDS))
        elif k == 1: parts.append(rng.choice(CHINESE_PHRASES))
        elif k == 2: parts.append(rng.choice(JAPANESE_PHRASES))
        elif k == 3: parts.append(rand_chars(CJK, 1, 8))
        elif k == 4: parts.append(rand_chars(HANGUL, 1, 6))
        elif k == 5: parts.append(rand_chars(rng.choice([CYR, GREEK, ARABIC, HEBREW, DEVA, THAI]), 1, 10))
        elif k == 6: parts.append(rng.choice(EMOJI))
        elif k == 7: parts.append(rng.choice(SPACES))
        elif k == 8: parts.append(rand_chars(PUNCT, 1, 4))
        elif k == 9: parts.append(numbers())
        elif k == 10: parts.append(rand_chars(LATIN, 1, 12) + rand_chars(COMBINING, 1, 3))
        elif k == 11: parts.append(rand_chars(FULLWIDTH, 1, 5))
        elif k == 12: parts.append(rng.choice(specials))
        elif k == 13: parts.append(rand_chars(HIRA + KATA, 1, 8))
        elif k == 14: parts.append(rand_chars(CJK_EXT, 1, 4))
        elif k == 15: parts.append(rand_chars("ĠĊčĉÃ¤Â", 1, 5))  # byte-level spelling chars as plain text
        elif k == 16: parts.append(rng.choice(WORDS).upper())
        else: parts.append(rng.choice(WORDS).capitalize())
        if rng.random() < 0.6: parts.append(rng.choice([" ", " ", "", "\n", ", ", "。", "! "]))
    return "".join(parts)


def random_unicode():
    """Random scalar values from all planes, weighted to the BMP."""
    out = []
    for _ in range(rng.randint(1, 30)):
        r = rng.random()
        if r < 0.5: c = rng.randint(0x20, 0x2FFF)
        elif r < 0.8: c = rng.randint(0x3000, 0xFFFD)
        else: c = rng.randint(0x10000, 0x10FFFF)
        if 0xD800 <= c <= 0xDFFF: c = 0xFFFD
        out.append(chr(c))
    return "".join(out)


def special_mix(specials):
    s = specials
    forms = [
        lambda: rng.choice(s) + rng.choice(CHINESE_PHRASES) + rng.choice(s),
        lambda: "".join(rng.choice(s) for _ in range(rng.randint(2, 5))),
        lambda: rng.choice(s)[: rng.randint(1, 6)] + " partial " + rng.choice(s)[2:],  # broken literals
        lambda: rng.choice(WORDS) + rng.choice(s) + rng.choice(WORDS),  # glued to words
        lambda: " " + rng.choice(s) + " \n" + rng.choice(s) + "\n\n",
        lambda: "<｜<｜User｜>｜>" + "<think></think>" + "</think><think>",
        lambda: "<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter name=\"city\" string=\"true\">北京</｜DSML｜ parameter>",
        lambda: "｜DSML｜" + rng.choice(WORDS) + "<dsml:" + rng.choice(WORDS) + "</dsml:",
    ]
    return rng.choice(forms)()


def whitespace_runs():
    s = "".join(rng.choice(SPACES) for _ in range(rng.randint(1, 12)))
    if rng.random() < 0.7:
        s = rng.choice(["", rng.choice(WORDS)]) + s + rng.choice(["", rng.choice(WORDS), "x", "。", "1"])
    return s


def long_word():
    k = rng.randint(0, 6)
    n = rng.randint(50, 600)
    if k == 0: return rand_chars(LATIN, n, n)
    if k == 1: return rng.choice("aeiou") * n
    if k == 2: return "ab" * n
    if k == 3: return rand_chars(CJK, n // 4, n // 4)
    if k == 4: return "".join(rng.choice(WORDS) for _ in range(n // 8))  # no spaces
    if k == 5: return "=" * n + "\n" + "-" * (n // 2)
    return "".join(rng.choice(LATIN) + rng.choice(COMBINING) for _ in range(n // 6))


def corpus(specials):
    fixed = [
        "", " ", "  ", "\n", "\t", "a", "A", "1", "12", "123", "1234", "12345678901234567890",
        "Hello world", "Hello, world!", " Hello", "hello  world", "Hello\n\nworld", "Hello \n world",
        "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>",
        "<｜begin▁of▁sentence｜><｜System｜>You are helpful.<｜User｜>Hi<｜Assistant｜></think>",
        "The quick brown fox jumps over the lazy dog.", "It's a test—don't panic…", "naïve café résumé",
        "e\u0301", "\u0301", "Z\u0351\u0352\u0353a\u0354\u0355l\u0356g\u0357o", "ﬁ ﬂ ﬃ", "Å Å", "ǅ ǈ", "İstanbul",
        "ß ẞ", "Ω Ω", "ℌ ℍ ℎ", "①②③", "㍿ ㌔", "\u0000", "\u0001\u0002\u001f\u007f", "\ufffd", "\U0010ffff",
        "tab\there", "a\r\nb", "\r\r\r", "   leading", "trailing   ", "  both  ", "\u3000全角空格\u3000",
        "Hello🎉World", "👨‍👩‍👧‍👦👨‍👩‍👧‍👦", "~~~", "~/.bashrc", "a~b", "¿Qué?", "«quote»", "“smart”", "–—",
        "$$$", "100%", "#1", "@user", "C++", "C#", "x=1;y=2", "don't", "DON'T", "I'm", "we'll", "they've",
        "Ġ", "Ċ", "ĠĠĠ", "Ã©", "\u0085", "a\u0085b", "a\u00a0b", "a\u2028b", "\u180e", "x\u200by",
    ]
    out = list(fixed)
    gens = [
        (code_snippet, 330), (numbers, 200), (lambda: mixed_text(specials), 560), (random_unicode, 200),
        (lambda: special_mix(specials), 250), (whitespace_runs, 220), (long_word, 90),
        (lambda: rng.choice(CHINESE_PHRASES + JAPANESE_PHRASES) * rng.randint(1, 4), 60),
        (lambda: rand_chars(HANGUL + " ", 5, 40), 40), (lambda: rand_chars(EMOJI, 1, 8), 40),
    ]
    for g, n in gens:
        out.extend(g() for _ in range(n))
    return out


def _byte_spelling():
    """GPT-2 byte -> unicode map: BYTE_SPELLING[b] is the codepoint spelling byte b."""
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    cps, extra = [], 0
    for b in range(256):
        if b in printable:
            cps.append(b)
        else:
            cps.append(256 + extra)
            extra += 1
    return cps


BYTE_SPELLING = _byte_spelling()


def tiny_golden(real):
    """A synthetic tokenizer: the real pre-tokenizer/decoder, 256 byte tokens, a few merges, and added tokens
    that overlap: HF cuts normalized=false tokens first, then normalized=true ones in the gaps."""
    vocab = {chr(c): i for i, c in enumerate(BYTE_SPELLING)}
    merges = []
    for a, b in [("a", "b"), ("ab", "c"), ("Ġ", "a"), ("Ġa", "b"), ("c", "d"), ("x", "x"), ("xx", "xx")]:
        vocab.setdefault(a + b, len(vocab))
        merges.append(f"{a} {b}")
    base = len(vocab)
    added = [("<AB>", True, True), ("B>C", False, False), ("<A", False, True), ("<AB>CD", True, False),
             ("｜x｜", False, True), ("x｜y", True, False)]
    tj = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": base + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": norm, "special": sp} for i, (c, norm, sp) in enumerate(added)],
        "normalizer": real["normalizer"], "pre_tokenizer": real["pre_tokenizer"],
        "post_processor": real["post_processor"], "decoder": real["decoder"],
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": merges},
    }
    raw = json.dumps(tj, ensure_ascii=False)
    (OUT / "tiny_tokenizer.json").write_text(raw + "\n", encoding="utf-8")
    tok = Tokenizer.from_str(raw)
    texts = ["<AB>C", "<AB>CD", "<AB>CDx", "x<A<AB>", "｜x｜y", "x｜x｜y", "abc abcd ab", " xxxx xxx",
             "<AB><AB>C<A", "B>C<AB>", "<<AB>>", "abcd<A", "xx｜y ｜x｜"]
    with open(OUT / "tiny.jsonl", "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"t": t, "on": tok.encode(t, add_special_tokens=False).ids}, ensure_ascii=False) + "\n")


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def engram_map(tok: Tokenizer):
    # the reference's normalizer chain (model.md §4.3 step 1)
    sentinel = "\ue000"
    norm = normalizers.Sequence([
        normalizers.NFKC(), normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "), normalizers.Replace(Regex(r"^ $"), sentinel),
        normalizers.Strip(), normalizers.Replace(sentinel, " "),
    ])
    key_to_new, table = {}, []
    for tid in range(tok.get_vocab_size(with_added_tokens=True)):
        text = tok.decode([tid], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.id_to_token(tid)
        else:
            n = norm.normalize_str(text)
            key = n if n else text
        table.append(key_to_new.setdefault(key, len(key_to_new)))
    return table, len(key_to_new)


def main():
    raw = TOK_PATH.read_bytes()
    tj = json.loads(raw)
    on = Tokenizer.from_str(raw.decode())
    plain = dict(tj)
    plain["added_tokens"] = []
    off = Tokenizer.from_str(json.dumps(plain))
    specials = [a["content"] for a in tj["added_tokens"]]
    OUT.mkdir(parents=True, exist_ok=True)

    texts = corpus(specials)
    n_diff = 0
    with open(OUT / "corpus.jsonl", "w", encoding="utf-8") as f:
        for t in texts:
            ids_on = on.encode(t, add_special_tokens=False).ids
            ids_off = off.encode(t, add_special_tokens=False).ids
            rec = {"t": t, "on": ids_on}
            if ids_off != ids_on:
                rec["off"] = ids_off
                n_diff += 1
            dec = on.decode(ids_on, skip_special_tokens=False)
            if dec != t:
                rec["dec"] = dec
            f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"corpus: {len(texts)} strings, {n_diff} differ with added-token recognition off")

    byte_ids = [on.token_to_id(chr(c)) for c in BYTE_SPELLING]
    with open(OUT / "decode.jsonl", "w", encoding="utf-8") as f:
        for k in range(400):
            if k < 200:
                ids = [rng.randrange(on.get_vocab_size(with_added_tokens=True)) for _ in range(rng.randint(1, 12))]
            else:  # mostly raw bytes >= 0x80: partial, stray and complete characters
                ids = [rng.choice(byte_ids[0x80:] if rng.random() < 0.8 else byte_ids[:0x80])
                       for _ in range(rng.randint(1, 16))]
            rec = {"ids": ids, "text": on.decode(ids, skip_special_tokens=False)}
            f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")

    tiny_golden(tj)

    table, n_classes = engram_map(on)
    packed = b"".join(c.to_bytes(4, "little") for c in table)
    sample_ids = sorted(set(list(range(0, len(table), 37)) + list(range(0, 300)) + list(range(127900, len(table)))))
    doc = {
        "tokenizer_sha256": hashlib.sha256(raw).hexdigest(),
        "vocab_size": len(table),
        "n_classes": n_classes,
        "table_fnv1a64": f"{fnv1a64(packed):016x}",
        "sample": [[i, table[i]] for i in sample_ids],
    }
    (OUT / "engram_map.json").write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"engram map: {n_classes} classes over {len(table)} ids")


if __name__ == "__main__":
    main()

"""Offline inference in the shape of vLLM's `LLM` API, over the deepinfer C engine.

    from deepinfer_c import LLM, SamplingParams
    llm = LLM("path/to/checkpoint")
    outs = llm.generate(["Hello"], SamplingParams(temperature=0.8, max_tokens=32, seed=1))
    print(outs[0].outputs[0].text)

Every request of a call is added to the engine at once and the engine is stepped until all have
finished, so the requests share its continuous batches. Results come back in the order of the
prompts. A request's tokens do not depend on what else runs with it (seeded sampling keyed by
position; batch-invariant model rows), so generate([a, b]) gives the same outputs for a as
generate([a]) with the same seed."""

import ctypes
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _lib as C


@dataclass
class SamplingParams:
    """Sampling options, named as in vLLM. top_k <= 0 (vLLM: -1 or 0) and top_p = 1 disable those
    stages. seed=None draws a seed per request from the engine seed. logprobs=k reports the sampled
    token's log probability and the k best alternatives. guided_json (a JSON Schema as dict or text),
    guided_regex and guided_grammar (GBNF) constrain the output."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: Optional[int] = None
    max_tokens: Optional[int] = 16
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    ignore_eos: bool = False
    logprobs: Optional[int] = None
    logit_bias: Optional[Dict[int, float]] = None
    guided_json: Optional[Union[str, Dict[str, Any]]] = None
    guided_regex: Optional[str] = None
    guided_grammar: Optional[str] = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: List[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[List[Dict[int, float]]]
    finish_reason: Optional[str]


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput] = field(default_factory=list)
    finished: bool = True


class _Pending:
    def __init__(self, index, prompt, prompt_ids, n, logprobs):
        self.index = index
        self.prompt = prompt
        self.prompt_ids = prompt_ids
        self.tokens = [[] for _ in range(n)]
        self.text = [bytearray() for _ in range(n)]
        self.lps = [[] for _ in range(n)] if logprobs is not None else None
        self.finish = [None] * n
        self.n_prompt = len(prompt_ids) if prompt_ids is not None else 0


class LLM:
    """An engine on one checkpoint directory. max_num_seqs: requests per step; max_model_len:
    positions per request (0 = the engine's default); seed: seeds requests that bring none;
    runner: "cached" (per-request caches) or "recompute" (the exact cache-free baseline)."""

    def __init__(self, model: str, *, max_num_seqs: int = 16, max_model_len: int = 0, seed: int = 0,
                 num_threads: int = 0, prefill_chunk: int = 512, device: str = "cpu", runner: str = "cached"):
        L = C.lib()
        opt = C.EngineOptions()
        L.di_engine_options_default(ctypes.byref(opt))
        self._device = device.encode()
        opt.device = self._device
        self._runner = runner.encode()
        opt.runner = self._runner
        opt.max_seqs = max_num_seqs
        opt.max_context = max_model_len
        opt.n_threads = num_threads
        opt.prefill_chunk = prefill_chunk
        opt.max_step_tokens = max(2048, prefill_chunk)
        opt.seed = seed
        err = C.Error()
        e = ctypes.c_void_p()
        C.check(L.di_engine_open(model.encode(), ctypes.byref(opt), ctypes.byref(e), ctypes.byref(err)), err)
        self._e = e
        self._L = L
        self.model = model

    def close(self):
        if getattr(self, "_e", None):
            self._L.di_engine_close(self._e)
            self._e = None

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def vocab_size(self) -> int:
        return self._L.di_engine_vocab_size(self._e)

    @property
    def eos_token_id(self) -> int:
        return self._L.di_engine_eos_id(self._e)

    # ---- requests ----

    def _options(self, sp: SamplingParams, keep):
        ro = C.RequestOptions()
        self._L.di_request_options_default(ctypes.byref(ro))
        s = ro.sampling
        s.temperature = sp.temperature
        s.top_p = sp.top_p
        s.top_k = sp.top_k if sp.top_k > 0 else 0
        s.min_p = sp.min_p
        s.presence_penalty = sp.presence_penalty
        s.frequency_penalty = sp.frequency_penalty
        s.repetition_penalty = sp.repetition_penalty
        if sp.seed is not None:
            s.seed = sp.seed
            ro.has_seed = 1
        if sp.logprobs is not None:
            s.logprobs = 1
            s.n_top_logprobs = sp.logprobs
        if sp.logit_bias:
            arr = (C.TokenBias * len(sp.logit_bias))(*[C.TokenBias(int(t), float(b)) for t, b in sp.logit_bias.items()])
            keep.append(arr)
            s.logit_bias = arr
            s.n_logit_bias = len(sp.logit_bias)
        ro.max_tokens = sp.max_tokens or 0
        ro.n = sp.n
        stops = [sp.stop] if isinstance(sp.stop, str) else list(sp.stop or [])
        if stops:
            arr = (ctypes.c_char_p * len(stops))(*[x.encode() for x in stops])
            keep.append(arr)
            ro.stop = arr
            ro.n_stop = len(stops)
        if sp.stop_token_ids:
            arr = (ctypes.c_int32 * len(sp.stop_token_ids))(*sp.stop_token_ids)
            keep.append(arr)
            ro.stop_token_ids = arr
            ro.n_stop_token_ids = len(sp.stop_token_ids)
        ro.ignore_eos = int(sp.ignore_eos)
        grammar = None
        if sp.guided_json is not None:
            text = sp.guided_json if isinstance(sp.guided_json, str) else json.dumps(sp.guided_json)
            grammar = (C.GRAMMAR_JSON_SCHEMA, text)
        elif sp.guided_regex is not None:
            grammar = (C.GRAMMAR_REGEX, sp.guided_regex)
        elif sp.guided_grammar is not None:
            grammar = (C.GRAMMAR_EBNF, sp.guided_grammar)
        if grammar:
            b = grammar[1].encode()
            keep.append(b)
            ro.grammar_kind = grammar[0]
            ro.grammar = b
            ro.grammar_len = len(b)
        return ro

    def _add(self, prompt, ro):
        L, err, rid = self._L, C.Error(), ctypes.c_int64()
        if isinstance(prompt, str):
            b = prompt.encode()
            rc = L.di_engine_add_text(self._e, b, len(b), ctypes.byref(ro), ctypes.byref(rid), ctypes.byref(err))
            ids = None
        else:
            ids = [int(t) for t in prompt]
            arr = (ctypes.c_int32 * max(1, len(ids)))(*ids)
            rc = L.di_engine_add_tokens(self._e, arr, len(ids), ctypes.byref(ro), ctypes.byref(rid), ctypes.byref(err))
        C.check(rc, err)
        return rid.value, ids

    def _run(self, prompts, params):
        """prompts: list of (display prompt or None, str or list of ids); params: one per prompt."""
        keep = []
        pending = {}
        order = []
        try:
            for i, ((shown, p), sp) in enumerate(zip(prompts, params)):
                ro = self._options(sp, keep)
                rid, ids = self._add(p, ro)
                job = _Pending(i, shown, ids, sp.n, sp.logprobs)
                pending[rid] = job
                order.append((rid, job))
        except Exception:
            for rid in pending:
                self._L.di_engine_cancel(self._e, rid, None)
            self._drain({})
            raise
        self._drain(pending)
        outs = []
        for rid, job in order:
            comps = []
            for c in range(len(job.tokens)):
                lp = None
                cum = None
                if job.lps is not None:
                    lp = job.lps[c]
                    cum = sum(d[t] for d, t in zip(lp, job.tokens[c]))
                comps.append(CompletionOutput(index=c, text=bytes(job.text[c]).decode("utf-8", "replace"),
                                              token_ids=job.tokens[c], cumulative_logprob=cum, logprobs=lp,
                                              finish_reason=job.finish[c]))
            outs.append(RequestOutput(request_id=str(rid), prompt=job.prompt,
                                      prompt_token_ids=job.prompt_ids if job.prompt_ids is not None else [],
                                      outputs=comps))
        return outs

    def _drain(self, pending):
        L, err = self._L, C.Error()
        deltas = (C.Delta * 64)()
        while L.di_engine_busy(self._e):
            C.check(L.di_engine_step(self._e, ctypes.byref(err)), err)
            while True:
                k = L.di_engine_poll(self._e, deltas, 64)
                for d in deltas[:k]:
                    job = pending.get(d.id)
                    if job is None:
                        continue
                    c = d.choice
                    toks = [d.tokens[t] for t in range(d.n_tokens)]
                    job.tokens[c].extend(toks)
                    if d.n_text:
                        job.text[c].extend(ctypes.string_at(d.text, d.n_text))
                    if job.lps is not None and d.logprobs:
                        for t in range(d.n_tokens):
                            r = d.logprobs[t]
                            entry = {toks[t]: r.logprob}
                            for j in range(r.n_top):
                                entry.setdefault(r.top_ids[j], r.top_logprobs[j])
                            job.lps[c].append(entry)
                    if d.prompt_tokens and job.prompt_ids is None:
                        job.n_prompt = d.prompt_tokens
                    if d.finish == C.FINISH_ERROR:
                        raise C.DeepInferError(-6, (d.error or b"engine error").decode("utf-8", "replace"))
                    if d.finish != C.FINISH_NONE:
                        job.finish[c] = C.FINISH_NAMES.get(d.finish)
                if k < 64:
                    break

    def generate(self, prompts: Union[str, Sequence[Union[str, Dict[str, Any], Sequence[int]]]],
                 sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None,
                 use_tqdm: bool = False) -> List[RequestOutput]:
        """prompts: a string, a list of strings, or token prompts ({"prompt_token_ids": [...]} as in
        vLLM, or plain lists of ids). A text prompt is tokenized without a chat template, after BOS.
        sampling_params: one for all prompts or one per prompt (default SamplingParams())."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        norm = []
        for p in prompts:
            if isinstance(p, dict):
                if "prompt_token_ids" in p:
                    norm.append((None, list(p["prompt_token_ids"])))
                else:
                    norm.append((p["prompt"], p["prompt"]))
            elif isinstance(p, str):
                norm.append((p, p))
            else:
                norm.append((None, list(p)))
        params = self._params(sampling_params, len(norm))
        return self._run(norm, params)

    def chat(self, messages, sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None,
             use_tqdm: bool = False, chat_template_kwargs: Optional[Dict[str, Any]] = None,
             tools: Optional[List[Dict[str, Any]]] = None) -> List[RequestOutput]:
        """messages: one conversation (a list of {"role", "content"} dicts) or a list of them,
        rendered in the V4.1 chat format. chat_template_kwargs: {"thinking": bool,
        "reasoning_effort": "high" | "max"}; thinking follows the API default (on) when not given.
        The output text is the raw generation (reasoning, then the answer after </think>)."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        kw = chat_template_kwargs or {}
        prompts = []
        for conv in convs:
            body = {"model": "DeepSeek-V4.1-Flash", "messages": conv}
            if "thinking" in kw:
                body["thinking"] = {"type": "enabled" if kw["thinking"] else "disabled"}
            if "reasoning_effort" in kw:
                body["reasoning_effort"] = kw["reasoning_effort"]
            if tools:
                body["tools"] = tools
            prompts.append((None, self.encode_chat(body)))
        return self._run(prompts, self._params(sampling_params, len(prompts)))

    def encode_chat(self, body: Dict[str, Any]) -> List[int]:
        """Prompt ids of a Chat Completions request body in the V4.1 chat format."""
        L, err = self._L, C.Error()
        text = json.dumps(body).encode()
        ids = ctypes.POINTER(ctypes.c_int32)()
        n = ctypes.c_int64()
        C.check(L.di_engine_encode_chat(self._e, text, len(text), ctypes.byref(ids), ctypes.byref(n),
                                        ctypes.byref(err)), err)
        try:
            return [ids[i] for i in range(n.value)]
        finally:
            L.di_free(ids)

    @staticmethod
    def _params(sp, n):
        if sp is None:
            return [SamplingParams()] * n
        if isinstance(sp, SamplingParams):
            return [sp] * n
        sp = list(sp)
        if len(sp) != n:
            raise ValueError(f"{len(sp)} sampling params for {n} prompts")
        return sp

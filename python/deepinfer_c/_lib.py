"""ctypes bindings for the public C API in include/deepinfer.h (engine part).

The structures below restate the C declarations field by field; ctypes applies the same
alignment rules as the C compiler, so the layouts match on every ABI the library builds for.
Keep them in step with include/deepinfer.h."""

import ctypes
import os

MAX_TOP_LOGPROBS = 20

# di_finish_reason
FINISH_NONE, FINISH_STOP, FINISH_LENGTH, FINISH_CANCELLED, FINISH_ERROR = range(5)
FINISH_NAMES = {FINISH_STOP: "stop", FINISH_LENGTH: "length", FINISH_CANCELLED: "cancelled", FINISH_ERROR: "error"}

# di_grammar_kind
GRAMMAR_NONE, GRAMMAR_REGEX, GRAMMAR_JSON_SCHEMA, GRAMMAR_EBNF = range(4)


class Error(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("msg", ctypes.c_char * 1024)]


class TokenBias(ctypes.Structure):
    _fields_ = [("token", ctypes.c_int32), ("bias", ctypes.c_float)]


class SamplingParamsC(ctypes.Structure):
    _fields_ = [
        ("temperature", ctypes.c_float),
        ("top_k", ctypes.c_int32),
        ("top_p", ctypes.c_float),
        ("min_p", ctypes.c_float),
        ("presence_penalty", ctypes.c_float),
        ("frequency_penalty", ctypes.c_float),
        ("repetition_penalty", ctypes.c_float),
        ("logit_bias", ctypes.POINTER(TokenBias)),
        ("n_logit_bias", ctypes.c_int32),
        ("seed", ctypes.c_uint64),
        ("logprobs", ctypes.c_int32),
        ("n_top_logprobs", ctypes.c_int32),
        ("logprobs_mode", ctypes.c_int),
    ]


class TokenLogprobs(ctypes.Structure):
    _fields_ = [
        ("logprob", ctypes.c_float),
        ("n_top", ctypes.c_int32),
        ("top_ids", ctypes.c_int32 * MAX_TOP_LOGPROBS),
        ("top_logprobs", ctypes.c_float * MAX_TOP_LOGPROBS),
    ]


class EngineOptions(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_char_p),
        ("runner", ctypes.c_char_p),
        ("n_threads", ctypes.c_int32),
        ("max_context", ctypes.c_int64),
        ("cache_tokens", ctypes.c_int64),
        ("max_seqs", ctypes.c_int32),
        ("max_step_tokens", ctypes.c_int64),
        ("prefill_chunk", ctypes.c_int32),
        ("async_", ctypes.c_int32),
        ("sample_threads", ctypes.c_int32),
        ("seed", ctypes.c_uint64),
        ("prefix_cache_bytes", ctypes.c_int64),
        ("prefix_block", ctypes.c_int32),
        ("cache_bytes", ctypes.c_int64),
    ]


class RequestOptions(ctypes.Structure):
    _fields_ = [
        ("sampling", SamplingParamsC),
        ("has_seed", ctypes.c_int32),
        ("max_tokens", ctypes.c_int64),
        ("n", ctypes.c_int32),
        ("stop", ctypes.POINTER(ctypes.c_char_p)),
        ("n_stop", ctypes.c_int32),
        ("stop_token_ids", ctypes.POINTER(ctypes.c_int32)),
        ("n_stop_token_ids", ctypes.c_int32),
        ("ignore_eos", ctypes.c_int32),
        ("prefill_chunk", ctypes.c_int32),
        ("grammar_kind", ctypes.c_int),
        ("grammar", ctypes.c_char_p),
        ("grammar_len", ctypes.c_size_t),
        ("thinking", ctypes.c_int32),
    ]


class Delta(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_int64),
        ("choice", ctypes.c_int32),
        ("tokens", ctypes.POINTER(ctypes.c_int32)),
        ("logprobs", ctypes.POINTER(TokenLogprobs)),
        ("n_tokens", ctypes.c_int64),
        ("text", ctypes.c_void_p),  # not NUL-terminated: n_text bytes
        ("n_text", ctypes.c_size_t),
        ("finish", ctypes.c_int),
        ("error", ctypes.c_char_p),
        ("prompt_tokens", ctypes.c_int64),
        ("completion_tokens", ctypes.c_int64),
        ("cache_hit_tokens", ctypes.c_int64),
    ]


def _find_library():
    path = os.environ.get("DEEPINFER_LIB")
    if path:
        return path
    here = os.path.dirname(os.path.abspath(__file__))
    candidate = os.path.join(here, "..", "..", "build", "libdeepinfer.so")
    if os.path.exists(candidate):
        return os.path.normpath(candidate)
    import ctypes.util

    found = ctypes.util.find_library("deepinfer")
    if found:
        return found
    raise OSError("libdeepinfer.so not found: build it with `make lib` or set DEEPINFER_LIB")


_lib = None


def lib():
    """The loaded shared library with argument and result types declared (loaded on first use)."""
    global _lib
    if _lib is not None:
        return _lib
    L = ctypes.CDLL(_find_library())
    P = ctypes.POINTER
    eng = ctypes.c_void_p
    decl = {
        "di_version": (ctypes.c_char_p, []),
        "di_sampling_params_default": (SamplingParamsC, []),
        "di_engine_options_default": (None, [P(EngineOptions)]),
        "di_request_options_default": (None, [P(RequestOptions)]),
        "di_engine_open": (ctypes.c_int, [ctypes.c_char_p, P(EngineOptions), P(eng), P(Error)]),
        "di_engine_close": (None, [eng]),
        "di_engine_vocab_size": (ctypes.c_int32, [eng]),
        "di_engine_max_context": (ctypes.c_int64, [eng]),
        "di_engine_eos_id": (ctypes.c_int32, [eng]),
        "di_engine_has_tokenizer": (ctypes.c_int, [eng]),
        "di_engine_add_tokens": (ctypes.c_int, [eng, P(ctypes.c_int32), ctypes.c_int64, P(RequestOptions),
                                                 P(ctypes.c_int64), P(Error)]),
        "di_engine_add_text": (ctypes.c_int, [eng, ctypes.c_char_p, ctypes.c_size_t, P(RequestOptions),
                                               P(ctypes.c_int64), P(Error)]),
        "di_engine_cancel": (ctypes.c_int, [eng, ctypes.c_int64, P(Error)]),
        "di_engine_encode_chat": (ctypes.c_int, [eng, ctypes.c_char_p, ctypes.c_size_t, P(P(ctypes.c_int32)),
                                                  P(ctypes.c_int64), P(Error)]),
        "di_free": (None, [ctypes.c_void_p]),
        "di_engine_step": (ctypes.c_int, [eng, P(Error)]),
        "di_engine_busy": (ctypes.c_int, [eng]),
        "di_engine_poll": (ctypes.c_int32, [eng, P(Delta), ctypes.c_int32]),
    }
    for name, (res, args) in decl.items():
        fn = getattr(L, name)
        fn.restype = res
        fn.argtypes = args
    # The structs above mirror include/deepinfer.h: refuse a library whose layout differs (a field
    # added on one side only would corrupt memory, not fail).
    L.di_abi_struct_size.restype = ctypes.c_size_t
    L.di_abi_struct_size.argtypes = [ctypes.c_char_p]
    for cname, py in (("di_engine_options", EngineOptions), ("di_request_options", RequestOptions),
                      ("di_delta", Delta), ("di_sampling_params", SamplingParamsC),
                      ("di_token_logprobs", TokenLogprobs), ("di_token_bias", TokenBias), ("di_error", Error)):
        want = L.di_abi_struct_size(cname.encode())
        if want != ctypes.sizeof(py):
            raise ImportError(f"deepinfer_c: {cname} is {want} bytes in the library but {ctypes.sizeof(py)} here "
                              "(rebuild the library or update python/deepinfer_c/_lib.py)")
    _lib = L
    return L


class DeepInferError(RuntimeError):
    """A library call failed; the message is the library's one-line error."""

    def __init__(self, code, msg):
        super().__init__(msg)
        self.code = code


def check(rc, err):
    if rc != 0:
        raise DeepInferError(rc, err.msg.decode("utf-8", "replace"))

"""deepinfer_c — Python bindings (ctypes, no build step) for the deepinfer C engine.

Named deepinfer_c so it never shadows the unrelated PyPI package `deepinfer`. Loads
build/libdeepinfer.so from the source tree (or $DEEPINFER_LIB, or the system library path)."""

from ._lib import DeepInferError
from .llm import LLM, CompletionOutput, RequestOutput, SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "DeepInferError", "version"]


def version() -> str:
    from . import _lib

    return _lib.lib().di_version().decode()

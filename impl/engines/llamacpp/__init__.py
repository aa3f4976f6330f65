"""The llama.cpp engine: GGUF files on llama-cpp-python, with KV prefix reuse."""

from .engine import CAPABILITIES, LlamaCppEngine
from .loading import load_llamacpp_engine

__all__ = ["CAPABILITIES", "LlamaCppEngine", "load_llamacpp_engine"]

"""The transformers (torch) engine: HF folders and GGUF files on CPU."""

from .engine import TransformersEngine
from .loading import load_transformers_engine

__all__ = ["TransformersEngine", "load_transformers_engine"]

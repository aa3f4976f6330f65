"""Steering sets: the canonical hash (public API for clients) and X-miLLM-Steering."""

from __future__ import annotations

from .hashing import canonical_form, steering_set_hash

__all__ = ["canonical_form", "steering_set_hash"]

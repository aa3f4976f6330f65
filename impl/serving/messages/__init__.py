"""Anthropic's Messages API on the chat path (contract 0.22.0)."""

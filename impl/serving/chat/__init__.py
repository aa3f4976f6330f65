"""Chat features: tools and their call formats, thinking, reasoning spans, response_format,
and a chat reply read back. It reads messages and replies, not requests: it imports only
the top of serving/ (tools/layering.py).
"""

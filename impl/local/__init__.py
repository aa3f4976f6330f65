"""The /api control plane: session and info, the config and its parameter table, decide.

It configures the request path (config builds the request defaults) and never the
reverse: nothing under serving/ imports it (tools/layering.py).
"""

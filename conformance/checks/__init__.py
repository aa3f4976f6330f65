"""The checks, one module per area of the contract; importing this package registers them.

The order here is the order they run and are reported in.
"""

from . import errors, models, replies, schema, scoring, steering, streaming, validation

__all__ = [
    "errors",
    "models",
    "replies",
    "schema",
    "scoring",
    "steering",
    "streaming",
    "validation",
]

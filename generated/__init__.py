"""Pydantic models generated from spec/ by tools/codegen. Never edit by hand."""

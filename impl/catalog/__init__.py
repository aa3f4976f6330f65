"""The shipped model catalog (models.json, a `mi.catalog/v1` document), data only.

Sizes and SHA-256 sums are the Git LFS objects of the pinned revisions;
models/catalog.py reads the file and builds each file's URL on the configured
Hugging Face endpoint.
"""

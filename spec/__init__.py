"""The contract as data: OpenAPI documents, schemas, grammar, vectors, policy tables."""

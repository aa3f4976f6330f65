"""The hostile-input corpus (tests/data/hostile/, its README.md gives the format).

    corpus.py    the format read: targets and route sets, cases, bodies expanded from
                 their templates, the outcome each request must get
    client.py    one request over loopback HTTP (httpx; raw sockets for chunked bodies,
                 hang-ups and request targets sent byte for byte) and its check
    jsontext.py  JSON text with verbatim fragments (duplicate names, NaN, lone surrogates)
    spec.py      the request-body schemas of spec/openapi, for the generator
    targets.py   every route of both documents, each with a valid base body
    edits.py     what the family generators share: case lines, expectations, paths
    wire.py      families: malformed, bytes, content_type, size, chunked
    paths.py     family: paths (segments, layers, query strings)
    reader.py    families: depth, duplicates, surrogates, paired, numbers
    fields.py    families: types, arrays
    generate.py  writes the corpus: `python -m tools.hostile` (`--check` compares)
    mutate.py    seeded random mutations of the base bodies, for the bench

The e2e test (tests/e2e/test_hostile.py) and the fuzz bench (tools/bench/fuzz.py)
read the corpus through `corpus` and send it through `client`; neither reads the
generator.
"""

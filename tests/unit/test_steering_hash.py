"""The steering-set hash (REQ-000 HASH) over spec/vectors/steering-set-hash.json, and its CLI."""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Callable
from importlib import resources
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from miserver import cli
from miserver.steering import canonical_form, steering_set_hash
from miserver.steering.hashing import applied_set, clamped_count

VECTORS: list[dict[str, Any]] = json.loads(
    (resources.files("miserver.spec") / "vectors" / "steering-set-hash.json").read_text("utf-8")
)
PINNED = {
    "TV-1": "sha256:a4eae730e5105f422b93abeece7e03bda3c29b096c07aa9cee6f247e12844105",
    "TV-2": "sha256:cc6c48faa720096e5c65fc1b2afab1b9b87659fb4465f20db421a2ed7fed78a7",
    "TV-3": "sha256:b843912201c5c18f872976e35af288e5f484d81e31a03a1dc16c3b9dbd82e710",
    "TV-4": "sha256:3f51779e6e33ee248acf6f520cb9475b4ef62f68275060bb69d2e228033b78df",
}
TV1_SAE = "LiquidAI--LFM2.5-1.2B-Instruct-sae--layer_11"


# The reference function, verbatim from REQ-000 HASH (OAI-HASH-20), run as written.
REFERENCE = r"""
import hashlib, struct
def steering_hash(sae_id, features):
    applied = {i: max(-200.0, min(200.0, float(s))) for i, s in features}
    applied = {i: s for i, s in applied.items() if s != 0.0}
    lines = ["millm.steering-set/v1", f"sae={sae_id}"]
    lines += [f"{i}:{struct.pack('>d', applied[i]).hex()}" for i in sorted(applied)]
    return "sha256:" + hashlib.sha256("".join(l + "\n" for l in lines).encode()).hexdigest()
"""
_namespace: dict[str, Any] = {}
exec(REFERENCE, _namespace)
steering_hash: Callable[[str, list[tuple[int, float]]], str] = _namespace["steering_hash"]


def pairs(vector: dict[str, Any]) -> list[tuple[int, float]]:
    return [(f["index"], f["strength"]) for f in vector["features"]]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["id"] for v in VECTORS])
def test_vector_hash_and_canonical_form(vector: dict[str, Any]) -> None:
    """OAI-HASH-01, -07..-13: every vector's canonical form and hash, as mappings and pairs."""
    assert canonical_form(vector["sae_id"], vector["features"]) == vector["canonical"]
    assert steering_set_hash(vector["sae_id"], vector["features"]) == vector["hash"]
    assert steering_set_hash(vector["sae_id"], pairs(vector)) == vector["hash"]
    digest = hashlib.sha256(vector["canonical"].encode("utf-8")).hexdigest()
    assert vector["hash"] == f"sha256:{digest}"


@pytest.mark.parametrize("vector", VECTORS, ids=[v["id"] for v in VECTORS])
def test_vector_agrees_with_the_reference(vector: dict[str, Any]) -> None:
    """OAI-HASH-20: the stored vectors were derived with the reference function."""
    assert steering_hash(vector["sae_id"], pairs(vector)) == vector["hash"]


@pytest.mark.parametrize("tv", sorted(PINNED))
def test_pinned_vectors_are_verbatim(tv: str) -> None:
    """OAI-HASH-14..17: TV-1..TV-4 as REQ-000 pins them."""
    vector = next(v for v in VECTORS if v["id"] == tv)
    assert vector["hash"] == PINNED[tv]


def test_vector_strengths_reload_bit_exactly() -> None:
    """Strengths stored by repr reload to the same binary64 (subnormals, -0.0 included)."""
    text = (resources.files("miserver.spec") / "vectors" / "steering-set-hash.json").read_text()
    assert json.loads(json.dumps(VECTORS, ensure_ascii=False)) == VECTORS
    assert '"strength": -0.0' in text and '"strength": 5e-324' in text
    for vector in VECTORS:
        for feature in vector["features"]:
            again = json.loads(json.dumps(feature["strength"]))
            assert struct.pack(">d", again) == struct.pack(">d", feature["strength"])


def test_vector_ids_unique_and_enough() -> None:
    ids = [v["id"] for v in VECTORS]
    assert len(ids) == len(set(ids)) and len(ids) >= 34


def test_canonical_form_shape() -> None:
    """OAI-HASH-07..-12: LF-terminated lines, no CR, no BOM, ascending indices, bits as hex."""
    text = canonical_form(TV1_SAE, [(100, 1.0), (9, -2.0), (20, 0.0)])
    assert text == (
        f"millm.steering-set/v1\nsae={TV1_SAE}\n9:c000000000000000\n100:3ff0000000000000\n"
    )
    assert "\r" not in text and not text.startswith("\ufeff")


def test_layer_is_not_hashed_and_zeros_drop() -> None:
    """OAI-HASH-02, -04: the same set hashes alike; 0.0 and -0.0 do not count."""
    base = steering_set_hash(TV1_SAE, [(1234, 8.0)])
    assert steering_set_hash(TV1_SAE, [(1234, 8.0), (5, 0.0), (6, -0.0)]) == base
    assert applied_set([(1, -0.0), (2, 0.0)]) == {}


def test_clamp_applies_and_is_counted() -> None:
    """OAI-HASH-05, -17: applied = clamp(s, -200, 200); `clamped` counts the changed ones."""
    features = [(1, 500.0), (2, -200.0), (3, -200.5), (4, 200.0)]
    assert applied_set(features) == {1: 200.0, 2: -200.0, 3: -200.0, 4: 200.0}
    assert clamped_count(features) == 2


@pytest.mark.parametrize(
    ("features", "error"),
    [
        ([(1, True)], TypeError),
        ([{"index": 1, "strength": False}], TypeError),
        ([(True, 1.0)], TypeError),
        ([(-1, 1.0)], ValueError),
        ([(1.0, 1.0)], TypeError),
        ([(1, "1.0")], TypeError),
        ([(1, None)], TypeError),
        ([(1, math.nan)], ValueError),
        ([(1, math.inf)], ValueError),
        ([{"index": 1, "strength": -math.inf}], ValueError),
        ([{"index": 1}], ValueError),
        ([(1, 2.0, 3.0)], TypeError),
        ([7], TypeError),
    ],
)
def test_bad_features_are_refused(features: list[Any], error: type[Exception]) -> None:
    """Booleans, negative or non-int indices and non-finite strengths are refused."""
    with pytest.raises(error):
        steering_set_hash("sae", features)


finite = st.floats(allow_nan=False, allow_infinity=False)
strengths = st.one_of(
    finite,
    st.sampled_from([0.0, -0.0, 200.0, -200.0, 5e-324, 200.00000000000003]),
    st.integers(min_value=-(10**6), max_value=10**6),
)
feature_lists = st.lists(st.tuples(st.integers(min_value=0, max_value=2**70), strengths))


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",))), feature_lists)
def test_agrees_with_the_reference_function(sae_id: str, features: list[tuple[int, float]]) -> None:
    """OAI-HASH-20: ours equals the verbatim reference on every valid input."""
    assert steering_set_hash(sae_id, features) == steering_hash(sae_id, features)
    mappings = [{"index": i, "strength": s} for i, s in features]
    assert steering_set_hash(sae_id, mappings) == steering_hash(sae_id, features)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        cli.main(["steering-hash", *argv])
    out, err = capsys.readouterr()
    code = exited.value.code
    assert isinstance(code, int)
    return code, out, err


def test_cli_prints_the_hash(capsys: pytest.CaptureFixture[str]) -> None:
    """`miserver steering-hash` reproduces TV-1 from mappings and TV-3 from pairs."""
    code, out, _ = run_cli(
        capsys, "--sae-id", TV1_SAE, "--features", '[{"index": 1234, "strength": 8.0}]'
    )
    assert (code, out) == (0, PINNED["TV-1"] + "\n")
    tv3 = next(v for v in VECTORS if v["id"] == "TV-3")
    code, out, _ = run_cli(capsys, "--sae-id", tv3["sae_id"], "--features", json.dumps(pairs(tv3)))
    assert (code, out) == (0, PINNED["TV-3"] + "\n")


def test_cli_prints_the_canonical_form(capsys: pytest.CaptureFixture[str]) -> None:
    """--canonical prints the canonical form exactly (it ends in LF)."""
    tv4 = next(v for v in VECTORS if v["id"] == "TV-4")
    argv = ["--sae-id", tv4["sae_id"], "--features", json.dumps(tv4["features"]), "--canonical"]
    code, out, _ = run_cli(capsys, *argv)
    assert (code, out) == (0, tv4["canonical"])


@pytest.mark.parametrize(
    ("features", "message"),
    [
        ("[1", "not valid JSON"),
        ('{"index": 1}', "must be a JSON list"),
        ("[[1, true]]", "strength must be a number"),
        ("[[1, NaN]]", "must be finite"),
        ('[{"index": -3, "strength": 1}]', "index must be >= 0"),
        ('["x"]', "invalid steering set"),
    ],
)
def test_cli_refuses_bad_features(
    capsys: pytest.CaptureFixture[str], features: str, message: str
) -> None:
    """Bad JSON or a bad set: exit code 2, a message on stderr, nothing on stdout."""
    code, out, err = run_cli(capsys, "--sae-id", "sae", "--features", features)
    assert code == 2 and out == ""
    assert message in err and err.startswith("miserver steering-hash:")

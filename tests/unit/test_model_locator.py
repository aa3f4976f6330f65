"""Where a client may name a model from: the rules of impl/models/locator.py (LOC-SEC-56..66)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from miserver.errors import ApiError
from miserver.models.locator import ModelLocator, is_loopback_peer
from miserver.models.registry import ModelRegistry


@pytest.fixture
def folders(tmp_path: Path) -> dict[str, Path]:
    found = {name: tmp_path / name for name in ("models", "scan", "outside")}
    for folder in found.values():
        folder.mkdir()
    (found["outside"] / "x.gguf").write_bytes(b"")
    os.symlink(found["outside"] / "x.gguf", found["models"] / "link.gguf")
    os.symlink(found["outside"], found["models"] / "dir-link")
    return found


def locator(folders: dict[str, Path], *, models_only: bool = False) -> ModelLocator:
    registry = ModelRegistry(folders["models"], None)
    return ModelLocator(registry, (folders["scan"],), models_only)


@pytest.mark.parametrize(
    ("peer", "local"),
    [
        (("127.0.0.1", 1), True),
        (("127.9.9.9", 1), True),
        (("::1", 1), True),
        (("192.0.2.7", 1), False),
        (("::ffff:10.0.0.1", 1), False),
        (("testclient", 1), False),
        (None, False),
    ],
    ids=["LOC-SEC-65-v4", "LOC-SEC-65-v4-net", "LOC-SEC-65-v6", "net", "mapped", "name", "none"],
)
def test_who_is_local_is_the_tcp_peer(peer: tuple[str, int] | None, local: bool) -> None:
    """LOC-SEC-65: only the peer address decides; a name or no peer is not loopback."""
    assert is_loopback_peer({"client": peer, "headers": []}) is local


def test_paths_are_canonical_and_relative_ones_inside_the_models_dir(
    folders: dict[str, Path],
) -> None:
    """LOC-SEC-59, -60: `..` and links resolved; relative means inside the models dir."""
    found = locator(folders)
    assert found.canonical("a.gguf") == folders["models"].resolve() / "a.gguf"
    assert found.canonical("../outside/x.gguf") == folders["outside"].resolve() / "x.gguf"
    assert found.canonical("link.gguf") == folders["outside"].resolve() / "x.gguf"
    assert found.canonical("dir-link/x.gguf") == folders["outside"].resolve() / "x.gguf"


@pytest.mark.parametrize(
    ("model", "inside"),
    [
        ("a.gguf", True),
        ("sub/a.gguf", True),
        ("{scan}/b.gguf", True),
        ("{outside}/x.gguf", False),
        ("../outside/x.gguf", False),
        ("link.gguf", False),
        ("dir-link/x.gguf", False),
        ("{models}", False),
        ("/etc/passwd", False),
    ],
)
def test_confined_peers_stay_in_the_model_folders(
    folders: dict[str, Path], model: str, inside: bool
) -> None:
    """LOC-SEC-58, -61, -63, -64: a network peer, or any peer with --models-only, is refused
    outside the models dir and scan dirs; a loopback peer without it never is."""
    name = model.format(**{key: str(path) for key, path in folders.items()})
    for confined in (locator(folders), locator(folders, models_only=True)):
        local = confined.models_only
        if inside:
            confined.check(name, peer_local=local)
        else:
            with pytest.raises(ApiError) as refused:
                confined.check(name, peer_local=local)
            assert (refused.value.code, refused.value.param) == ("outside_models_dir", "model")
    locator(folders).check(name, peer_local=True)


def test_an_unknown_name_is_the_registrys_404(folders: dict[str, Path]) -> None:
    """LOC-SEC-61: a name inside that is no file is model_not_found, never a 403."""
    with pytest.raises(ApiError) as missing:
        locator(folders).find("nothing-here", peer_local=False)
    assert missing.value.code == "model_not_found"


@pytest.mark.parametrize(
    "model", ["a\x00b", "x" * 5000, "/" + "y/" * 3000], ids=["nul", "long", "deep"]
)
def test_text_no_path_can_be_is_a_400_or_unknown(folders: dict[str, Path], model: str) -> None:
    """LOC-GEN-17: no `model` text makes a 500: it is a 400 naming `model`, a 403 or a 404,
    and the config reads it as naming no model."""
    found = locator(folders)
    assert found.known(model) is False
    with pytest.raises(ApiError) as refused:
        found.find(model, peer_local=False)
    assert refused.value.status in (400, 403, 404) and refused.value.param == "model"
    with pytest.raises(ApiError):
        found.find(model, peer_local=True)

"""The `local` listing of `GET /api/models` (LOC-MODELS-04..26), over real files in tmp_path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from miserver.models.listing import LocalModel, list_local
from miserver.models.registry import embedded_default
from tests.models import write_gguf

WIRE_KEYS = {
    "name",
    "path",
    "dir",
    "folder",
    "bytes",
    "shards",
    "files",
    "arch",
    "role",
    "streamable",
    "complete",
}


def names(models: list[LocalModel]) -> list[str]:
    return [m.name for m in models]


def only(models: list[LocalModel]) -> LocalModel:
    assert len(models) == 1, names(models)
    return models[0]


def test_models_dir_first_then_scan_dirs_in_order(tmp_path: Path) -> None:
    """LOC-MODELS-04/12: the models directory, then each scan directory in the order given."""
    home, first, second = tmp_path / "home", tmp_path / "b-scan", tmp_path / "a-scan"
    write_gguf(home / "h.gguf")
    write_gguf(first / "f.gguf")
    write_gguf(second / "s.gguf")
    models = list_local(home, [first, second])
    assert names(models) == ["h.gguf", "f.gguf", "s.gguf"]
    assert [m.dir for m in models] == [str(home), str(first), str(second)]


def test_a_directory_named_twice_is_listed_once(tmp_path: Path) -> None:
    """LOC-MODELS-04: a scan directory that is the models directory adds nothing."""
    write_gguf(tmp_path / "m.gguf")
    assert names(list_local(tmp_path, [tmp_path, tmp_path / "."])) == ["m.gguf"]


def test_one_level_deep_own_files_first(tmp_path: Path) -> None:
    """LOC-MODELS-07/08/13: own files, then each folder's by name, nothing deeper."""
    write_gguf(tmp_path / "z.gguf")
    write_gguf(tmp_path / "A" / "a.gguf")
    write_gguf(tmp_path / "B" / "b.gguf")
    write_gguf(tmp_path / "A" / "deeper" / "c.gguf")
    models = list_local(tmp_path, [])
    assert names(models) == ["z.gguf", "a.gguf", "b.gguf"]
    assert [m.folder for m in models] == ["", "A", "B"]
    for m in models:
        assert m.path == os.path.join(m.dir, m.folder, m.name)


def test_link_to_folder_is_not_followed(tmp_path: Path) -> None:
    """LOC-MODELS-09: a linked folder (outside, or a loop) is never read."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    write_gguf(outside / "o.gguf")
    write_gguf(root / "r.gguf")
    (root / "away").symlink_to(outside, target_is_directory=True)
    (root / "loop").symlink_to(root, target_is_directory=True)
    assert names(list_local(root, [])) == ["r.gguf"]


def test_link_to_file_is_listed_by_its_own_path(tmp_path: Path) -> None:
    """LOC-MODELS-09/10: a linked file cannot loop; it is listed where the link is."""
    target = write_gguf(tmp_path / "elsewhere" / "t.gguf")
    root = tmp_path / "root"
    root.mkdir()
    (root / "linked.gguf").symlink_to(target)
    (root / "broken.gguf").symlink_to(tmp_path / "missing.gguf")
    model = only(list_local(root, []))
    assert (model.name, model.path) == ("linked.gguf", str(root / "linked.gguf"))
    assert model.bytes == target.stat().st_size
    assert model.role == "model"


def test_split_set_listed_once_complete(tmp_path: Path) -> None:
    """LOC-MODELS-05/06/07/14: one entry by the first shard, files in shard order, sizes summed."""
    folder = tmp_path / "Big"
    shards = [write_gguf(folder / f"Big-Q4-0000{i}-of-00003.gguf") for i in (3, 1, 2)]
    write_gguf(folder / "other.gguf")
    models = list_local(tmp_path, [])
    assert names(models) == ["Big-Q4-00001-of-00003.gguf", "other.gguf"]
    split = models[0]
    assert split.folder == "Big"
    assert split.path == str(folder / "Big-Q4-00001-of-00003.gguf")
    assert split.files == tuple(str(folder / f"Big-Q4-0000{i}-of-00003.gguf") for i in (1, 2, 3))
    assert (split.shards, split.complete) == (3, True)
    assert split.bytes == sum(p.stat().st_size for p in shards)


def test_split_set_with_a_shard_missing(tmp_path: Path) -> None:
    """LOC-MODELS-06/14 (open point 26): complete false, bytes of the present files only."""
    present = [write_gguf(tmp_path / f"S-0000{i}-of-00003.gguf") for i in (1, 3)]
    model = only(list_local(tmp_path, []))
    assert (model.shards, model.complete) == (3, False)
    assert model.files == tuple(str(p) for p in present)
    assert model.bytes == sum(p.stat().st_size for p in present)


def test_split_set_without_its_first_shard(tmp_path: Path) -> None:
    """LOC-MODELS-05/06: listed by its lowest present shard, incomplete."""
    for i in (3, 2):
        write_gguf(tmp_path / f"S-0000{i}-of-00003.gguf")
    model = only(list_local(tmp_path, []))
    assert model.name == "S-00002-of-00003.gguf"
    assert (model.shards, model.complete, len(model.files)) == (3, False, 2)


def test_single_file_is_one_complete_shard(tmp_path: Path) -> None:
    """LOC-MODELS-06/11: a plain file has shards 1, complete true; `.GGUF` counts too."""
    path = write_gguf(tmp_path / "Upper.GGUF")
    model = only(list_local(tmp_path, []))
    assert (model.shards, model.complete, model.files) == (1, True, (str(path),))
    assert (model.format, model.arch) == ("gguf", "llama")


def test_part_files_are_not_models(tmp_path: Path) -> None:
    """LOC-MODELS-04: a download in progress (`.part`) is not listed."""
    write_gguf(tmp_path / "x.gguf.part")
    write_gguf(tmp_path / "y-00001-of-00002.gguf.part")
    write_gguf(tmp_path / "y-00002-of-00002.gguf")
    model = only(list_local(tmp_path, []))
    assert (model.name, model.complete) == ("y-00002-of-00002.gguf", False)


def test_missing_directories_list_nothing(tmp_path: Path) -> None:
    """LOC-MODELS-04: a missing models or scan directory is no error."""
    assert list_local(tmp_path / "none", [tmp_path / "gone"]) == []
    write_gguf(tmp_path / "scan" / "m.gguf")
    assert names(list_local(tmp_path / "none", [tmp_path / "scan"])) == ["m.gguf"]


@pytest.mark.parametrize(
    ("arch", "header", "role"),
    [
        ("llama", {}, "model"),
        ("llama", {"kind": "model"}, "model"),
        ("llama", {"kind": "mmproj"}, "projector"),
        ("clip", {}, "projector"),
        ("clip", {"blocks": None}, "projector"),
        ("llama", {"target_layers": True}, "draft"),
        ("llama", {"blocks": None, "target_layers": True}, "draft"),
        ("glm4moe", {"blocks": 1, "nextn": 1}, "draft"),
        ("glm4moe", {"blocks": 47, "nextn": 1}, "model"),
        ("llama", {"kind": "adapter"}, "other"),
        ("llama", {"blocks": None}, "other"),
    ],
)
def test_role_from_header(tmp_path: Path, arch: str, header: dict[str, object], role: str) -> None:
    """LOC-MODELS-22..25: projector, draft, other, model, as the header says."""
    write_gguf(tmp_path / "m.gguf", arch, **header)  # type: ignore[arg-type]
    model = only(list_local(tmp_path, []))
    assert (model.arch, model.role) == (arch, role)
    assert model.as_json()["loadable"] is (role == "model")


def test_role_never_from_the_name(tmp_path: Path) -> None:
    """LOC-MODELS-21: a file named like a projector with a model header is a model."""
    write_gguf(tmp_path / "mmproj-draft-model-f16.gguf")
    assert only(list_local(tmp_path, [])).role == "model"


def test_unreadable_header_has_empty_role(tmp_path: Path) -> None:
    """LOC-MODELS-26: a `.gguf` that does not parse is listed with role and arch ""."""
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf at all")
    (tmp_path / "short.gguf").write_bytes(b"GGUF\x03\x00")
    models = list_local(tmp_path, [])
    assert names(models) == ["junk.gguf", "short.gguf"]
    assert {(m.arch, m.role, m.loadable) for m in models} == {("", "", False)}


def test_the_embedded_model(tmp_path: Path) -> None:
    """LOC-MODELS-19/25: the shipped SmolLM2 GGUF reads as a llama model."""
    path = embedded_default()
    found = list_local(tmp_path / "none", [path.parent])
    model = next(m for m in found if m.path == str(path))
    assert (model.arch, model.role, model.format) == ("llama", "model", "gguf")
    assert model.bytes == path.stat().st_size


def hf_folder(folder: Path, config: object, weights: tuple[str, ...]) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text("{}")
    for name in weights:
        (folder / name).write_bytes(b"w" * 10)
    return folder


def test_hf_folder_is_one_entry(tmp_path: Path) -> None:
    """LOC-MODELS-11/14 (open point 27): `config.json` + weights is one `hf` model entry."""
    folder = hf_folder(tmp_path / "Tiny", {"model_type": "qwen2"}, ("model.safetensors",))
    write_gguf(folder / "tiny.gguf")
    (folder / "model.safetensors.part").write_bytes(b"p")
    hf, packed = list_local(tmp_path, [])
    assert (hf.name, hf.path, hf.dir, hf.folder) == ("Tiny", str(folder), str(tmp_path), "")
    assert (hf.format, hf.arch, hf.role, hf.loadable) == ("hf", "qwen2", "model", True)
    assert hf.files == tuple(
        str(folder / n) for n in ("config.json", "model.safetensors", "tokenizer.json")
    )
    assert hf.bytes == sum(Path(f).stat().st_size for f in hf.files)
    assert (hf.shards, hf.complete) == (1, True)
    assert (packed.name, packed.folder, packed.format) == ("tiny.gguf", "Tiny", "gguf")


def test_hf_folder_sharded_with_a_shard_missing(tmp_path: Path) -> None:
    """LOC-MODELS-06: an HF checkpoint whose index names an absent shard is incomplete."""
    shards = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    folder = hf_folder(tmp_path / "Sharded", {"model_type": "llama"}, shards[:1])
    index = {"weight_map": {"a": shards[0], "b": shards[1]}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    model = only(list_local(tmp_path, []))
    assert (model.shards, model.complete) == (2, False)


def test_hf_folder_needs_config_and_weights(tmp_path: Path) -> None:
    """Open point 27: a folder with only config.json, or only weights, is no model."""
    hf_folder(tmp_path / "NoWeights", {"model_type": "llama"}, ())
    (tmp_path / "NoConfig").mkdir()
    (tmp_path / "NoConfig" / "pytorch_model.bin").write_bytes(b"w")
    hf_folder(tmp_path / "Bin", {"model_type": "gpt2"}, ("pytorch_model.bin",))
    assert names(list_local(tmp_path, [])) == ["Bin"]


def test_hf_folder_with_unreadable_config(tmp_path: Path) -> None:
    """LOC-MODELS-26 by analogy: a config.json that does not parse gives role and arch ""."""
    folder = hf_folder(tmp_path / "Bad", {}, ("model.safetensors",))
    (folder / "config.json").write_text("{not json")
    model = only(list_local(tmp_path, []))
    assert (model.arch, model.role, model.loadable) == ("", "", False)


def test_wire_object(tmp_path: Path) -> None:
    """LOC-MODELS-11/20: the wire keys, plus `format` and `loadable`; `streamable` false."""
    write_gguf(tmp_path / "m.gguf")
    wire = only(list_local(tmp_path, [])).as_json()
    assert set(wire) == WIRE_KEYS | {"format", "loadable"}
    assert wire["streamable"] is False
    assert wire["files"] == [str(tmp_path / "m.gguf")]
    json.dumps(wire)

"""Which model a client's `model` names, and where it may name one from (LOC-SEC-56).

`model` is a registry id (`SmolLM2-135M-Instruct:Q4_1`, an HF folder's
name) or a path. A path is read only, never written (LOC-SEC-56). A relative
path is taken inside the models directory (LOC-SEC-60), and every path is
made canonical, each `..` and symbolic link resolved, before the check
(LOC-SEC-59):

    peer          --models-only   may open
    loopback      no              any path its user can read   (LOC-SEC-63)
    loopback      yes             the model folders only       (LOC-SEC-64)
    network       either          the model folders only       (LOC-SEC-58)

"The model folders" are the models directory and each `--scan-dir`. The
launch model is the operator's and is never confined (LOC-SEC-66). Who is
local is decided by the TCP peer address alone (LOC-SEC-65): uvicorn runs
without proxy headers. A confined path that resolves elsewhere is
`403 outside_models_dir` before anything is looked up, so a network peer
learns nothing about files outside (LOC-SEC-61).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engines.base import ENGINE_NAMES, EngineId
from ..errors import ApiError
from .registry import ModelEntry, ModelRegistry, entries_for

ENGINE_CHOICES: dict[str, EngineId | None] = {
    "auto": None,
    **{name: engine for engine, name in ENGINE_NAMES.items()},
}
"""The config's `engine` values (display names) as engines (None: the path's own)."""


def is_loopback_peer(scope: Mapping[str, Any]) -> bool:
    """Whether an ASGI request's TCP peer is loopback (127.0.0.0/8, ::1); no peer is not."""
    client = scope.get("client")
    if not client:
        return False
    try:
        return ipaddress.ip_address(str(client[0])).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class ModelLocator:
    registry: ModelRegistry
    scan_dirs: Sequence[Path] = ()
    models_only: bool = False

    def confined(self, peer_local: bool) -> bool:
        return self.models_only or not peer_local

    def canonical(self, model: str, param: str = "model") -> Path:
        """`model` as a canonical path; a relative one inside the models directory. Text no
        path can be (a NUL byte, a link loop, a name too long) is a 400 naming `param`."""
        try:
            path = Path(model).expanduser()
            if not path.is_absolute():
                path = self.registry.models_dir / path
            return path.resolve()
        except (OSError, RuntimeError, ValueError) as exc:
            message = f"`{param}` is not a usable path: {exc}"
            raise ApiError("invalid_parameter", message, param) from exc

    def allowed(self, path: Path) -> bool:
        """Whether a canonical path lies in a model folder, or is the launch model."""
        launch = self.registry.launch_path
        if launch is not None and path == launch.resolve():
            return True
        roots = (self.registry.models_dir, *self.scan_dirs)
        return any(path != root and path.is_relative_to(root) for root in _canonical(roots))

    def check_file(self, path: str, *, peer_local: bool, param: str) -> None:
        """403 outside_models_dir for a file (a probe's sidecar) a confined peer names
        outside the model folders, before anything is read (LOC-SEC-58, LOC-SEC-61)."""
        if self.confined(peer_local):
            self._confine(path, param)

    def check(self, model: str, *, peer_local: bool) -> None:
        """403 outside_models_dir for a path this peer may not open; ids always pass."""
        if self.confined(peer_local) and not self._is_id(model):
            self._confine(model)

    def _confine(self, model: str, param: str = "model") -> Path:
        """`model`'s canonical path, if it lies where a confined peer may open files."""
        path = self.canonical(model, param)
        if not self.allowed(path):
            raise ApiError(
                "outside_models_dir",
                "This client may open files only inside the models directory or a scan "
                "directory; the path resolves elsewhere.",
                param,
            )
        return path

    def find(self, model: str, *, peer_local: bool, engine: str = "auto") -> ModelEntry:
        """The entry `model` names: a registry id, else a path (checked, then opened), on
        the `engine` the config asks for (auto: the id's or the file's own).

        An unknown name that is no model file either gets the registry's own
        refusal (404 model_not_found, listing the ids; AMBIGUOUS_MODEL_NAME).
        """
        wanted = ENGINE_CHOICES.get(engine)
        try:
            entry = self.registry.entry(model)
        except ApiError as exc:
            if exc.code != "model_not_found":
                raise  # ambiguous names are the registry's to refuse
            path = self._confine(model) if self.confined(peer_local) else self.canonical(model)
            if not _exists(path):
                raise  # neither an id nor a file
        else:
            if wanted is None or entry.engine == wanted:
                return entry
            path = entry.path  # the same file on the engine the config asks for
        opened = self.registry.open(path, wanted)
        if opened is None:
            what = "a .gguf file or an HF model folder" if wanted is None else f"served by {engine}"
            raise ApiError("invalid_parameter", f"`{model}` is not {what}.", "model")
        return opened

    def known(self, model: str) -> bool:
        """Whether `model` names a model (an id, or a model file or folder), opening nothing."""
        if not model:
            return False
        if self._is_id(model):
            return True
        try:
            return bool(entries_for(self.canonical(model)))
        except (ApiError, OSError, ValueError):
            return False

    def _is_id(self, model: str) -> bool:
        try:
            self.registry.entry(model)
        except ApiError as exc:
            return exc.code != "model_not_found"  # ambiguous names are the registry's to refuse
        return True


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _canonical(roots: Sequence[Path]) -> list[Path]:
    return [root.expanduser().resolve() for root in roots]

"""The /api/hf routes (REQ-003 HFS, HFM, HFA, HFE): search the site, list a repository's
models, add one to the catalog, forget an added entry.

An added entry (`hf:<repo>/<name>`) is built by the server from the listing it
fetched itself, never from what the client sent beyond the repository and the
model's name (LOC-SEC-48): each shard is a file of the entry, its URL rebuilt
on the configured endpoint, its SHA-256 the site's LFS object id. Files land
in the models directory under their own names, folders dropped.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from ..errors import ApiError
from . import inspection
from .catalog import Catalog, CatalogFile, Entry
from .hub import Hub, HubModel, Target, checked_path, models_of, parse_target
from .inspection import FIRST_SPAN, HEADER_BYTES, Machine


class HfAdmin:
    def __init__(self, hub: Hub, catalog: Catalog) -> None:
        self.hub = hub
        self.catalog = catalog

    async def search(self, query: str, token: str | None) -> dict[str, Any]:
        return {"query": query, "repos": await self.hub.search(query, token)}

    async def _listing(self, text: str, token: str | None) -> tuple[Target, list[HubModel]]:
        target = parse_target(text, self.hub.endpoint)
        return target, models_of(await self.hub.files(target, token))

    async def _model(self, text: str, name: str, token: str | None) -> tuple[Target, HubModel]:
        """The listed model `name` (a validated path; 404 when the listing lacks it)."""
        checked_path(name)
        target, models = await self._listing(text, token)
        model = next((m for m in models if m.name == name), None)
        if model is None:
            raise ApiError("not_found", f"`{target.repo}` has no model `{name}`.", "name")
        return target, model

    async def models(self, text: str, token: str | None) -> dict[str, Any]:
        """POST /api/hf/models: the repository's gguf files as models (LOC-HFM)."""
        target, models = await self._listing(text, token)
        return {
            "repo": target.repo,
            "revision": target.revision,
            "file": target.file,
            "models": [m.as_json() for m in models],
        }

    async def add(self, text: str, name: str, token: str | None) -> dict[str, Any]:
        """POST /api/hf/add: the model `name` of the repository as catalog entry
        `hf:<repo>/<name>`, persisted; replaces an earlier addition (LOC-HFA)."""
        target, model = await self._model(text, name, token)
        if not model.complete:
            raise ApiError(
                "incomplete_set",
                f"`{name}` is a split set with {model.count - len(model.files)} of its "
                f"{model.count} shards missing on the site.",
                "name",
            )
        entry_id = f"hf:{target.repo}/{name}"
        if self.catalog.shipped(entry_id):
            raise ApiError("conflict", f"`{entry_id}` is a shipped catalog entry.", "name")
        files = tuple(
            CatalogFile(PurePosixPath(f.path).name, f.bytes, f.sha256, f.path) for f in model.files
        )
        title = PurePosixPath(name).name.removesuffix(".gguf")
        entry = Entry(
            id=entry_id,
            title=title,
            quant=model.quant,
            repo=target.repo,
            revision=target.revision,
            files=files,
            blurb=f"Added from {target.repo} at {target.revision}.",
            added=True,
        )
        self.catalog.add(entry)
        return {"id": entry.id, "title": entry.title, "quant": entry.quant, "bytes": entry.bytes}

    async def inspect(
        self, text: str, name: str, token: str | None, machine: Machine
    ) -> dict[str, Any]:
        """POST /api/hf/inspect: the model's header, read by range requests before a byte of
        it is downloaded, and what this machine can do with it (LOC-HFI)."""
        target, model = await self._model(text, name, token)
        headers = [await self._header(target, f.path, f.bytes, token) for f in model.files]
        facts = inspection.model_facts(headers)
        present = inspection.present_bytes(
            [(PurePosixPath(f.path).name, f.bytes) for f in model.files], machine.models_dir
        )
        facts_machine = machine.view(present)
        verdict = inspection.verdict(model.name, model.bytes, facts, facts_machine)
        return {
            "repo": target.repo,
            "revision": target.revision,
            "name": model.name,
            "quant": model.quant,
            "bytes": model.bytes,
            "files": len(model.files),
            "complete": model.complete,
            "model": facts,
            "machine": facts_machine,
            "verdict": verdict,
        }

    async def _header(self, target: Target, path: str, size: int, token: str | None) -> bytes:
        """A GGUF file's header, read by ranges that grow only while it runs past them: the
        first FIRST_SPAN bytes, then, while the header is cut, the next bytes (the whole read
        so far doubled, and more), at most HEADER_BYTES in all (LOC-HFI-02)."""
        head = b""
        want = min(size, FIRST_SPAN, HEADER_BYTES)
        while True:
            head += await self.hub.span(target, path, len(head), want - len(head), token)
            last = len(head) < want or want >= min(size, HEADER_BYTES)
            if last or not inspection.cut(head):
                return head
            want = min(want * 4, size, HEADER_BYTES)

    def forget(self, entry_id: str) -> None:
        """DELETE /api/hf/entry/{id}: an added entry leaves the catalog; its files stay."""
        try:
            self.catalog.forget(entry_id)
        except KeyError:
            raise ApiError(
                "not_found", f"`{entry_id}` is not an entry added with POST /api/hf/add.", "id"
            ) from None

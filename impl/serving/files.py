"""The Files API's rules (`/v1/files`, issue 50; contract 0.30.0) over the file store.

An upload is refused before anything is kept when its purpose is not `batch` (400 naming
`purpose`), its name is empty (`filename`) or it holds more than `limit` bytes (413: the
FILES_MAX_BYTES setting, within the request body cap). Lists are OpenAI's pages, newest
first by default; an unknown id is `404 not_found` naming `file_id`.
"""

from __future__ import annotations

from typing import Any

from ..errors import ApiError, InvalidParameter
from ..store.files import FileNotFound, FileStore, StoredFile
from .paging import page

UPLOADED = "batch"  # the one purpose a client uploads with


class FileService:
    def __init__(self, store: FileStore) -> None:
        self.store = store

    def upload(self, filename: str, purpose: str, content: bytes) -> StoredFile:
        if purpose != UPLOADED:
            raise InvalidParameter(
                "purpose",
                f"`purpose` must be `{UPLOADED}` here (a batch's input), not {purpose!r}.",
            )
        if not filename.strip():
            raise InvalidParameter("filename", "The file needs a name.")
        if len(content) > self.store.limit:
            raise ApiError(
                "payload_too_large",
                f"The file holds {len(content)} bytes; at most {self.store.limit} are kept "
                "(FILES_MAX_BYTES).",
                "file",
            )
        return self.store.add(filename.strip(), purpose, content)

    def found(self, file_id: str, *, param: str = "file_id") -> StoredFile:
        """The file; 404 naming `param` when no file has this id."""
        try:
            return self.store.get(file_id)
        except FileNotFound:
            raise ApiError("not_found", f"No file has the id `{file_id}`.", param) from None

    def content(self, file_id: str) -> bytes:
        self.found(file_id)
        return self.store.content(file_id)

    def delete(self, file_id: str) -> dict[str, Any]:
        self.found(file_id)
        self.store.delete(file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    def listed(
        self, purpose: str | None, *, limit: int, order: str, after: str | None
    ) -> dict[str, Any]:
        views = [f.view() for f in self.store.listed(purpose)]
        return page(views, limit=limit, order=order, after=after)

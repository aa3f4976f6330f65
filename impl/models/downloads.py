"""Downloads of catalog entries into the models directory (REQ-003 DL, PART; LOC-SEC-43..47).

A download takes a catalog id, never a URL or a path. Each file of the entry
goes through the system `curl` to `<name>.part` in the models directory,
resuming whatever `.part` is there (`--continue-at -`), and is renamed to
`<name>` once whole and, where the catalog knows its SHA-256, verified: a file
that does not match is moved aside to `<name>.bad`, never listed as a model,
and the download ends in `error` naming it.

The line failing (curl exit 6, 7, 16, 18, 28, 35, 52, 55, 56 or 92) is retried
on its own from the `.part`: at most six attempts a file, waiting
DOWNLOAD_RETRY_WAIT_S (2 s) doubled each time up to DOWNLOAD_RETRY_WAIT_MAX_S
(60 s), the `download` event staying `running` with the failure in `error`.
Any other failure ends the download in `error` at once; the `.part` stays.
Before a byte moves, the bytes still needed are checked against the free
space of the models directory: 507 `no_space` when they do not fit.

Jobs live in memory; what the catalog shows comes from the files on disk
(models/catalog.py), so a restart, a failure or a cancel leaves a `.part` that
the next start resumes. Redirects are followed only within the endpoint's own
scheme (`--proto-redir`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ApiError
from . import curl
from .catalog import PART, Catalog, CatalogFile, Entry, on_disk

log = logging.getLogger(__name__)

RETRYABLE = curl.LINE_FAILED  # the line failed (LOC-DL-09)
ATTEMPTS = 6  # per file (LOC-DL-10)
EVENT_EVERY_S = 0.25  # at most four progress events a second
BAD = ".bad"
PR_SET_PDEATHSIG = 1  # prctl(2)

Publish = Callable[[str, dict[str, Any]], None]
FreeSpace = Callable[[Path], int]


def _die_with_parent() -> None:
    """In the curl child, before exec: on Linux, be killed when the server dies (even by
    SIGKILL), so no orphan goes on writing a `.part` the next start resumes."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@functools.cache
def _tied_to_server() -> tuple[tuple[str, ...], Callable[[], None] | None]:
    """How curl is started so that it dies with the server: util-linux `setpriv
    --pdeathsig KILL` in front of it where there is one, else a `prctl` in the child before
    exec. A `preexec_fn` makes Python fork the whole server (tens of ms with a model
    resident) where it would otherwise vfork, so setpriv is preferred."""
    if not sys.platform.startswith("linux"):
        return (), None
    setpriv = shutil.which("setpriv")
    if setpriv is not None:
        return (setpriv, "--pdeathsig", "KILL", "--"), None
    return (), _die_with_parent


def retry_waits(first_s: float, max_s: float) -> list[float]:
    """The waits before each retry of a file: `first_s` doubled each time, at most `max_s`
    (LOC-DL-11); one fewer than ATTEMPTS."""
    return [min(first_s * 2**n, max_s) for n in range(ATTEMPTS - 1)]


def free_space(folder: Path) -> int:
    return shutil.disk_usage(folder).free


def gigabytes(count: int) -> str:
    """Decimal GB with one decimal (REQ-003 open point 25)."""
    return f"{count / 1e9:.1f} GB"


class DownloadFailed(Exception):
    """A file that could not be downloaded; `retry` when the line failed."""

    def __init__(self, message: str, *, retry: bool = False) -> None:
        super().__init__(message)
        self.retry = retry


@dataclass(slots=True)
class _Progress:
    """An entry's progress as events report it: the rate over the last 5 s, and the ETA."""

    entry: Entry
    samples: list[tuple[float, int]] = field(default_factory=list)

    def rate(self, received: int) -> tuple[float, float | None]:
        now = time.monotonic()
        self.samples = [s for s in self.samples if now - s[0] <= 5.0] + [(now, received)]
        first_t, first_b = self.samples[0]
        per_s = (received - first_b) / (now - first_t) if now > first_t else 0.0
        left = self.entry.bytes - received
        return per_s, (left / per_s if per_s > 0 else None)


class Downloads:
    """The running downloads, one job per catalog entry."""

    def __init__(
        self,
        catalog: Catalog,
        models_dir: Path,
        endpoint: str,
        publish: Publish,
        *,
        wait_s: float = 2.0,
        wait_max_s: float = 60.0,
        free: FreeSpace = free_space,
        curl: str = "curl",
    ) -> None:
        self.catalog = catalog
        self.models_dir = models_dir
        self.endpoint = endpoint
        self._publish = publish
        self._waits = retry_waits(wait_s, wait_max_s)
        self._free = free
        self._curl = curl
        self._jobs: dict[str, asyncio.Task[None]] = {}

    def running(self, entry_id: str) -> bool:
        task = self._jobs.get(entry_id)
        return task is not None and not task.done()

    def entry(self, entry_id: str) -> Entry:
        found = self.catalog.get(entry_id)
        if found is None:
            raise ApiError(
                "not_found", f"No catalog entry `{entry_id}` (GET /api/models lists them).", "id"
            )
        return found

    # -- starting and stopping (event loop) -------------------------------------------

    def start(self, entry_id: str) -> bool:
        """Start (or resume) `entry_id`; False when it is already running (a no-op)."""
        entry = self.entry(entry_id)
        if self.running(entry_id):
            return False
        self.models_dir.mkdir(parents=True, exist_ok=True)
        needed = entry.bytes - on_disk(entry, self.models_dir).received
        free = self._free(self.models_dir)
        if needed > free:
            raise ApiError(
                "no_space", f"needs {gigabytes(needed)} more, only {gigabytes(free)} free", "id"
            )
        self._jobs[entry_id] = asyncio.get_running_loop().create_task(self._run(entry))
        return True

    async def cancel(self, entry_id: str) -> None:
        """Stop a running download; its `.part` files stay (LOC-DL-17..19)."""
        self.entry(entry_id)
        task = self._jobs.get(entry_id)
        if task is None or task.done():
            raise ApiError("not_found", f"`{entry_id}` is not downloading.", "id")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def delete_partial(self, entry_id: str) -> int:
        """Delete the `.part` of each file the entry names; the bytes freed (LOC-PART)."""
        entry = self.entry(entry_id)
        if self.running(entry_id):
            raise ApiError("downloading", f"`{entry_id}` is downloading: cancel it first.", "id")
        freed = 0
        for file in entry.files:
            part = self._path(file, PART)
            with contextlib.suppress(FileNotFoundError):
                if part.is_file() and not part.is_symlink():
                    size = part.stat().st_size
                    part.unlink()
                    freed += size
        return freed

    async def close(self) -> None:
        """Stop every download (the server is shutting down); `.part` files stay."""
        tasks = list(self._jobs.values())  # each leaves _jobs as it ends
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # -- one job ---------------------------------------------------------------------

    def _path(self, file: CatalogFile, suffix: str = "") -> Path:
        """A file of an entry in the models directory, never elsewhere (LOC-SEC-47)."""
        name = file.name
        if os.path.basename(name) != name or name in ("", ".", "..") or "\\" in name:
            raise ValueError(f"{file.name!r} is not a plain file name")
        return self.models_dir / (name + suffix)

    def _event(self, entry: Entry, file: CatalogFile, state: str, **fields: Any) -> None:
        received = on_disk(entry, self.models_dir).received
        data = {
            "id": entry.id,
            "file": file.name,
            "received": received,
            "total": entry.bytes,
            "bytes_per_s": 0.0,
            "eta_s": None,
            "attempt": 0,
            "retry_in_s": None,
            "state": state,
            "error": "",
        }
        self._publish("download", data | fields)

    async def _run(self, entry: Entry) -> None:
        file = entry.files[0]
        try:
            for file in entry.files:
                await self._file(entry, file)
        except asyncio.CancelledError:
            self._ended(entry, file, "cancelled")
            raise
        except DownloadFailed as exc:
            log.warning("download %s: %s", entry.id, exc)
            self._ended(entry, file, "error", error=str(exc))
            return
        except Exception as exc:  # the job's own fault: reported, never lost
            log.exception("download %s failed", entry.id)
            self._ended(entry, file, "error", error=f"{type(exc).__name__}: {exc}")
            return
        self._ended(entry, file, "done")

    def _ended(self, entry: Entry, file: CatalogFile, state: str, **fields: Any) -> None:
        """The last event of a job, once the job no longer counts as running: a client that
        lists the catalog on it reads the entry's new status, never `downloading`."""
        self._jobs.pop(entry.id, None)
        self._event(entry, file, state, **fields)

    async def _file(self, entry: Entry, file: CatalogFile) -> None:
        target, part = self._path(file), self._path(file, PART)
        if target.is_file():
            return
        for attempt in range(1, ATTEMPTS + 1):
            try:
                await self._fetch(entry, file, part, attempt)
                break
            except DownloadFailed as exc:
                if not exc.retry or attempt == ATTEMPTS:
                    raise
                wait = self._waits[attempt - 1]
                self._event(
                    entry, file, "running", attempt=attempt, error=str(exc), retry_in_s=wait
                )
                await asyncio.sleep(wait)
        await asyncio.to_thread(self._finish, file, part, target)

    def _finish(self, file: CatalogFile, part: Path, target: Path) -> None:
        """Check the whole `.part` (its SHA-256 when known) and rename it into place."""
        if file.sha256 is not None:
            digest = hashlib.sha256()
            with part.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            if digest.hexdigest() != file.sha256:
                aside = self._path(file, BAD)
                os.replace(part, aside)
                raise DownloadFailed(
                    f"{file.name}: SHA-256 {digest.hexdigest()} is not the catalog's "
                    f"{file.sha256}; the file is kept aside as {aside.name}"
                )
        os.replace(part, target)

    async def _fetch(self, entry: Entry, file: CatalogFile, part: Path, attempt: int) -> None:
        """One curl run into `part`, resuming it; DownloadFailed unless it ends whole."""
        have = part.stat().st_size if part.is_file() else 0
        if have > file.bytes:  # longer than the file: not a piece of it
            part.unlink()
            have = 0
        if have == file.bytes:
            return
        url = entry.url(self.endpoint, file)
        argv = [
            *curl.argv(self._curl, self.endpoint),
            "--fail",
            "--continue-at",
            "-",
            "--output",
            str(part),
            url,
        ]
        prefix, before_exec = _tied_to_server()
        process = await asyncio.create_subprocess_exec(
            *prefix,
            *argv,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=before_exec,
        )
        progress = _Progress(entry)
        watcher = asyncio.create_task(self._watch(entry, file, progress, attempt))
        try:
            _, stderr = await process.communicate()
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise
        finally:
            watcher.cancel()
        code = process.returncode
        message = stderr.decode("utf-8", "replace").strip().splitlines()
        said = message[-1] if message else f"curl exit {code}"
        if code != 0:
            raise DownloadFailed(f"{file.name}: {said}", retry=code in RETRYABLE)
        size = part.stat().st_size if part.is_file() else 0
        if size != file.bytes:  # the server ended early: the line, not the request
            raise DownloadFailed(f"{file.name}: got {size} of {file.bytes} bytes", retry=True)

    async def _watch(
        self, entry: Entry, file: CatalogFile, progress: _Progress, attempt: int
    ) -> None:
        """`running` events while curl writes, at most four a second."""
        while True:
            received = on_disk(entry, self.models_dir).received
            per_s, eta = progress.rate(received)
            self._event(
                entry,
                file,
                "running",
                received=received,
                bytes_per_s=per_s,
                eta_s=eta,
                attempt=attempt,
            )
            await asyncio.sleep(EVENT_EVERY_S)

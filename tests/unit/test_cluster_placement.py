"""The cluster's placement, without Ray running (issue 49 items 1, 2 and 4): a request's
affinity read from its body, the router's rule, the route table, and the embedded server
never loading Ray."""

from __future__ import annotations

import importlib
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from miserver.cluster import affinity as aff
from miserver.cluster import routes
from miserver.cluster.placement import SLACK, Candidate, ranked
from miserver.cluster.wire import kept_headers

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "spec" / "openapi"
SYSTEM = {"role": "system", "content": "You are terse."}
FIRST = [SYSTEM, {"role": "user", "content": "Name a fruit."}]
SECOND = [*FIRST, {"role": "assistant", "content": "Apple."}, {"role": "user", "content": "More"}]


def chat(messages: list[dict[str, str]], **extra: object) -> dict[str, object]:
    return {"model": "m", "messages": messages, **extra}


def test_a_second_turn_shares_its_first_turns_hashes() -> None:
    """Item 4: the prefix is chained per message, so a next turn repeats the first's."""
    one, two = aff.affinity(chat(FIRST)), aff.affinity(chat(SECOND))
    assert len(one.prefix) == 2 and len(two.prefix) == 4
    assert two.prefix[:2] == one.prefix
    other = aff.affinity(chat([SYSTEM, {"role": "user", "content": "Name a tree."}]))
    assert other.prefix[0] == one.prefix[0] and other.prefix[1] != one.prefix[1]


def test_what_comes_before_the_messages_is_part_of_every_hash() -> None:
    """Another model or another tool list renders another prompt: no piece is shared."""
    plain = aff.affinity(chat(FIRST))
    assert not set(plain.prefix) & set(aff.affinity({**chat(FIRST), "model": "n"}).prefix)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert not set(plain.prefix) & set(aff.affinity(chat(FIRST, tools=tools)).prefix)


def test_text_prompts_are_read_in_blocks_and_ids_in_runs() -> None:
    text = "x" * (aff.BLOCK_CHARS * 3 + 1)
    assert len(aff.affinity({"model": "m", "prompt": text}).prefix) == 4
    longer = aff.affinity({"model": "m", "prompt": text + "y" * aff.BLOCK_CHARS})
    assert longer.prefix[:3] == aff.affinity({"model": "m", "prompt": text}).prefix[:3]
    ids = list(range(aff.BLOCK_IDS * 2))
    assert len(aff.affinity({"model": "m", "prompt": ids}).prefix) == 2
    assert len(aff.affinity({"model": "m", "input": "hello"}).prefix) == 1  # Responses
    huge = {"model": "m", "prompt": "z" * aff.BLOCK_CHARS * (aff.MAX_PIECES + 5)}
    assert len(aff.affinity(huge).prefix) == aff.MAX_PIECES


def test_the_steering_set_is_hashed_from_the_bodys_own_fields() -> None:
    assert aff.affinity(chat(FIRST)).steering == ""
    asked = {"sae_id": "s", "features": [{"index": 1, "strength": 2.0}]}
    one = aff.affinity(chat(FIRST, steering=asked)).steering
    assert one and one == aff.affinity(chat(SECOND, steering=asked)).steering
    assert one != aff.affinity(chat(FIRST, profile="calm")).steering
    assert aff.affinity(None) == aff.NONE and aff.affinity([1, 2]) == aff.NONE


def test_the_longest_prefix_wins_then_the_steering_set_then_load() -> None:
    """Item 4: prefix first, same steering set next, the least busy last."""
    held = [Candidate("a", 1, held=1), Candidate("b", 2, held=3), Candidate("c", 0)]
    assert ranked(held) == [["b"], ["c", "a"]]
    steered = [Candidate("a", 0), Candidate("b", 1, same_steering=True)]
    assert ranked(steered)[0] == ["b"]
    both = [Candidate("a", 0, held=2), Candidate("b", 0, held=2, same_steering=True)]
    assert ranked(both)[0] == ["b"]


def test_affinity_never_piles_a_queue_onto_one_replica() -> None:
    """A replica more than SLACK requests busier than the least busy is passed over."""
    busy = [Candidate("a", SLACK + 1, held=5), Candidate("b", 0)]
    assert ranked(busy)[0][0] == "b"
    within = [Candidate("a", SLACK, held=5), Candidate("b", 0)]
    assert ranked(within)[0] == ["a"]


def test_without_affinity_two_choices_the_less_busy_first() -> None:
    rng = random.Random(7)
    replicas = [Candidate(name, load) for name, load in zip("abcd", (3, 1, 2, 0), strict=True)]
    for _ in range(50):
        [pair] = ranked(replicas, rng)
        assert len(pair) == 2
        loads = [next(c.load for c in replicas if c.replica == n) for n in pair]
        assert loads == sorted(loads)
    assert ranked([]) == []


def _operations() -> dict[str, tuple[str, str]]:
    found = {}
    for name in ("api.yaml", "v1.yaml"):
        document = yaml.safe_load((SPEC / name).read_text())
        base = "/api" if name == "api.yaml" else "/v1"
        for path, operations in document["paths"].items():
            for method, operation in operations.items():
                if isinstance(operation, dict) and "operationId" in operation:
                    found[operation["operationId"]] = (method.upper(), base + path)
    return found


# operations that change something without being the operator's state, each answered
# by the replica it lands on: a request's own work, downloads, cancels, searches
ENGINE_CHANGES = frozenset(
    {
        "start_download",
        "cancel_download",
        "delete_partial",
        "hf_search",
        "hf_models",
        "hf_inspect",
        "cancel",
        "detokenize",
        "decide",
        "score_probes",
    }
)


def test_every_change_of_operator_state_goes_through_the_control() -> None:
    """Item 3: every /api operation that is not a read either moves the epoch (the
    control runs it) or is named here as a replica's own; files and batches are the
    control's. A new route must be placed on purpose."""
    operations = _operations()
    assert operations.keys() >= routes.OPERATOR and operations.keys() >= routes.BATCHES
    for name, (method, path) in operations.items():
        where = routes.target(f"miserver.handlers.x.{name}")
        if name in routes.BATCHES:
            assert where is routes.Target.BATCHES and path.startswith("/v1/"), name
        elif name == "events":
            assert where is routes.Target.EVENTS
        elif name in routes.EVERY:  # cancel changes each replica; metrics reads each
            assert where is routes.Target.EVERY, name
            assert name in ENGINE_CHANGES or method == "GET", name
        elif path.startswith("/api/") and method != "GET":
            assert (where is routes.Target.OPERATOR) != (name in ENGINE_CHANGES), name
        else:
            assert where is routes.Target.ENGINE, name
    assert routes.SESSION <= routes.OPERATOR


@pytest.mark.parametrize("module", ["miserver.app", "miserver.cli"])
def test_the_embedded_server_never_loads_ray(module: str) -> None:
    """Item 1: `miserver serve` stays the default and never imports Ray."""
    code = f"import sys, {module}; sys.exit('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_the_serve_config_builds_the_application() -> None:
    """Item 2: deploy/serve.yaml (what `serve run` and a KubeRay RayService take) is a valid
    Serve config, and its import path builds the application with its args, Ray not
    running."""
    from ray.serve.schema import ServeDeploySchema

    config = ServeDeploySchema.model_validate(
        yaml.safe_load((ROOT / "deploy/serve.yaml").read_text())
    )
    [application] = config.applications
    assert application.import_path == "miserver.cluster:app"
    module, _, name = application.import_path.partition(":")
    built = getattr(importlib.import_module(module), name)(application.args)
    assert type(built).__name__ == "Application"
    serve_args = application.args["serve_args"]
    host = serve_args[serve_args.index("--host") + 1]
    assert config.http_options.host == host  # the ingress checks the Host it is reached by


def test_equals_share_the_first_rank_in_random_order() -> None:
    """Replicas that all hold a shared system prompt are all first, least busy first, and
    no one of them is always first among equals (no hot spot)."""
    rng = random.Random(3)
    equals = [Candidate(name, 0, held=1, same_steering=True) for name in "abcd"]
    firsts = {ranked(equals, rng)[0][0] for _ in range(40)}
    assert firsts == set("abcd")
    loaded = [Candidate("a", 1, held=1), Candidate("b", 0, held=1), Candidate("c", 0)]
    assert ranked(loaded, rng) == [["b", "a"], ["c"]]


def test_a_replica_sees_no_browser_metadata_the_ingress_already_judged() -> None:
    """Item 2: the ingress checked Host, Origin and Sec-Fetch-Site against its own address
    and `--allow-origin`; a replica, reached from loopback, must not judge them again (an
    allowed cross-site origin would be refused there). Credentials and content go on."""
    sent = [
        (b"host", b"example.org:8000"),
        (b"origin", b"https://app.example.org"),
        (b"sec-fetch-site", b"cross-site"),
        (b"sec-fetch-mode", b"cors"),
        (b"cookie", b"a=b"),
        (b"content-length", b"12"),
        (b"authorization", b"Bearer k"),
        (b"content-type", b"application/json"),
        (b"x-request-id", b"r1"),
    ]
    assert kept_headers(sent) == (
        (b"authorization", b"Bearer k"),
        (b"content-type", b"application/json"),
        (b"x-request-id", b"r1"),
    )

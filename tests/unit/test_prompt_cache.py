"""The prompt cache's store (engines/prompt_cache.py; issue 43): the longest shared prefix
wins, keys never mix, covered entries are not kept twice, the budget evicts the least
recently used, and its counts say what it served."""

from __future__ import annotations

from miserver.engines.prompt_cache import MIN_TOKENS, PromptCache, prompt_cache

UNSTEERED = ()
STEERED = (("sae", ((3, 2.0),)),)


def ids(first: int, n: int) -> list[int]:
    return list(range(first, first + n))


def test_the_longest_shared_prefix_wins_and_the_last_id_is_always_run() -> None:
    cache = PromptCache(budget=10_000)
    cache.put(ids(0, 40), UNSTEERED, "forty", 100)
    cache.put([*ids(0, 20), *ids(500, 30)], UNSTEERED, "twenty then other", 100)
    found = cache.best(ids(0, 60), UNSTEERED)
    assert found is not None and (found.entry.state, found.shared) == ("forty", 40)
    found = cache.best([*ids(0, 20), *ids(500, 10)], UNSTEERED)
    assert found is not None and (found.entry.state, found.shared) == ("twenty then other", 29)
    exact = cache.best(ids(0, 40), UNSTEERED)  # the whole prompt cached: its last id still runs
    assert exact is not None and exact.shared == 39


def test_a_prefix_no_longer_than_what_is_held_is_not_a_hit() -> None:
    cache = PromptCache(budget=10_000)
    cache.put(ids(0, 40), UNSTEERED, "forty", 100)
    assert cache.best(ids(0, 60), UNSTEERED, at_least=40) is None
    assert cache.best(ids(7, 60), UNSTEERED) is None  # nothing shared
    assert cache.counts.hits == 0 and cache.counts.misses == 2


def test_steered_and_unsteered_states_never_mix() -> None:
    cache = PromptCache(budget=10_000)
    cache.put(ids(0, 40), STEERED, "steered", 100)
    assert cache.best(ids(0, 60), UNSTEERED) is None
    cache.put(ids(0, 40), UNSTEERED, "plain", 100)  # not covered: another key
    assert len(cache) == 2
    found = cache.best(ids(0, 60), UNSTEERED)
    assert found is not None and found.entry.state == "plain"
    found = cache.best(ids(0, 60), STEERED)
    assert found is not None and found.entry.state == "steered"


def test_an_entry_covered_by_another_is_not_kept_twice() -> None:
    cache = PromptCache(budget=10_000)
    cache.put(ids(0, 40), UNSTEERED, "short", 100)
    cache.put(ids(0, 80), UNSTEERED, "long", 200)  # covers the first, which goes
    assert len(cache) == 1 and cache.held_bytes == 200
    assert not cache.worth(ids(0, 60), UNSTEERED)  # the long one holds it all
    cache.put(ids(0, 60), UNSTEERED, "middle", 150)
    assert len(cache) == 1
    assert not cache.worth([*ids(0, MIN_TOKENS - 2), 999], UNSTEERED)  # too short to keep


def test_the_budget_evicts_the_least_recently_used() -> None:
    cache = PromptCache(budget=300)
    for k in range(3):
        cache.put(ids(1000 * k, 40), UNSTEERED, f"p{k}", 100)
    assert cache.best(ids(0, 50), UNSTEERED) is not None  # p0 used: p1 is now the oldest
    cache.put(ids(9000, 40), UNSTEERED, "p3", 100)
    assert cache.held_bytes == 300 and cache.counts.evicted == 1
    assert cache.best(ids(1000, 50), UNSTEERED) is None  # p1 went
    assert cache.best(ids(0, 50), UNSTEERED) is not None
    cache.put(ids(20000, 40), UNSTEERED, "too big", 301)  # larger than the budget: not kept
    assert cache.best(ids(20000, 50), UNSTEERED) is None


def test_its_counts_say_what_it_served() -> None:
    cache = PromptCache(budget=1000)
    cache.put(ids(0, 40), UNSTEERED, "s", 100)
    cache.best(ids(0, 50), UNSTEERED, at_least=10)
    cache.best(ids(5, 50), UNSTEERED)
    assert cache.stats() == {
        "entries": 1,
        "bytes": 100,
        "budget_bytes": 1000,
        "hits": 1,
        "misses": 1,
        "tokens_restored": 30,
        "evicted": 0,
    }


def test_cache_ram_zero_keeps_none_and_auto_takes_the_default() -> None:
    assert prompt_cache(0) is None
    made = prompt_cache(64)
    assert made is not None and made.budget == 64 << 20
    auto = prompt_cache(-1)
    assert auto is not None and auto.budget == 8192 << 20


def test_among_many_entries_sharing_a_head_the_right_one_is_found() -> None:
    """Issue 43 (a cache that holds thousands of chats): entries are found through their
    prefixes at block boundaries. Among 2,000 prompts sharing a 32-id head, a prompt
    continuing one of them restores that one, whichever it is; a prompt sharing less than
    one block (16 ids) restores nothing; evicted entries leave the index."""
    cache = PromptCache(budget=2000 * 100)
    head = ids(0, 32)
    for k in range(2000):
        cache.put([*head, *ids(10_000 + 40 * k, 20)], UNSTEERED, f"p{k}", 100)
    for k in (0, 777, 1999):
        found = cache.best([*head, *ids(10_000 + 40 * k, 20), 1, 2], UNSTEERED)
        assert found is not None and (found.entry.state, found.shared) == (f"p{k}", 52)
    assert cache.best([*ids(0, 15), *ids(90_000, 20)], UNSTEERED) is None
    cache.put(ids(50_000, 40), UNSTEERED, "new", 100)  # evicts the least recently used
    assert len(cache) == 2000
    gone = cache.best([*head, *ids(10_000 + 40 * 1, 20), 1], UNSTEERED)  # p1 went: the head
    assert gone is not None and gone.shared == 32 and gone.entry.state != "p1"
    cache.clear()
    assert cache.best([*head, *ids(10_000, 20), 1], UNSTEERED) is None

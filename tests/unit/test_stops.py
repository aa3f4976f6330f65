"""Stop sequences over a stream of text chunks."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from miserver.serving.stops import StopMatcher, first_stop

ALPHABET = "ab c\n"
TEXT = st.text(alphabet=ALPHABET, max_size=40)
STOPS = st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=4), min_size=1, max_size=4)


def run(stops: list[str], chunks: list[str]) -> tuple[str, bool]:
    """Everything the matcher releases for `chunks`, and whether it stopped."""
    matcher = StopMatcher(stops)
    out: list[str] = []
    for chunk in chunks:
        text, matched = matcher.push(chunk)
        out.append(text)
        if matched:
            return "".join(out), True
    return "".join(out) + matcher.flush(), False


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


def expected(text: str, stops: list[str]) -> str:
    """The oracle: cut where the first stop completes (the longest if tied)."""
    for end in range(len(text) + 1):
        ending = [stop for stop in stops if text[:end].endswith(stop)]
        if ending:
            return text[: end - max(map(len, ending))]
    return text


def nested(stops: list[str]) -> bool:
    return any(a != b and a in b for a in stops for b in stops)


@given(TEXT, STOPS, st.lists(st.integers(min_value=0, max_value=40), max_size=12))
def test_any_chunking_cuts_at_the_first_stop(text: str, stops: list[str], cuts: list[int]) -> None:
    """OAI-CHAT-20, OAI-CHAT-21: the output is the text before the stop, stop excluded."""
    released, matched = run(stops, split(text, cuts))
    assert released == expected(text, stops)
    assert matched == any(stop in text for stop in stops)


@given(TEXT, STOPS, st.lists(st.integers(min_value=0, max_value=40), max_size=12))
def test_without_nesting_it_is_the_first_occurrence(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    """OAI-CHAT-20: with no stop inside another, cut at the earliest occurrence."""
    if nested(stops):
        return
    found = [i for i in (text.find(stop) for stop in stops) if i >= 0]
    cut = min(found) if found else len(text)
    assert run(stops, split(text, cuts))[0] == text[:cut]


@given(TEXT, STOPS)
def test_char_by_char_equals_whole_text(text: str, stops: list[str]) -> None:
    """OAI-CHAT-21: streaming one character at a time equals one push."""
    assert run(stops, list(text)) == run(stops, [text])


def test_holds_back_a_possible_stop_start() -> None:
    """OAI-CHAT-21: text that may begin a stop is held, then released or dropped."""
    matcher = StopMatcher(["END"])
    assert matcher.push("hello E") == ("hello ", False)
    assert matcher.push("N") == ("", False)
    assert matcher.push("D and more") == ("", True)
    assert matcher.stopped
    assert matcher.push("later") == ("", True)
    assert matcher.flush() == ""


def test_releases_a_false_start() -> None:
    """OAI-CHAT-21: a held prefix that does not become a stop is released."""
    matcher = StopMatcher(["END"])
    assert matcher.push("EN") == ("", False)
    assert matcher.push("d") == ("ENd", False)
    assert matcher.push("E") == ("", False)
    assert matcher.flush() == "E"


def test_no_stops_release_everything() -> None:
    """OAI-CHAT-19: no stop (or only empty strings) never holds text back."""
    for stops in ([], [""]):
        matcher = StopMatcher(stops)
        assert matcher.push("abc") == ("abc", False)
        assert matcher.flush() == ""


def test_inner_stop_completing_first_wins() -> None:
    """OAI-STREAM-07: a stop that completes first ends the stream at once."""
    assert run(["abcd", "bc"], ["abc", "d"]) == ("a", True)
    assert first_stop("xabc", ["bc", "abc"]) == 1
    assert first_stop("xyz", ["q"]) is None


@given(TEXT, STOPS, st.lists(st.integers(min_value=0, max_value=40), max_size=12))
def test_the_matcher_says_which_stop_ended_the_text(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    """Contract 0.22.0 (vLLM's `stop_reason`, Anthropic's `stop_sequence`): the stop that
    completed first (the longest of those completing together), right after the cut."""
    matcher = StopMatcher(stops)
    released = ""
    for chunk in split(text, cuts):
        released += matcher.push(chunk)[0]
        if matcher.stopped:
            break
    if matcher.matched is None:
        assert not any(stop in text for stop in stops)
        return
    assert matcher.matched in stops
    assert text[len(released) :].startswith(matcher.matched)
    assert len(released) == len(expected(text, stops))

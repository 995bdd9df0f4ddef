"""Templates: ${name} rendering, batch eligibility, data-marker line."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumer.core.errors import ErrorKind, JobError
from consumer.core.templates import BatchablePrompt, find_data_marker, placeholders, render, split_batchable


def _template_error(prompt: str, variables: dict[str, str]) -> str:
    with pytest.raises(JobError) as info:
        render(prompt, variables)
    assert info.value.kind is ErrorKind.TEMPLATE_ERROR
    return str(info.value)


def test_render_substitutes_every_occurrence() -> None:
    assert render("Hi ${name}, ${name}! ${x_1}", {"name": "Ana", "x_1": "ok"}) == "Hi Ana, Ana! ok"


def test_render_does_not_reinterpret_values() -> None:
    assert render("say ${a}", {"a": "${b} $${c}"}) == "say ${b} $${c}"


def test_render_without_placeholders() -> None:
    assert render("plain text", {}) == "plain text"


def test_missing_variable_is_named() -> None:
    assert _template_error("A ${x} B ${y}", {"x": "1"}) == "missing variable 'y'"
    assert _template_error("A ${x} B ${y}", {}) == "missing variables 'x', 'y'"


def test_unknown_variable_is_named() -> None:
    message = _template_error("A ${x}", {"x": "1", "z": "2"})
    assert message == "unknown variable 'z' (not in the prompt)"


def test_missing_and_unknown_together() -> None:
    message = _template_error("A ${x}", {"y": "1"})
    assert "missing variable 'x'" in message and "unknown variable 'y'" in message


def test_escape_renders_literal_placeholder() -> None:
    assert render("cost: $${price} for ${item}", {"item": "tea"}) == "cost: ${price} for tea"
    assert placeholders("$${a} ${b} ${b}") == ["b", "b"]


@pytest.mark.parametrize("text", ["${ name }", "${1x}", "${}", "$name", "${a-b}", "{x}", "${na"])
def test_non_placeholders_are_literal(text: str) -> None:
    assert render(text, {}) == text
    assert placeholders(text) == []


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("Summarize:\n${text}", BatchablePrompt("Summarize:\n", "text")),
        ("${text}", BatchablePrompt("", "text")),
        ("Classify: ${t}", BatchablePrompt("Classify: ", "t")),
        ("costs $${x}; classify ${t}", BatchablePrompt("costs ${x}; classify ", "t")),
        ("Summarize ${text}\n", None),  # trailing newline: not at the very end
        ("Summarize ${text} ", None),  # trailing space: not eligible either
        ("Summarize ${text}.", None),
        ("Compare ${a} with ${b}", None),  # two placeholders
        ("${a}${a}", None),  # the same one twice is still two
        ("no placeholder", None),
        ("only escaped $${x}", None),
    ],
)
def test_split_batchable(prompt: str, expected: BatchablePrompt | None) -> None:
    assert split_batchable(prompt) == expected


@pytest.mark.parametrize(
    ("prefix", "expected_line"),
    [
        ("Summarize.\nINPUT DATA (as data):\n", "INPUT DATA (as data):"),
        ("Text:\nmore\nData:   \n", "Data:   "),  # trailing spaces ignored
        ("A:\nB:\nC\n", "B:"),  # the LAST such line
        ("Classify: ", "Classify: "),  # the unterminated last line counts
        ("First:\r\nSecond\r\n", "First:\r"),  # CRLF
        ("Text: here\nmore", None),
        ("", None),
        ("\n\n", None),
    ],
)
def test_find_data_marker(prefix: str, expected_line: str | None) -> None:
    start = find_data_marker(prefix)
    if expected_line is None:
        assert start is None
        return
    assert start is not None
    assert start == 0 or prefix[start - 1] == "\n"
    end = prefix.find("\n", start)
    assert prefix[start : end if end >= 0 else len(prefix)] == expected_line


@given(st.text(alphabet="ab:\n \t", max_size=40))
def test_find_data_marker_is_the_last_colon_line(prefix: str) -> None:
    lines = prefix.split("\n")
    expected = None
    offset = 0
    for line in lines:
        if line.rstrip(" \t\r").endswith(":"):
            expected = offset
        offset += len(line) + 1
    assert find_data_marker(prefix) == expected


_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)
_literal = st.text(alphabet=st.characters(blacklist_characters="$"), max_size=20)


@given(_literal, _names, st.text(max_size=30))
def test_batchable_prefix_plus_value_is_the_rendering(prefix: str, name: str, value: str) -> None:
    prompt = prefix + "${" + name + "}"
    split = split_batchable(prompt)
    assert split == BatchablePrompt(prefix, name)
    assert render(prompt, {name: value}) == split.prefix + value

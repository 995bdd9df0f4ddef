"""The tier file's YAML is read as written (`consumer.yaml12`): `on:` is the key `on`, `yes`
and `off` are the strings written, only `true`/`false` are booleans; and what `dump_yaml`
writes, `load_yaml` reads back equal."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumer.core.errors import ConfigError
from consumer.settings import load_tier_file
from consumer.yaml12 import YAMLError, dump_yaml, load_yaml


def _tier_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tiers.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _tiers(tmp_path: Path, **tiers: str) -> Path:
    """A tier file of openai_compat tiers (name -> the tier's own YAML lines, written as given)."""
    text = "tiers:\n"
    for port, (name, lines) in enumerate(tiers.items(), 8080):
        text += f"  {name}:\n    provider: openai_compat\n    base_url: http://127.0.0.1:{port}/v1\n"
        text += textwrap.indent(textwrap.dedent(lines).strip("\n") + "\n", "    ")
    return _tier_file(tmp_path, text)


def test_on_is_a_key_of_the_fallback(tmp_path: Path) -> None:
    path = _tiers(
        tmp_path,
        main="model: m\nfallback: {tier: backup, after_s: 30, on: [outage, quota_exhausted]}",
        backup="""
            model: m
            fallback:
              tier: last
              on: [quota_exhausted]
        """,
        last="model: m",
    )
    tiers = load_tier_file(path).tiers
    assert tiers["main"].fallback is not None and tiers["main"].fallback.on == ("outage", "quota_exhausted")
    assert tiers["backup"].fallback is not None and tiers["backup"].fallback.on == ("quota_exhausted",)


def test_yes_no_on_off_stay_the_strings_written_and_true_false_are_booleans(tmp_path: Path) -> None:
    path = _tiers(
        tmp_path,
        yes="""
            model: no
            api_key_env: ON
            prompt_cache: off
            batching: {structured: off}
            options: {stop: [y, n, Yes, NO]}
        """,
        small="""
            model: m
            dedupe: True
            batching: {enabled: TRUE}
            offline: {enabled: false}
            options: {flags: [true, True, TRUE, false, False, FALSE]}
        """,
    )
    tiers = load_tier_file(path).tiers
    strings = tiers["yes"]
    written = (strings.model, strings.api_key_env, strings.prompt_cache, strings.batching.structured)
    assert written == ("no", "ON", "off", "off")
    assert strings.options == {"stop": ["y", "n", "Yes", "NO"]}
    flags = tiers["small"]
    assert flags.dedupe is True and flags.batching.enabled is True and flags.offline.enabled is False
    assert flags.options["flags"] == [True, True, True, False, False, False]


def test_a_boolean_key_reads_the_words_the_model_takes(tmp_path: Path) -> None:
    # a `yes` arrives as the string "yes"; the settings model reads such a word as a boolean
    # where a boolean belongs, and refuses one that is not, naming the key
    path = _tier_file(
        tmp_path,
        "tiers:\n  small:\n    provider: openai\n    model: m\n    batching: {enabled: yes}\n",
    )
    assert load_tier_file(path).tiers["small"].batching.enabled is True
    path.write_text("tiers:\n  small:\n    provider: openai\n    model: m\n    dedupe: maybe\n")
    with pytest.raises(ConfigError) as err:
        load_tier_file(path)
    assert err.value.key == "tiers.small.dedupe"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("~", None),
        ("null", None),
        ("", None),
        ("010", 10),
        ("-3", -3),
        ("+4", 4),
        ("0o17", 15),
        ("0x1F", 31),
        ("1e3", 1000.0),
        ("1.5", 1.5),
        (".5", 0.5),
        ("-.inf", -math.inf),
        (".Inf", math.inf),
        ("1:30", "1:30"),
        ("2026-12-01", "2026-12-01"),
        ("1_000", "1_000"),
        ("0b101", "0b101"),
        ("y", "y"),
        ("off", "off"),
        ("'true'", "true"),
    ],
)
def test_plain_scalars_by_the_core_schema(text: str, value: Any) -> None:
    assert load_yaml(f"v: {text}\n") == {"v": value}


def test_nan_is_a_float() -> None:
    assert math.isnan(load_yaml("v: .nan\n")["v"])


def test_merge_keys_are_kept() -> None:
    assert load_yaml("base: &b {a: 1, b: 2}\nm: {<<: *b, b: 3}\n")["m"] == {"a": 1, "b": 3}


def test_an_explicit_tag_that_does_not_fit_is_a_yaml_error() -> None:
    with pytest.raises(YAMLError, match="is not an integer"):
        load_yaml("v: !!int abc\n")
    with pytest.raises(YAMLError, match="is not a number"):
        load_yaml("v: !!float abc\n")


def test_a_yaml_error_is_one_line_naming_the_file_line_and_column(tmp_path: Path) -> None:
    path = _tier_file(tmp_path, "tiers:\n  small:\n    provider: openai\n   model: x\n")
    with pytest.raises(ConfigError, match="not valid YAML") as err:
        load_tier_file(path)
    assert err.value.key == f"{path}:4:4"
    assert err.value.reason.startswith("not valid YAML: expected <block end>")
    assert "\n" not in str(err.value) and "<unicode string>" not in str(err.value)


def test_dump_quotes_what_the_core_schema_reads_otherwise_and_keeps_order() -> None:
    text = dump_yaml({"lanes": {"z": {"topic": "1e3"}, "a": {"topic": "on"}}, "n": "0o17"})
    assert text.index("z:") < text.index("a:")
    assert "'1e3'" in text and "'0o17'" in text and "topic: on" in text


_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
_DATA = st.recursive(
    _SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=12,
)


@given(_DATA)
def test_what_dump_writes_load_reads_back_equal(data: Any) -> None:
    assert load_yaml(dump_yaml(data)) == data

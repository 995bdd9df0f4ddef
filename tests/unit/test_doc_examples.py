"""Every tier-file example a reader may copy is checked by `promptbus check-config`, as a user
would run it: each fenced ```yaml block of README.md, docs/ and deploy/'s READMEs, each tier
file under examples/, and the tier file in deploy/k8s's ConfigMap, written to a file and
passed to the CLI's `main` (the same loader and checks as `promptbus check-config --config
FILE`).

A block that is not a whole tier file is completed the same way every time (`complete`):
  - a block with `tiers:` is checked as written;
  - a block of top-level sections only (`lanes:`, `tenants:`: `SECTIONS`) gets one minimal
    tier appended (`MINIMAL_TIER`);
  - a block of one tier's keys (no `tiers:`, no section) is indented under `tiers: example:`,
    with `provider`, `base_url` and `model` from `MINIMAL_TIER` where it names none.
The block's own text is kept verbatim in each case, so it is read exactly as written. The
environment variables the example names in `api_key_env` are set (to a placeholder) for the
check, as a user running it would have them.

A block meant to be refused carries a comment line `# check-config refuses this: TEXT`; the
test asserts exit code 2 and TEXT in the error. Every other block must be accepted (exit 0).
A fence without a language whose text starts like a tier file fails: label it ```yaml.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from consumer.cli import main
from consumer.settings import TierFile
from consumer.testing.paths import REPO_ROOT
from consumer.yaml12 import load_yaml

ROOT = REPO_ROOT
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "deploy").rglob("*.md"))]
TIER_FILES = sorted((ROOT / "examples").glob("*.yaml"))
K8S = ROOT / "deploy" / "k8s" / "promptbus.yaml"
#: the tier a fragment is completed with (its keys fill what a one-tier fragment leaves out)
MINIMAL_TIER = {"provider": "openai_compat", "base_url": "http://127.0.0.1:8080/v1", "model": "example-model"}
#: the tier file's top-level sections beside `tiers`
SECTIONS = set(TierFile.model_fields) - {"tiers"}
REFUSED = re.compile(r"^\s*# check-config refuses this: (.+?)\s*$", re.M)
_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)
_TIER_FILE_START = re.compile(r"^(tiers|lanes):", re.M)


@dataclass(frozen=True)
class Example:
    """One tier-file example: where it is and its text as written."""

    where: str
    text: str


def yaml_blocks(page: Path) -> list[Example]:
    text = page.read_text(encoding="utf-8")
    rel = page.relative_to(ROOT).as_posix()
    return [
        Example(f"{rel}:{text[: m.start()].count(chr(10)) + 1}", m.group("body"))
        for m in _FENCE.finditer(text)
        if m.group("lang") == "yaml"
    ]


def config_map_tier_files(manifests: Path) -> list[Example]:
    """The `.yaml` entries of the manifests' ConfigMaps (Kubernetes reads the manifest itself)."""
    rel = manifests.relative_to(ROOT).as_posix()
    return [
        Example(f"{rel}:{doc['metadata']['name']}/{key}", text)
        for doc in yaml.safe_load_all(manifests.read_text(encoding="utf-8"))
        if doc and doc.get("kind") == "ConfigMap"
        for key, text in (doc.get("data") or {}).items()
        if key.endswith(".yaml")
    ]


EXAMPLES = (
    [block for page in PAGES for block in yaml_blocks(page)]
    + [Example(p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8")) for p in TIER_FILES]
    + config_map_tier_files(K8S)
)


def _indented(text: str, spaces: int) -> str:
    return "".join(" " * spaces + line if line.strip() else line for line in text.splitlines(True))


def complete(text: str) -> str:
    """The example as a whole tier file (module docstring): its text verbatim, plus only what
    a fragment lacks."""
    data = load_yaml(text)
    assert isinstance(data, dict), "a tier-file example is a mapping"
    if "tiers" in data:
        return text
    if set(data) <= SECTIONS:
        tier = ", ".join(f"{k}: {v}" for k, v in MINIMAL_TIER.items())
        return f"{text.rstrip()}\ntiers:\n  example: {{{tier}}}\n"
    missing = "".join(f"    {k}: {v}\n" for k, v in MINIMAL_TIER.items() if k not in data)
    return f"tiers:\n  example:\n{missing}{_indented(text, 4)}"


def _key_envs(data: Any) -> set[str]:
    """The variables the tier file's `api_key_env` keys name (its tiers' and their deployments')."""
    tiers = data.get("tiers") if isinstance(data, dict) else None
    if not isinstance(tiers, dict):
        return set()
    named = [t for t in tiers.values() if isinstance(t, dict)]
    named += [d for t in named for d in t.get("deployments") or () if isinstance(d, dict)]
    return {t["api_key_env"] for t in named if t.get("api_key_env")}


def check_config(
    text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    """`promptbus check-config --config FILE` on `text`: (exit code, stdout and stderr)."""
    path = tmp_path / "tiers.yaml"
    path.write_text(text, encoding="utf-8")
    for name in _key_envs(load_yaml(text)):
        monkeypatch.setenv(name, "placeholder-key")
    monkeypatch.delenv("PROMPTBUS_CONFIG", raising=False)
    code = main(["check-config", "--config", str(path)])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_the_pages_hold_examples() -> None:
    wheres = [e.where for e in EXAMPLES]
    assert any(w.startswith("docs/configuration.md") for w in wheres), wheres
    assert "examples/tiers.yaml" in wheres, wheres
    assert any(w.startswith("deploy/k8s/promptbus.yaml:promptbus-tiers/") for w in wheres), wheres


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.where)
def test_check_config_takes_the_example_or_refuses_it_as_marked(
    example: Example, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, output = check_config(complete(example.text), tmp_path, monkeypatch, capsys)
    refusal = REFUSED.search(example.text)
    if refusal is None:
        assert code == 0, f"{example.where}: check-config refused the example:\n{output}"
        assert "ok:" in output
    else:
        assert code == 2, f"{example.where}: marked as refused, but check-config exited {code}:\n{output}"
        assert refusal.group(1) in output, f"{example.where}: refused otherwise:\n{output}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_tier_file_example_hides_in_an_unlabelled_fence(page: Path) -> None:
    unlabelled = [
        m.group("body").splitlines()[0]
        for m in _FENCE.finditer(page.read_text(encoding="utf-8"))
        if not m.group("lang") and _TIER_FILE_START.match(m.group("body"))
    ]
    assert not unlabelled, f"{page.name}: label these ```yaml so they are checked: {unlabelled}"


# ---------------------------------------------------------------- the completion itself
def test_a_lanes_fragment_gets_one_minimal_tier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    whole = complete("lanes:\n  fast: {topic: t.fast}\n  slow: {topic: t.slow}\n")
    assert whole.startswith("lanes:\n  fast: {topic: t.fast}\n  slow: {topic: t.slow}\n")
    assert load_yaml(whole)["tiers"] == {"example": MINIMAL_TIER}
    assert check_config(whole, tmp_path, monkeypatch, capsys)[0] == 0


def test_a_tier_fragment_is_indented_under_one_tier_with_what_it_lacks() -> None:
    whole = complete("model: mine\nbatching:\n  enabled: true\n")
    tier = load_yaml(whole)["tiers"]["example"]
    assert tier == {
        "provider": "openai_compat",
        "base_url": "http://127.0.0.1:8080/v1",
        "model": "mine",
        "batching": {"enabled": True},
    }


def test_a_whole_tier_file_is_checked_as_written() -> None:
    text = "tiers:\n  a: {provider: openai, model: m}\n"
    assert complete(text) is text


def test_a_marked_refusal_must_be_the_refusal_check_config_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = "# check-config refuses this: tiers.a.model\ntiers:\n  a: {provider: openai, model: ''}\n"
    refusal = REFUSED.search(text)
    assert refusal is not None and refusal.group(1) == "tiers.a.model"
    code, output = check_config(complete(text), tmp_path, monkeypatch, capsys)
    assert code == 2 and "config error: tiers.a.model" in output

"""Keys that rotate while requests flow: a mounted secret replaced in place (`api_key_file`)
and a token command (`api_key_command`), against the simulator whose accepted key is switched
mid-run, as a provider revokes an old key. Every request must be answered: none fails."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from consumer.core.circuit import is_outage
from consumer.core.completion import ChatMessage, CompletionRequest
from consumer.core.errors import ConfigError, ConnectionFailed
from consumer.providers.factory import build_provider, check_tier, make_http_client
from consumer.providers.keys import CommandKey
from consumer.settings import TierConfig, parse_tier_file
from consumer.testing.simulator import SimulatorConfig, SimulatorServer, answer_for

OLD, NEW = "sk-old-4be1d0", "sk-new-93c7aa"
IN_FLIGHT = 8


def request(text: str) -> CompletionRequest:
    return CompletionRequest((ChatMessage("user", f"Answer this:\n{text}"),), "sim-model", {"max_tokens": 20})


def mount_secret(directory: Path, value: str) -> Path:
    """A Kubernetes-style secret volume: `key` -> `..data/key`, `..data` -> a timestamped
    directory; an update writes a new directory and swaps `..data` atomically."""
    stamp = directory / f"..{time.monotonic_ns()}"
    stamp.mkdir()
    (stamp / "key").write_text(value + "\n")
    tmp = directory / "..data_tmp"
    tmp.symlink_to(stamp.name)
    os.replace(tmp, directory / "..data")
    link = directory / "key"
    if not link.is_symlink():
        link.symlink_to("..data/key")
    return link


def token_command(directory: Path, *, expires_in_s: float | None = None) -> list[str]:
    """A command printing the token in `directory/token` (as JSON, with an expiry when
    given) and counting its runs in `directory/runs`; `directory/fail` makes it fail,
    `directory/hang` makes it hang."""
    script = f"""
import json, pathlib, sys, time
d = pathlib.Path({str(directory)!r})
runs = d / "runs"
runs.write_text(str(int(runs.read_text() or 0) + 1) if runs.exists() else "1")
if (d / "hang").exists():
    time.sleep(30)
if (d / "fail").exists():
    print("sk-leaked-on-stdout")
    sys.exit(3)
token = (d / "token").read_text().strip()
expires = {expires_in_s!r}
print(json.dumps({{"token": token, "expires_at": time.time() + expires}}) if expires else token)
"""
    return [sys.executable, "-c", script]


def runs(directory: Path) -> int:
    path = directory / "runs"
    return int(path.read_text()) if path.exists() else 0


def tier(base_url: str, **keys: Any) -> TierConfig:
    return TierConfig.model_validate(
        {"provider": "openai", "model": "sim-model", "base_url": base_url + "/v1", "timeout_s": 5, **keys}
    )


async def run_with_rotation(
    sim: SimulatorServer, config: TierConfig, rotate: Any, count: int = 240
) -> list[Any]:
    """`count` requests, IN_FLIGHT at a time; after a third of them, `rotate()` (the new key
    put where the source reads it) and the simulator switched to accept only the new key."""
    client = make_http_client(config, "t")
    provider = build_provider("t", config, client)
    texts = [f"job {i}" for i in range(count)]
    queue = list(enumerate(texts))
    results: list[Any] = [None] * count
    done = 0

    async def worker() -> None:
        nonlocal done
        while queue:
            i, text = queue.pop(0)
            try:
                results[i] = (await provider.complete(request(text))).text
            except Exception as exc:
                results[i] = exc
            done += 1
            if done == count // 3:
                rotate()
                sim.configure(api_key=NEW)

    try:
        await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    finally:
        await provider.aclose()
    assert [r for r in results if not isinstance(r, str)] == [], "no request failed"
    assert results == [answer_for(t) for t in texts]
    return results


async def test_a_mounted_secret_rotated_mid_run_fails_no_request(tmp_path: Path) -> None:
    path = mount_secret(tmp_path, OLD)
    sim = SimulatorServer(SimulatorConfig(api_key=OLD))
    async with sim as base_url:
        await run_with_rotation(
            sim, tier(base_url, api_key_file=str(path)), lambda: mount_secret(tmp_path, NEW)
        )
        stats = sim.sim.stats_.counters
        # after the switch only NEW is accepted: the later requests were sent with it
        final = await _one(tier(base_url, api_key_file=str(path)))
    assert final == answer_for("last")
    assert stats["requests"] >= 240


async def test_a_static_key_is_not_rotated_the_check_above_can_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PB_ROTATING_TEST_KEY", OLD)
    sim = SimulatorServer(SimulatorConfig(api_key=OLD))
    async with sim as base_url:
        with pytest.raises(AssertionError, match="no request failed"):
            await run_with_rotation(sim, tier(base_url, api_key_env="PB_ROTATING_TEST_KEY"), lambda: None)


async def test_a_token_command_is_run_at_start_and_once_on_a_401(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(OLD)
    sim = SimulatorServer(SimulatorConfig(api_key=OLD))
    async with sim as base_url:
        config = tier(base_url, api_key_command=token_command(tmp_path))
        await run_with_rotation(sim, config, lambda: (tmp_path / "token").write_text(NEW))
        assert sim.sim.stats_.counters["status_401"] >= 1, "the switch was met by requests with the old key"
    # start, then one run for all the 401s of the switch (concurrent ones wait for it)
    assert runs(tmp_path) == 2


async def test_a_token_is_renewed_before_it_expires(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(OLD)
    async with SimulatorServer(SimulatorConfig(api_key=OLD)) as base_url:
        config = tier(base_url, api_key_command=token_command(tmp_path, expires_in_s=0.5))
        client = make_http_client(config, "t")
        provider = build_provider("t", config, client)
        assert runs(tmp_path) == 1, "run at start"
        for i in range(3):
            await provider.complete(request(f"a{i}"))
        assert runs(tmp_path) == 1, "cached"
        await asyncio.sleep(0.5)  # past four fifths of its life
        await provider.complete(request("b"))
        await provider.aclose()
    assert runs(tmp_path) == 2


async def test_a_failing_or_hanging_command_holds_the_work_like_an_outage(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(OLD)
    (tmp_path / "fail").write_text("")
    async with SimulatorServer(SimulatorConfig(api_key=OLD)) as base_url:
        config = tier(base_url, api_key_command=token_command(tmp_path), api_key_command_timeout_s=1)
        client = make_http_client(config, "t")
        provider = build_provider("t", config, client)  # its run at start fails: logged, not raised
        with pytest.raises(ConnectionFailed) as failed:
            await provider.complete(request("x"))
        (tmp_path / "fail").unlink()
        (tmp_path / "hang").write_text("")
        with pytest.raises(ConnectionFailed) as hung:
            await provider.complete(request("x"))
        (tmp_path / "hang").unlink()
        assert (await provider.complete(request("back"))).text == answer_for("back"), "held work goes on"
        await provider.aclose()
    for info in (failed, hung):
        assert is_outage(info.value) and "tiers.t" in info.value.message and "\n" not in info.value.message
        assert "leaked" not in info.value.message and OLD not in info.value.message
    assert "status 3" in failed.value.message and "longer than 1 s" in hung.value.message


async def test_a_json_token_without_expiry_and_iso_expiry(tmp_path: Path) -> None:
    later = "2099-01-01T00:00:00Z"
    script = f"import json; print(json.dumps({{'token': {OLD!r}, 'expires_at': {later!r}}}))"
    command = CommandKey([sys.executable, "-c", script], "tiers.t", timeout_s=5)
    command.prime()
    assert await command.key() == OLD and command.runs == 1
    assert await command.key() == OLD and command.runs == 1


async def _one(config: TierConfig) -> str:
    client = make_http_client(config, "t")
    provider = build_provider("t", config, client)
    try:
        return (await provider.complete(request("last"))).text
    finally:
        await provider.aclose()


def test_key_files_and_sources_are_checked_at_start(tmp_path: Path) -> None:
    missing = str(tmp_path / "absent")
    check_tier("t", tier("http://127.0.0.1:9", api_key_file=missing))  # check-config: not this machine's
    with pytest.raises(ConfigError, match=r"tiers\.t\.api_key_file"):
        build_provider(
            "t", tier("http://127.0.0.1:9", api_key_file=missing), make_http_client(tier("http://x"))
        )
    with pytest.raises(ConfigError, match="name one of"):
        parse_tier_file(
            {"tiers": {"t": {"provider": "openai", "model": "m", "api_key_env": "A", "api_key_file": "/k"}}}
        )


def test_a_deployments_key_source_replaces_the_tiers() -> None:
    config = TierConfig.model_validate(
        {
            "provider": "openai",
            "model": "m",
            "api_key_env": "TIER_KEY",
            "deployments": [
                {"name": "a", "api_key_file": "/keys/a"},
                {"name": "b", "api_key_command": ["tok"]},
            ],
        }
    )
    (_, _, _, a), (_, _, _, b) = config.deployment_configs("t")
    assert (a.api_key_env, a.api_key_file, a.api_key_command) == (None, "/keys/a", None)
    assert (b.api_key_env, b.api_key_file, b.api_key_command) == (None, None, ["tok"])
    assert json.dumps(config.model_dump(mode="json"))  # still a plain settings value

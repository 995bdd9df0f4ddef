"""Building tiers: a tier that fails its config check leaves no HTTP session open."""

from __future__ import annotations

from typing import Any

import pytest

from consumer.app import tiers as app
from consumer.core.errors import ConfigError
from consumer.runtime.stats import ServiceStats
from consumer.settings import TierFile


async def test_a_failing_tier_closes_the_sessions_built_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PB_TEST_UNSET_KEY", raising=False)
    made: list[Any] = []
    real = app.make_http_client

    def recording(tier: Any, *args: Any, **kwargs: Any) -> Any:
        made.append(real(tier, *args, **kwargs))
        return made[-1]

    monkeypatch.setattr(app, "make_http_client", recording)
    tier_file = TierFile.model_validate(
        {
            "tiers": {
                "a": {"provider": "openai_compat", "base_url": "http://127.0.0.1:9/v1", "model": "m"},
                "b": {"provider": "openai", "model": "m", "api_key_env": "PB_TEST_UNSET_KEY"},
            }
        }
    )
    with pytest.raises(ConfigError, match="PB_TEST_UNSET_KEY"):
        await app.build_tiers(tier_file, ServiceStats(instance="t"))
    assert made, "the first tier's session was built"
    assert all(session.closed for session in made)

"""A tier's deployments at run time (`TierRuntime`): the tier is in trouble for its fallback
only when every deployment is (down or out of quota); a request goes while one is up, and is
the probe of an open circuit probed by requests once its probe is due, even while others are up."""

from __future__ import annotations

from typing import Any

from consumer.core.circuit import Admit
from consumer.core.errors import ConnectionFailed, ServerError
from consumer.providers.fake import FakeProvider, text_completion
from consumer.runtime.stats import TierStats
from consumer.runtime.tiers import TierRuntime
from consumer.settings import TierConfig


def _tier(names: tuple[str, ...] = ("a", "b")) -> TierRuntime:
    config = TierConfig.model_validate(
        {
            "provider": "openai_compat",
            "base_url": "http://127.0.0.1:9/v1",
            "model": "m",
            "retry": {"circuit_failures": 1, "circuit_probe_s": 1.0, "circuit_probe_max_s": 2.0},
            "deployments": [{"name": n, "model": f"m-{n}"} for n in names],
        }
    )
    parts: list[tuple[Any, Any]] = [(FakeProvider(lambda _r: text_completion("x")), None) for _ in names]
    return TierRuntime.build("t", config, parts[0][0], TierStats(), deployments=parts)


def test_each_deployment_has_its_own_gate_circuit_and_config() -> None:
    tier = _tier()
    a, b = tier.deployments
    assert (a.name, b.name) == ("a", "b") and a.config.model == "m-a" and b.config.model == "m-b"
    assert a.circuit is not b.circuit and tier.limiter.gates == (a.gate, b.gate)
    assert a.stats is tier.stats.deployments["a"]


def test_the_tier_is_in_trouble_only_when_every_deployment_is() -> None:
    tier = _tier()
    a, b = tier.deployments
    a.circuit.on_outage(ConnectionFailed("x"), 0.0)
    assert not tier.condition(5.0).troubled and tier.admit(5.0)[0] is Admit.SEND
    b.quota.on_exhausted(5.0, 60.0)
    condition = tier.condition(6.0)
    assert condition.troubled and condition.quota_exhausted
    b.quota.on_answer()
    b.circuit.on_outage(ConnectionFailed("x"), 7.0)
    condition = tier.condition(10.0)
    assert condition.circuit_open and condition.outage_s == 3.0 and tier.outage_s(10.0) == 3.0
    # listing-probed circuits: no request goes as their probe
    assert tier.admit(20.0)[0] is Admit.WAIT and not tier.job_probe_due(20.0)


def test_a_circuit_probed_by_requests_gets_its_probe_while_another_deployment_is_up() -> None:
    tier = _tier()
    a, _b = tier.deployments
    a.circuit.on_outage(ServerError("502"), 0.0)
    assert tier.admit(0.5) == (Admit.SEND, 0.0, None)
    admit, _wait_s, probe = tier.admit(1.5)
    assert admit is Admit.PROBE and probe is a
    assert tier.admit(1.6)[0] is Admit.SEND, "one probe at a time; the others go to b"

"""The network fault tests' servers: one Toxiproxy and one proxied 1-node broker per module
(module scope: the module's tests share one xdist worker, and the broker starts once)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from consumer.testing.netcluster import ProxiedKafka, proxied_kafka
from consumer.testing.toxiproxy import Toxiproxy, run_toxiproxy


@pytest.fixture(scope="module")
def toxi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Toxiproxy]:
    with run_toxiproxy(tmp_path_factory.mktemp("toxiproxy")) as server:
        yield server


@pytest.fixture(scope="module")
def proxied_broker(toxi: Toxiproxy) -> Iterator[ProxiedKafka]:
    """A private 1-node broker whose client listeners (two paths) cross `toxi`."""
    with proxied_kafka("netfaults", toxi, nodes=1, paths=2) as cluster:
        yield cluster

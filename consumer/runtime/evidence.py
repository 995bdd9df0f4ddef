"""What the tiers' adaptive batch sizes measured, kept in the compacted batching topic.

A restarted instance, or a new one joining the group, starts each (tier, batch key) from
the latest measurements any instance published for it (`AdaptivePackSize.restore`),
instead of at size 1 with nothing known; every instance publishes what its keys learnt
every `stats_interval_s` and once more at stop.

Record key: ``<tier>/<digest>``, the digest a hash of what the measurements are about: the
tier's provider, base URL, model and `batching.structured`, and the batch key (prompt
prefix, variable, options, mode, and the tenant unless it is `default`: each tenant's jobs
are batched, and measured, apart). Changing any of them starts that key afresh; the prompt
itself is never written. Record value: ``{"tier", "instance", "written_at" (unix s),
"state"}`` with `state` as `AdaptivePackSize.export` gives it. The last writer wins:
instances measuring the same key replace each other's record, each one a sample of the
same provider and prompt.

The tiers are built from the evidence (`TierRuntime.build` restores each new key from it);
the evidence never holds the tiers: a publishing round is handed them (`records(tiers)`).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

import orjson

from consumer.core.adaptive import AdaptivePackSize, AdaptiveSizes
from consumer.core.tenants import DEFAULT_TENANT
from consumer.core.window import PackKey
from consumer.settings import TierConfig

log = logging.getLogger(__name__)

#: records published per round at most: a service with many batch keys (one per prompt)
#: writes the keys that learnt most now and the rest in later rounds
MAX_RECORDS_PER_ROUND = 256


class MeasuredTier(Protocol):
    """What a publishing round reads of a tier (a `TierRuntime`)."""

    @property
    def config(self) -> TierConfig: ...

    @property
    def sizes(self) -> AdaptiveSizes[PackKey]:
        """The adaptive batch size of each batch key of the tier."""
        ...


def evidence_key(tier: str, config: TierConfig, key: PackKey) -> bytes:
    """The batching topic's record key of one tier's batch key (see the module docstring); a
    tenant's key names it, the default tenant's is the key it had before tenants existed."""
    about = [config.provider, config.resolved_base_url, config.model, config.batching.structured, *key]
    if key.tenant == DEFAULT_TENANT:
        about.pop()
    digest = hashlib.sha256(orjson.dumps(about)).hexdigest()[:24]
    return f"{tier}/{digest}".encode()


class RememberedEvidence:
    """The measurements per record key: read at start, restored into new trackers, and the
    records of what the tiers' trackers learnt since the last round (for `SidePublisher`).

    states: record key -> `AdaptivePackSize.export` data, the latest known (this instance's
        own once it has published).
    per_round: records one round of `records` returns at most.
    """

    def __init__(
        self,
        states: Mapping[bytes, Mapping[str, Any]] | None = None,
        *,
        instance: str = "",
        per_round: int = MAX_RECORDS_PER_ROUND,
    ) -> None:
        self.states: dict[bytes, Mapping[str, Any]] = dict(states or {})
        self._instance = instance
        self._per_round = per_round
        #: (tier, batch key) -> the tracker's `changes` when it was last published or restored
        self._published: dict[tuple[str, PackKey], int] = {}

    @classmethod
    def read(cls, latest: Mapping[bytes, bytes], *, instance: str = "") -> RememberedEvidence:
        """From the topic's latest value per key; a record that is not batching evidence is
        skipped with a warning naming it (the topic may hold what another tool wrote)."""
        states: dict[bytes, Mapping[str, Any]] = {}
        for key, value in latest.items():
            try:
                record = orjson.loads(value)
                state = record["state"] if isinstance(record, dict) else None
                if not isinstance(state, dict):
                    raise ValueError("no state object")
            except (orjson.JSONDecodeError, KeyError, ValueError) as exc:
                log.warning("batching topic record %r skipped, not batching evidence: %s", key, exc)
                continue
            states[key] = state
        if states:
            log.info("batching evidence of %d batch keys read; their tiers start from it", len(states))
        return cls(states, instance=instance)

    def restore(self, tier: str, config: TierConfig, key: PackKey, tracker: AdaptivePackSize) -> None:
        """Give a new tracker of `key` what was measured for it, if anything."""
        record_key = evidence_key(tier, config, key)
        state = self.states.get(record_key)
        if state is None:
            return
        try:
            size = tracker.restore(state)
        except ValueError as problem:
            log.warning(
                "tier %s: remembered batching evidence %s not used: %s", tier, record_key.decode(), problem
            )
            return
        self._published[(tier, key)] = tracker.changes
        # one line per batch key (there may be one per prompt): debug, the count is logged at start
        log.debug("tier %s: batch size %d from remembered evidence (%s)", tier, size, tracker.reason())

    def records(self, tiers: Mapping[str, MeasuredTier]) -> list[tuple[bytes, dict[str, Any]]]:
        """(record key, value) of the `tiers`' trackers that learnt something since their last
        record: at most `per_round`, those with the most new reports first (the others stay
        due for the next round)."""
        due: list[tuple[int, str, PackKey, AdaptivePackSize]] = []
        for name, tier in tiers.items():
            for key in list(tier.sizes):
                tracker = tier.sizes.get(key)
                learnt = tracker.changes - self._published.get((name, key), 0)
                if learnt > 0:
                    due.append((learnt, name, key, tracker))
        due.sort(key=lambda d: d[0], reverse=True)
        records = []
        written_at = round(time.time(), 3)
        for _, name, key, tracker in due[: self._per_round]:
            record_key = evidence_key(name, tiers[name].config, key)
            state = tracker.export()
            self.states[record_key] = state
            self._published[(name, key)] = tracker.changes
            value = {"tier": name, "instance": self._instance, "written_at": written_at, "state": state}
            records.append((record_key, value))
        return records

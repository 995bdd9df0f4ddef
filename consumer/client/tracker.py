"""Pure bookkeeping of one run's outcomes as records arrive (no I/O)."""

from __future__ import annotations

from typing import Any

import orjson

from consumer.client.outcomes import Outcome, OutcomeError, Progress


class RunTracker:
    """The outcomes of one run as records arrive: one per index, the first one wins.

    Pure bookkeeping (no I/O): `add_result` / `add_dead_letter` take a record's key and value
    and say whether it was a new outcome of this run.
    """

    def __init__(self, run_id: str, total: int) -> None:
        self.run_id = run_id
        self.total = total
        self._prefix = run_id + "-"
        self._bprefix = self._prefix.encode()
        self._slots: list[Outcome | None] = [None] * total
        self.done = 0
        self.failed = 0
        #: records of this run seen again (redeliveries), and records that could not be read
        self.duplicates = 0
        self.unreadable = 0

    @property
    def complete(self) -> bool:
        """Every index has its outcome."""
        return self.done == self.total

    def _index_of(self, jid: str | bytes) -> int | None:
        """The index a job id names in this run, or None (another run, a longer run id that
        shares the prefix, an index out of range or not written as `str(index)`)."""
        tail = jid[len(self._prefix) :]
        if not (tail.isascii() and tail.isdigit()) or (len(tail) > 1 and tail[:1] in ("0", b"0")):
            return None
        index = int(tail)
        return index if index < self.total else None

    def _index(self, key: bytes | None, value: bytes) -> tuple[int, dict[str, Any]] | None:
        if key is not None:
            # the key is the job id: another run's record, or a redelivery, is never parsed
            if not key.startswith(self._bprefix):
                return None
            index = self._index_of(key)
            if index is None:
                return None
            if self._slots[index] is not None:
                self.duplicates += 1
                return None
            record = self._record(value)
            if record is None or record.get("id") != key.decode():
                self.unreadable += 1
                return None
            return index, record
        # no key (an id the service could not put in the key): the id in the value decides
        record = self._record(value)
        jid = record.get("id") if record is not None else None
        if not isinstance(jid, str) or not jid.startswith(self._prefix):
            return None
        index = self._index_of(jid)
        if index is None or record is None:
            return None
        if self._slots[index] is not None:
            self.duplicates += 1
            return None
        return index, record

    @staticmethod
    def _record(value: bytes) -> dict[str, Any] | None:
        try:
            record = orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
        return record if isinstance(record, dict) else None

    def add_result(self, key: bytes | None, value: bytes | None) -> bool:
        """A results-topic record; True when it is this run's first outcome of its index."""
        found = self._index(key, value) if value is not None else None
        if found is None:
            return False
        index, record = found
        output = record.get("output")
        # an embed job's result has no output: its answer is its `embedding`
        if not isinstance(output, str) and not (output is None and isinstance(record.get("embedding"), list)):
            self.unreadable += 1
            return False
        self._slots[index] = Outcome(index, record["id"], True, output=output, result=record)
        self.done += 1
        return True

    def add_dead_letter(self, key: bytes | None, value: bytes | None) -> bool:
        """A dead-letter-topic record; True when it is this run's first outcome of its index."""
        found = self._index(key, value) if value is not None else None
        if found is None:
            return False
        index, record = found
        err = record.get("error")
        if not isinstance(err, dict) or not isinstance(err.get("kind"), str):
            self.unreadable += 1
            return False
        status = err.get("status_code")
        provider = err.get("provider")
        error = OutcomeError(
            kind=err["kind"],
            message=str(err.get("message", "")),
            retryable=bool(err.get("retryable", False)),
            status_code=status if isinstance(status, int) else None,
            provider=provider if isinstance(provider, str) else None,
        )
        self._slots[index] = Outcome(index, record["id"], False, error=error)
        self.done += 1
        self.failed += 1
        return True

    def progress(self, elapsed_s: float) -> Progress:
        """The counts now."""
        return Progress(self.done, self.failed, self.total, elapsed_s)

    def outcomes(self) -> list[Outcome]:
        """One outcome per index, in index order; `pending` where none is in yet."""
        return [
            o if o is not None else Outcome(i, f"{self._prefix}{i}", False, pending=True)
            for i, o in enumerate(self._slots)
        ]

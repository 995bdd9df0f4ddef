"""The producer-side client: submit many jobs, wait for their outcomes, get them in input order.

```python
from consumer.client import Client

with Client() as client:                  # the service's settings (PROMPTBUS_*, KAFKA_BOOTSTRAP_SERVERS)
    outcomes = client.map("small", ["Great!", "Awful."],
                          prompt="Classify the sentiment.\\nTEXT:\\n${text}", batch=True)
for o in outcomes:                        # one per input, in input order
    print(o.index, o.output if o.ok else o.error.kind)
```

`Client` blocks; `AsyncClient` has the same methods as coroutines. Both read the same settings
as the service (`consumer.settings.load_settings`: topics, bootstrap servers, Kafka security);
keyword arguments override them (`Client(results_topic="x")`).

A run
-----
A call submits one job per input with the id `RUN_ID-INDEX` (a random run id unless one is
given) and reads the results and dead-letter topics until every index has an outcome:

1. Before the first job is produced, the end offsets of every partition of both topics are
   read. Reading starts there: nothing older is read, so the cost does not grow with the
   topics' history.
2. Only records whose key (the job id) is `RUN_ID-` followed by an index of this run count;
   other runs' records are skipped without being parsed.
3. The first outcome of an index wins; a second one (at_least_once redelivers after a crash)
   is dropped, so each index has exactly one outcome.

Bad input raises `ValueError` naming the index and the reason before anything is produced.
`timeout_s` counts from the call; every job is produced even when it passes first (so the
run can always be collected whole). When it passes, `MapTimeout` carries the run id and the
outcomes so far; nothing is cancelled: the service still answers every job.

Where `collect` starts reading
------------------------------
`collect(run_id, total)` returns a run's full list later. The client that started the run
remembers its start offsets and reads from them. Any other client (a new process) finds them
by time: a run id the client generates starts with its start time in UTC to the millisecond
(`20261201T081330123Z-9f3a1c2e`), and `collect` reads every partition from the first record
stamped at or after that time less `CLOCK_MARGIN_S` (Kafka's `offsets_for_times`). Every
outcome of the run is stamped later than its job was produced, so none is missed while the
service's clock is less than `CLOCK_MARGIN_S` behind the client's. A run id chosen by the
caller carries no time: give `collect` the run's start as `since` (Unix seconds;
`MapTimeout.started_at` holds it).
"""

from __future__ import annotations

from consumer.client.aio import CLOCK_MARGIN_S, AsyncClient
from consumer.client.jobs import chat_jobs, check_jobs, embed_jobs, new_run_id, prompt_jobs, run_started_at
from consumer.client.outcomes import (
    MapError,
    MapTimeout,
    Outcome,
    OutcomeError,
    Progress,
    RunOptions,
    failure_counts,
)
from consumer.client.shell import ProgressBar, read_inputs, write_outcomes
from consumer.client.sync import Client
from consumer.client.tracker import RunTracker

__all__ = [
    "CLOCK_MARGIN_S",
    "AsyncClient",
    "Client",
    "MapError",
    "MapTimeout",
    "Outcome",
    "OutcomeError",
    "Progress",
    "ProgressBar",
    "RunOptions",
    "RunTracker",
    "chat_jobs",
    "check_jobs",
    "embed_jobs",
    "failure_counts",
    "new_run_id",
    "prompt_jobs",
    "read_inputs",
    "run_started_at",
    "write_outcomes",
]

"""What a held job keeps: Python allocations retained per job while `max_inflight` jobs wait
for a provider that does not answer (in-memory edges, tracemalloc in this process).

Half the jobs batchable (they wait in windows and batched plans), half chat (they wait as
queued plans, not as a task each). The bound is bytes of retained allocations per held job,
a count, not a time; the allocations of producing the jobs themselves are left out.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

from consumer.core.completion import Completion, CompletionRequest
from consumer.providers.fake import FakeProvider
from consumer.testing.harness import MemoryBus, job, tier_file_dict

HELD = 2000
#: retained Python allocations per held job (records of ~200 bytes)
MAX_BYTES_PER_HELD_JOB = 3000


async def test_a_held_job_retains_little() -> None:
    # the jobs are never answered: shutdown abandons them after a short bound
    bus = MemoryBus(partitions=4, PROMPTBUS_MAX_INFLIGHT=HELD, PROMPTBUS_SHUTDOWN_TIMEOUT_S=1)
    never = asyncio.Event()

    async def hang(request: CompletionRequest) -> Completion:
        await never.wait()
        raise AssertionError("unreachable")

    tiers = tier_file_dict("http://127.0.0.1:9/v1", timeout_s=600, max_items=10)
    tiers["tiers"]["small"]["limiter"] = {"algorithm": "fixed", "initial": 4, "min": 1, "max": 4}
    service = bus.service(tiers, providers={"small": FakeProvider(hang, name="small")})
    async with service:
        gc.collect()
        tracemalloc.start(8)
        try:
            before = tracemalloc.take_snapshot()
            await bus.produce(job(i, batch=i % 2 == 1) for i in range(2 * HELD))
            for _ in range(400):
                if service.stats_snapshot()["inflight"] >= HELD:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            gc.collect()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        held = service.stats_snapshot()["inflight"]
    assert held >= HELD * 0.95, f"only {held} jobs held"
    # the produced records (the memory broker's) are allocated from this test's frames
    leave_out = [
        tracemalloc.Filter(False, __file__, all_frames=True),
        tracemalloc.Filter(False, tracemalloc.__file__),
    ]
    diff = after.filter_traces(leave_out).compare_to(before.filter_traces(leave_out), "traceback")
    retained = sum(d.size_diff for d in diff)
    top = "\n".join(str(d) + "\n  " + "\n  ".join(d.traceback.format()[-6:]) for d in diff[:5])
    print(f"{retained / held:.0f} B retained per held job ({held} held)")
    assert retained / held <= MAX_BYTES_PER_HELD_JOB, f"{retained / held:.0f} B per held job; top:\n{top}"

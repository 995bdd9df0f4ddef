"""The service's GC settings still reclaim garbage in cycles on their own."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from consumer.runtime.heap import GC_GEN0_THRESHOLD


def test_cyclic_garbage_is_still_collected_automatically() -> None:
    # in a child process: tune_gc freezes the heap, which must not happen to the test runner
    script = textwrap.dedent(
        """
        import gc
        from consumer.runtime.heap import tune_gc

        tune_gc()
        assert gc.isenabled()
        before = gc.get_stats()[0]["collections"]

        class Node:
            def __init__(self) -> None:
                self.other = self  # a cycle: reference counting alone never frees it

        for _ in range(300_000):
            Node()
        collected = gc.get_stats()[0]["collections"] - before
        # without automatic collections all of them would still be alive here
        alive = sum(isinstance(o, Node) for o in gc.get_objects())
        print(collected, alive)
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    collected, alive = map(int, run.stdout.split())
    assert collected >= 2
    assert alive <= GC_GEN0_THRESHOLD  # at most one threshold's worth of garbage waits

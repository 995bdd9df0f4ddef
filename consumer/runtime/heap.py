"""The process's heap: garbage-collection settings for a long-running service.

Every job allocates many short-lived objects and almost none of them form cycles, while the
heap holds a large, static part (libraries, clients). With CPython's defaults the collector
runs often and each full pass walks that whole static heap, a large share of the service's
CPU (bench/pipeline_bench.py measures it; bench/README.md has the figures). `tune_gc`, applied
once start-up has made what lives as long as the service, moves what is alive to the permanent
generation and collects the young generation only once `GC_GEN0_THRESHOLD` more objects are
alive than at the last collection.
"""

from __future__ import annotations

import gc

__all__ = ["GC_GEN0_THRESHOLD", "tune_gc"]

#: young-generation collections run after this many net allocations of tracked objects
#: (allocations minus deallocations). A job's objects die by reference counting and almost
#: none are left in cycles, so the count grows only with what is alive or cyclic garbage: a
#: collection runs once that many more are, which still bounds the garbage. The threshold is
#: high enough that a steady service does not collect while its in-flight jobs come and go
#: (each collection would walk their objects).
GC_GEN0_THRESHOLD = 100_000


def tune_gc() -> None:
    """Freeze what is alive now and raise the young generation's threshold (idempotent)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)

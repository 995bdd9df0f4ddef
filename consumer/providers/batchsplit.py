"""Shared Batch API bookkeeping: custom_id checks, splitting over a provider's limits, and
reading a results file line by line."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence

from consumer.core.errors import MalformedResponse, ProviderError
from consumer.core.offline import BatchItemResult, BatchJob, BatchRequest

log = logging.getLogger(__name__)


def check_custom_ids(requests: Sequence[BatchRequest], *, pattern: re.Pattern[str] | None = None) -> None:
    """Raise ValueError on an empty batch, a missing/blank, malformed or duplicate custom_id.

    Called before anything is sent, so a bad submission costs no request.
    """
    if not requests:
        raise ValueError("a batch needs at least one request")
    seen: set[str] = set()
    for index, item in enumerate(requests):
        cid = item.custom_id
        if not isinstance(cid, str) or not cid.strip():
            raise ValueError(f"request #{index} has no custom_id")
        if pattern is not None and not pattern.fullmatch(cid):
            raise ValueError(f"custom_id {cid!r} does not match {pattern.pattern}")
        if cid in seen:
            raise ValueError(f"duplicate custom_id {cid!r}")
        seen.add(cid)


def split_by_limits(
    sizes_bytes: Sequence[int], *, max_requests: int, max_bytes: int, overhead_bytes: int = 0
) -> list[range]:
    """Consecutive index ranges, each within `max_requests` items and `max_bytes` bytes.

    `sizes_bytes[i]` is item i's encoded size (separators included); `overhead_bytes` is the
    fixed cost of one provider batch (an envelope). An item too big on its own raises ValueError.
    """
    if max_requests < 1 or max_bytes < 1:
        raise ValueError("limits must be positive")
    chunks: list[range] = []
    start = 0
    used = overhead_bytes
    for i, size in enumerate(sizes_bytes):
        if size + overhead_bytes > max_bytes:
            raise ValueError(f"request #{i} alone is {size} bytes, over the {max_bytes}-byte batch limit")
        if i > start and (i - start >= max_requests or used + size > max_bytes):
            chunks.append(range(start, i))
            start, used = i, overhead_bytes
        used += size
    if start < len(sizes_bytes):
        chunks.append(range(start, len(sizes_bytes)))
    return chunks


async def create_chunks(
    name: str,
    requests: Sequence[BatchRequest],
    chunks: Sequence[range],
    create: Callable[[range], Awaitable[BatchJob]],
    submitted: dict[str, dict[str, BatchRequest]],
) -> list[BatchJob]:
    """Create one provider batch per chunk with `create`, recording each batch's requests.

    If a later chunk fails, the batches already created stay submitted: their ids are logged
    and the error is raised.
    """
    jobs: list[BatchJob] = []
    for chunk in chunks:
        try:
            job = await create(chunk)
        except ProviderError:
            if jobs:
                log.warning(
                    "%s: batch submit failed after %d batches were created: %s",
                    name,
                    len(jobs),
                    [j.id for j in jobs],
                )
            raise
        submitted[job.id] = {requests[i].custom_id: requests[i] for i in chunk}
        log.info("%s: created batch %s with %d requests", name, job.id, len(chunk))
        jobs.append(job)
    return jobs


def parse_result_lines(
    content: bytes,
    parse_line: Callable[[bytes, Mapping[str, BatchRequest]], BatchItemResult],
    submitted: Mapping[str, BatchRequest],
    provider: str,
) -> list[BatchItemResult]:
    """Each non-blank line of a results file, parsed by the adapter's `parse_line`.

    A line it cannot read (MalformedResponse: not JSON, no custom_id to tie it to) is skipped
    with a warning, so the other items keep their answers; its request ends as one the file
    does not mention.
    """
    items: list[BatchItemResult] = []
    for number, raw in enumerate(content.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            items.append(parse_line(raw, submitted))
        except MalformedResponse as exc:
            log.warning("%s: results line %d skipped: %s", provider, number, exc.message)
    return items

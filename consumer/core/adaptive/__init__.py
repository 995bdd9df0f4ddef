"""Adaptive batch size from evidence, and answer-agreement accounting, pure.

Prompt batching must never make a tier worse: the batch size of a (tier, batch key) is the
largest size its measurements support (valid batched answers, agreement with the same jobs
asked alone, speed and what the provider charges), not a guess that waits to be refuted; a
share of the jobs probes the next size so the evidence keeps coming. Ordinary requests
(size 1) are never judged. docs/batching-adaptive.md states the rule in full.

`evidence` holds what one size measured, `size` decides the size per key from it,
`agreement` compares batched answers with single ones. Nothing here reads a clock, sleeps
or logs I/O: every time is an explicit `now_s`, randomness an injected `random.Random`.
"""

from consumer.core.adaptive.agreement import (
    AgreementCount,
    AgreementStats,
    answers_agree,
    choose_verified,
    normalize_answer,
)
from consumer.core.adaptive.evidence import INVALID_KINDS, VALID_KIND, levels_for, wilson_bounds
from consumer.core.adaptive.size import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MIN_AGREEMENT,
    DEFAULT_PROBE_FRACTION,
    MIN_SINGLE_REQUESTS,
    PROBE_PATIENCE_S,
    AdaptivePackSize,
    AdaptiveSizes,
)

__all__ = [
    "DEFAULT_CONFIDENCE",
    "DEFAULT_MIN_AGREEMENT",
    "DEFAULT_PROBE_FRACTION",
    "INVALID_KINDS",
    "MIN_SINGLE_REQUESTS",
    "PROBE_PATIENCE_S",
    "VALID_KIND",
    "AdaptivePackSize",
    "AdaptiveSizes",
    "AgreementCount",
    "AgreementStats",
    "answers_agree",
    "choose_verified",
    "levels_for",
    "normalize_answer",
    "wilson_bounds",
]

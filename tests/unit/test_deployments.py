"""The choice of a tier's deployment (`consumer.core.deployments`), as properties: never an
open circuit, never one without room, the most headroom first, and over many choices the
weights' shares when nothing else tells the deployments apart."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.core.deployments import Room, choose_deployment

rooms = st.builds(
    Room,
    up=st.booleans(),
    ready=st.booleans(),
    free_slots=st.integers(-2, 20),
    budget=st.none() | st.floats(-3.0, 30.0, allow_nan=False),
    weight=st.floats(0.1, 10.0, allow_nan=False),
    chosen=st.integers(0, 1000),
)


def _can_take(room: Room) -> bool:
    return room.up and room.ready and room.free_slots > 0


@settings(max_examples=500)
@given(st.lists(rooms, min_size=1, max_size=6))
def test_never_an_open_circuit_nor_one_without_room(candidates: list[Room]) -> None:
    chosen = choose_deployment(candidates)
    if chosen is None:
        assert not any(_can_take(r) for r in candidates)
    else:
        assert _can_take(candidates[chosen])


@settings(max_examples=500)
@given(st.lists(rooms, min_size=1, max_size=6))
def test_the_most_headroom_goes_first(candidates: list[Room]) -> None:
    chosen = choose_deployment(candidates)
    if chosen is None:
        return
    best = max(r.headroom for r in candidates if _can_take(r))
    assert candidates[chosen].headroom == best
    # equal headroom: the one furthest behind its weight's share
    tied = [r for r in candidates if _can_take(r) and r.headroom == best]
    assert (candidates[chosen].chosen + 0.5) / candidates[chosen].weight == min(
        (r.chosen + 0.5) / r.weight for r in tied
    )


def test_headroom_is_the_free_slots_capped_by_the_paced_budget() -> None:
    assert Room(True, True, 5, None, 1.0, 0).headroom == 5
    assert Room(True, True, 5, 2.7, 1.0, 0).headroom == 2
    assert Room(True, True, 5, -1.0, 1.0, 0).headroom == 0
    # a paced deployment with budget for 3 beats one with 5 free slots and budget for 1
    assert choose_deployment([Room(True, True, 5, 1.2, 1.0, 0), Room(True, True, 4, 3.5, 1.0, 9)]) == 1


@settings(max_examples=200)
@given(st.lists(st.floats(0.2, 8.0, allow_nan=False), min_size=1, max_size=5), st.integers(50, 2000))
def test_weights_set_the_shares_when_nothing_else_says_more(weights: list[float], n: int) -> None:
    counts = [0] * len(weights)
    for _ in range(n):
        candidates = [Room(True, True, 8, None, w, c) for w, c in zip(weights, counts, strict=True)]
        chosen = choose_deployment(candidates)
        assert chosen is not None
        counts[chosen] += 1
    total = sum(weights)
    for w, c in zip(weights, counts, strict=True):
        # within a request per deployment of its weight's share, whatever n
        assert abs(c - n * w / total) <= len(weights), (weights, counts)


def test_a_deployment_that_goes_down_takes_nothing_and_comes_back_for_its_share() -> None:
    counts = [0, 0, 0]
    for step in range(300):
        up = [True, not 100 <= step < 200, True]
        candidates = [Room(u, True, 8, None, 1.0, c) for u, c in zip(up, counts, strict=True)]
        chosen = choose_deployment(candidates)
        assert chosen is not None and up[chosen]
        counts[chosen] += 1
    # behind after its outage, it is chosen first until it has caught up
    assert counts[1] >= 99 and counts[0] == counts[2]

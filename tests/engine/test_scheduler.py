"""The scheduler: decode rows first, prompt chunks at chunk multiples, strict FIFO admission."""

from __future__ import annotations

from tfd.engine.lane import Lane
from tfd.engine.request import Request
from tfd.engine.scheduler import Admission, Scheduler


def lane(number: int, prompt: int, max_tokens: int = 4) -> Lane:
    return Lane(number, Request(f"r{number}", tuple(range(prompt)), max_tokens))


def always(_: Lane) -> Admission:
    return Admission.ADMITTED


def test_prompt_chunks_end_at_multiples_of_64_or_the_prompt_end() -> None:
    scheduler = Scheduler(step_tokens=256, max_lanes=4)
    long = lane(1, 300)
    scheduler.add(long)
    sizes = []
    while long.position < 300:
        (work,) = scheduler.plan(always).works
        sizes.append((work.start, work.length, work.samples))
        long.position += work.length
    assert sizes == [(0, 256, False), (256, 44, True)]


def test_decode_rows_come_first_and_prefill_takes_what_is_left() -> None:
    scheduler = Scheduler(step_tokens=128, max_lanes=8)
    decoding = [lane(i, 4) for i in range(3)]
    for each in decoding:
        scheduler.add(each)
    scheduler.plan(always)
    for each in decoding:
        each.advanced(4)
        each.record(9, 0.0)  # decoding now
    newcomer = lane(9, 500)
    scheduler.add(newcomer)
    works = scheduler.plan(always).works
    assert [(w.lane.number, w.length, w.decode) for w in works] == [(0, 1, True), (1, 1, True), (2, 1, True),
                                                                    (9, 64, False)]  # 125 left: one chunk


def test_the_oldest_prefill_is_never_starved_by_decode_rows() -> None:
    scheduler = Scheduler(step_tokens=64, max_lanes=100)
    for i in range(80):
        scheduler.add(lane(i, 1))
    while scheduler.waiting:  # admit all 80, a budget's worth a step, each done with its prompt
        for work in scheduler.plan(always).works:
            if not work.decode:
                work.lane.advanced(1)
                work.lane.record(1, 0.0)  # decoding now
    starving = lane(999, 200)
    scheduler.add(starving)
    works = scheduler.plan(always).works
    assert [w.length for w in works if w.lane is starving] == [64]


def test_admission_is_oldest_first_and_stops_at_the_first_that_must_wait() -> None:
    scheduler = Scheduler(step_tokens=256, max_lanes=8)
    big, small = lane(1, 10, max_tokens=1000), lane(2, 10)
    scheduler.add(big)
    scheduler.add(small)
    plan = scheduler.plan(lambda candidate: Admission.WAIT if candidate is big else Admission.ADMITTED)
    assert plan.works == () and list(scheduler.waiting) == [big, small]  # the small one does not jump ahead


def test_cancelled_and_dropped_lanes_leave_at_the_step_boundary() -> None:
    scheduler = Scheduler(step_tokens=256, max_lanes=8)
    gone, broken, fine = lane(1, 10), lane(2, 10), lane(3, 10)
    for each in (gone, broken, fine):
        scheduler.add(each)
    gone.cancel()
    plan = scheduler.plan(lambda candidate: Admission.DROPPED if candidate is broken else Admission.ADMITTED)
    assert plan.cancelled == (gone,) and plan.dropped == (broken,)
    assert [w.lane for w in plan.works] == [fine]
    assert scheduler.running == [fine] and not scheduler.waiting


def test_a_choice_waits_behind_its_leader_until_the_leaders_prompt_is_through() -> None:
    scheduler = Scheduler(step_tokens=64, max_lanes=8)
    leader = lane(1, 130)
    follower = Lane(2, Request("r1/1", tuple(range(130)), 4, after="r1"), leader=leader)
    later = lane(3, 4)
    for each in (leader, follower, later):
        scheduler.add(each)
    admitted = []
    while leader.phase.value != "decode":
        works = scheduler.plan(always).works
        admitted += [w.lane.number for w in works if w.start == 0 and not w.decode]
        assert follower.phase.value == "waiting" and later.phase.value == "waiting"  # strictly in order
        for work in works:
            work.lane.advanced(work.start + work.length)
        if leader.position == 130:
            leader.record(7, 0.0)
    assert admitted == [1]
    works = scheduler.plan(always).works  # the leader decodes: the follower goes in, and those behind it
    assert [(w.lane.number, w.decode) for w in works][:2] == [(1, True), (2, False)]


def test_a_choice_whose_leader_was_cancelled_does_not_wait_for_it() -> None:
    scheduler = Scheduler(step_tokens=64, max_lanes=8)
    leader = lane(1, 130)
    follower = Lane(2, Request("r1/1", tuple(range(130)), 4, after="r1"), leader=leader)
    scheduler.add(leader)
    scheduler.add(follower)
    assert follower.behind_leader
    leader.cancel()
    assert not follower.behind_leader
    works = scheduler.plan(always).works
    assert [w.lane.number for w in works] == [2]

"""The shared GPU memory model: allocations that fit, ones that do not, frees, exits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vramguard_api.kubelet import consecutive_failures, crash_loop_backoff, restarts_after_failure
from vramguard_sim.gpumem import REASON_DEVICE_FULL, REASON_HARD_LIMIT, REASON_SOFT_LIMIT, Device, OOMKill

GIB = 1 << 30


def device(total=80, reserved=1, overhead=0):
    return Device("GPU-0", total * GIB, reserved * GIB, overhead * GIB)


def test_figures_follow_nvml_v2():
    d = device(overhead=1)
    d.start(1)
    d.allocate(1, 10 * GIB)
    assert (d.usable_bytes, d.used_bytes, d.free_bytes) == (79 * GIB, 11 * GIB, 68 * GIB)
    assert d.process_bytes == 10 * GIB


def test_an_allocation_that_fits_succeeds_and_one_that_does_not_kills_its_process():
    d = device()
    d.start(1, owner="ns/a")
    d.start(2, owner="ns/b")
    assert d.allocate(1, 60 * GIB) == ()
    assert d.allocate(2, 10 * GIB) == ()
    (kill,) = d.allocate(2, 10 * GIB)  # 9Gi free
    assert kill == OOMKill("GPU-0", 2, "ns/b", 10 * GIB, 10 * GIB, 9 * GIB, REASON_DEVICE_FULL)
    assert kill.wanted_bytes == 20 * GIB
    assert 2 not in d.processes  # it died, and what it held is free again
    assert d.free_bytes == 19 * GIB
    assert d.holding(1) == 60 * GIB  # the neighbour is untouched


def test_an_allocation_of_exactly_the_free_memory_fits():
    d = device()
    d.start(1)
    assert d.allocate(1, d.free_bytes) == ()
    assert d.free_bytes == 0
    assert d.allocate(1, 0) == ()
    assert len(d.allocate(1, 1)) == 1


def test_memory_is_freed_on_exit_and_by_release():
    d = device()
    d.start(1)
    d.allocate(1, 30 * GIB)
    d.release(1, 10 * GIB)
    assert d.holding(1) == 20 * GIB
    assert d.exit(1) == 20 * GIB
    assert d.free_bytes == d.usable_bytes
    assert d.exit(1) == 0  # twice is harmless


def test_resize_frees_or_allocates_the_difference():
    d = device(total=10, reserved=0)
    d.start(1)
    d.start(2)
    assert d.resize(1, 6 * GIB) == ()
    assert d.resize(2, 3 * GIB) == ()
    assert d.resize(1, 2 * GIB) == ()  # frees 4Gi
    assert d.resize(2, 8 * GIB) == ()  # which the neighbour can now take
    (kill,) = d.resize(1, 3 * GIB)
    assert (kill.pid, kill.held_bytes, kill.requested_bytes, kill.free_bytes) == (1, 2 * GIB, GIB, 0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda d: d.allocate(9, 1), "pid 9 is not running"),
        (lambda d: d.resize(9, 1), "pid 9 is not running"),
        (lambda d: d.allocate(1, -1), "allocation of pid 1"),
        (lambda d: d.release(1, GIB), "frees 1073741824 bytes but holds 0"),
        (lambda d: d.resize(1, -5), "wants -5 bytes"),
        (lambda d: d.start(1), "pid 1 is already running"),
    ],
)
def test_bad_calls_name_the_device_and_the_value(call, message):
    d = device()
    d.start(1)
    with pytest.raises(ValueError, match=message):
        call(d)


def test_reserved_and_overhead_cannot_exceed_the_total():
    with pytest.raises(ValueError, match="exceed total_bytes"):
        Device("GPU-x", GIB, GIB, 1)
    with pytest.raises(ValueError, match="total_bytes"):
        Device("GPU-x", -1)


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 30)), max_size=60))
def test_never_more_than_usable_is_held_and_the_books_balance(steps):
    d = device(total=40, reserved=2, overhead=1)
    for pid in range(4):
        d.start(pid)
    for pid, gib in steps:
        if pid not in d.processes:
            d.start(pid)
        kills = d.resize(pid, gib * GIB)
        if kills:
            assert kills[0].requested_bytes > kills[0].free_bytes
            assert pid not in d.processes
        else:
            assert d.holding(pid) == gib * GIB
        assert 0 <= d.free_bytes
        assert d.used_bytes == d.overhead_bytes + sum(p.used_bytes for p in d.processes.values())


def test_restart_policy_and_crash_loop_backoff():
    assert restarts_after_failure("Always") and restarts_after_failure("OnFailure")
    assert not restarts_after_failure("Never")
    with pytest.raises(ValueError, match="restartPolicy"):
        restarts_after_failure("Sometimes")  # type: ignore[arg-type]
    assert [crash_loop_backoff(n) for n in (1, 2, 3, 5, 6, 50)] == [10, 20, 40, 160, 300, 300]
    assert consecutive_failures(3, 30.0) == 4
    assert consecutive_failures(3, 600.0) == 1  # ran 10 min: back-off reset


# --- per-cgroup limits --------------------------------------------------------------------


def test_a_hard_limit_fails_its_owners_allocation_only_even_with_memory_free():
    d = device()
    d.start(1, owner="ns/capped")
    d.start(2, owner="ns/capped")  # a second process of the same pod counts against the same limit
    d.start(3, owner="ns/neighbour")
    d.set_limits("ns/capped", hard_bytes=20 * GIB)
    assert d.allocate(1, 15 * GIB) == () and d.allocate(2, 5 * GIB) == ()
    (kill,) = d.allocate(2, 1)
    assert (kill.pid, kill.reason, kill.requested_bytes, kill.held_bytes) == (2, REASON_HARD_LIMIT, 1, 5 * GIB)
    assert d.holding(1) == 15 * GIB  # the other process of the pod keeps what it holds
    assert d.allocate(3, 50 * GIB) == ()  # the neighbour is not limited
    d.set_limits("ns/capped")  # cleared
    assert d.allocate(1, 10 * GIB) == () and d.limits == {}


def test_under_pressure_the_owner_furthest_above_its_soft_limit_is_evicted_first():
    d = device(total=81)  # 80Gi usable
    for pid, owner in ((1, "a"), (2, "b"), (3, "c"), (4, "d")):
        d.start(pid, owner=owner)
        d.set_limits(owner, soft_bytes=20 * GIB)
    d.allocate(1, 30 * GIB)  # a: 10Gi above its share
    d.allocate(2, 24 * GIB)  # b: 4Gi above
    d.allocate(3, 18 * GIB)  # c: within
    kills = d.allocate(4, 12 * GIB)  # d within its share, 8Gi free: a goes, d's allocation succeeds
    assert [(k.pid, k.reason, k.requested_bytes) for k in kills] == [(1, REASON_SOFT_LIMIT, 0)]
    assert d.holding(4) == 12 * GIB and d.holding(2) == 24 * GIB and d.holding(3) == 18 * GIB


def test_victims_go_until_the_allocation_fits_and_never_within_their_soft_limit():
    d = device(total=81)
    for pid, owner, soft, held in ((1, "a", 10, 14), (2, "b", 10, 12), (3, "c", 30, 30), (4, "d", 20, 0)):
        d.start(pid, owner=owner)
        d.set_limits(owner, soft_bytes=soft * GIB)
        d.allocate(pid, held * GIB)
    kills = d.allocate(4, 40 * GIB)  # 24Gi free: a (4Gi above) then b (2Gi above) go, c stays
    assert [k.pid for k in kills] == [1, 2] and d.holding(4) == 40 * GIB and d.holding(3) == 30 * GIB
    (kill,) = d.allocate(4, 20 * GIB)  # nobody else above a soft limit: the requester fails as before
    assert (kill.pid, kill.reason) == (4, REASON_DEVICE_FULL) and d.holding(3) == 30 * GIB


def test_the_requester_furthest_above_fails_itself_and_owners_without_soft_limits_are_never_chosen():
    d = device(total=81)
    d.start(1, owner="grower")
    d.start(2, owner="plain")  # no limits: no statement, never evicted for another
    d.start(3, owner="small")
    d.set_limits("grower", soft_bytes=10 * GIB)
    d.set_limits("small", soft_bytes=5 * GIB)
    d.allocate(1, 40 * GIB)
    d.allocate(2, 30 * GIB)
    d.allocate(3, 6 * GIB)  # 1Gi above
    (kill,) = d.allocate(1, 10 * GIB)  # grower is furthest above: its own allocation fails
    assert (kill.pid, kill.reason) == (1, REASON_DEVICE_FULL)
    assert d.holding(2) == 30 * GIB and d.holding(3) == 6 * GIB


def test_limits_are_checked_like_nvml_checks_them():
    d = device()
    with pytest.raises(ValueError, match="soft limit 2 of a above its hard limit 1"):
        d.set_limits("a", soft_bytes=2, hard_bytes=1)
    with pytest.raises(ValueError, match="hard limit of a"):
        d.set_limits("a", hard_bytes=-1)


@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 30)), max_size=40))
def test_with_soft_limits_at_the_shares_no_process_within_its_share_dies_for_another(steps):
    # four owners with soft limits at a quarter each of 80Gi: whatever they ask for,
    # a process within its share dies only by its own allocation, never as a victim
    d = device(total=81)
    for pid in range(1, 5):
        d.start(pid, owner=str(pid))
        d.set_limits(str(pid), soft_bytes=20 * GIB)
    for pid, want in steps:
        if pid not in d.processes:
            d.start(pid, owner=str(pid))
        for k in d.resize(pid, want * GIB):
            if k.pid != pid:
                assert k.reason == REASON_SOFT_LIMIT and k.held_bytes > 20 * GIB
        assert d.used_bytes <= d.usable_bytes

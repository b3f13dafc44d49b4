"""The measurement protocol (feather/measuring): the median's interval against brute force,
the rotated order, retakes of disturbed repeats and their bounds, the page's flag, and the
/proc accounting that tells our process tree from everyone else's."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
import time
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from measuring_fakes import ScriptedWatch, activity

from feather.measuring.order import rotated, schedule
from feather.measuring.protocol import MeasuringProtocol, unstable_flag
from feather.measuring.quiet import QuietBounds, Watch, between
from feather.measuring.stats import coverage, interval_rank, median_interval, paired_ratios


def brute_coverage(n: int, k: int) -> float:
    """Each value falls below the median with probability 1/2: the interval [x_(k),
    x_(n+1-k)] holds the median exactly when at least k fall below it and k above it."""
    hits = sum(1 for signs in itertools.product((0, 1), repeat=n)
               if sum(signs) >= k and n - sum(signs) >= k)
    return hits / 2**n


@given(st.integers(1, 14), st.data())
@settings(max_examples=80, deadline=None)
def test_the_intervals_coverage_is_the_binomial_one(n: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(1, (n + 1) // 2))
    assert math.isclose(coverage(n, k), brute_coverage(n, k))


@given(st.lists(st.floats(0.1, 1e4), min_size=1, max_size=40))
@settings(max_examples=100, deadline=None)
def test_the_interval_holds_the_median_at_the_widest_rank_that_covers_95(values) -> None:
    iv = median_interval(values)
    data = sorted(values)
    assert iv.low <= iv.median <= iv.high and iv.n == len(values)
    k = interval_rank(len(values))
    assert (iv.low, iv.high) == (data[k - 1], data[len(data) - k])
    if len(values) >= 6:  # enough values for a 95% interval: the next rank in would not be
        assert iv.coverage >= 0.95
        if k + 1 <= (len(values) + 1) // 2:
            assert coverage(len(values), k + 1) < 0.95


def test_five_repeats_give_the_range_with_its_coverage_said() -> None:
    iv = median_interval([1.2, 1.4, 1.3, 1.5, 1.1])
    assert (iv.low, iv.median, iv.high) == (1.1, 1.3, 1.5)
    assert iv.coverage == pytest.approx(1 - 2 / 32)
    assert iv.text() == "1.30x [1.10-1.50] (n=5, 94% coverage)"
    assert median_interval([]) is None
    assert paired_ratios({0: 2.0, 1: 3.0, 2: 1.0}, {0: 1.0, 1: 2.0}) == [2.0, 1.5]


def test_arms_rotate_from_repeat_to_repeat() -> None:
    assert rotated("abc", 0) == list("abc") and rotated("abc", 4) == list("bca")
    order = schedule("ab", 3)
    assert order == [(0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"), (2, "b")]


def _protocol(script, **bounds) -> tuple[MeasuringProtocol, list[tuple[str, int]]]:
    calls: list[tuple[str, int]] = []
    protocol = MeasuringProtocol("job", watch=ScriptedWatch(script), probe_fn=lambda: 0.015,
                                 bounds=QuietBounds(**bounds), describe=lambda v: {"v": v})
    return protocol, calls


def test_a_repeat_that_stays_busy_is_retaken_at_most_twice_then_flagged() -> None:
    busy = [activity(others_cores=1.0)] * 100
    protocol, calls = _protocol(busy)

    def measure(arm, repeat):
        calls.append((arm, repeat))
        return len(calls)

    outcomes = protocol.run(["a", "b"], 2, measure)
    # 3 attempts of repeat 0 (two retakes), then the job's budget (1 x 2 repeats) is spent
    assert calls == [("a", 0), ("b", 0)] * 3 + [("b", 1), ("a", 1)]
    assert [o.attempts for o in outcomes] == [3, 1]
    assert all(o.disturbed for o in outcomes)
    records = [r for o in outcomes for r in o.records]
    assert len(records[0]["discarded"]) == 2
    assert unstable_flag(records) == (
        "unstable: another process used 100% of a core during 2 of 2 repeats (our threads "
        "waited for a core up to 0% of the time)")


def test_a_repeat_flagged_by_the_probe_alone_is_not_blamed_on_another_process() -> None:
    """The probe slowed with nothing busy here (the host's other tenants): the flag says
    so, not "another process used 0% of a core"; one busy repeat among them names the
    process again."""
    quiet = [activity()] * 100
    probes = iter([0.010, 0.010] + [0.010, 0.030] * 50)  # the reference, then each repeat
    protocol = MeasuringProtocol("job", watch=ScriptedWatch(quiet), probe_fn=lambda: next(probes),
                                 bounds=QuietBounds(), describe=lambda v: {"v": v})
    outcomes = protocol.run(["a", "b"], 2, lambda arm, repeat: 1.0)
    records = [r for o in outcomes for r in o.records]
    assert all(o.disturbed and "reference probe" in o.disturbed for o in outcomes)
    flag = unstable_flag(records)
    assert flag.startswith("unstable: the reference probe ran slower during 2 of 2 repeats "
                           "while no other process here was busy"), flag
    assert "another process" not in flag
    mixed = [*records[:1], {**records[2], "disturbed": "a: other processes used 90% of a core"}]
    assert unstable_flag(mixed).startswith("unstable: another process used")


def test_a_neighbour_the_job_leaves_a_core_to_is_not_a_disturbance() -> None:
    beside = [activity(others_cores=1.0, neighbour_cores=1.0)] * 4
    protocol, _ = _protocol(beside)
    outcomes = protocol.run(["a", "b"], 2, lambda arm, repeat: 0.0)
    assert [o.attempts for o in outcomes] == [1, 1]
    assert unstable_flag([r for o in outcomes for r in o.records]) is None
    waited = [activity(wait_share=0.3, others_cores=1.1, neighbour_cores=1.0)]
    protocol, _ = _protocol(waited)
    (outcome,) = protocol.run(["a"], 1, lambda arm, repeat: 0.0)
    assert outcome.attempts == 2  # our working thread waited beside others: oversubscribed
    alone = [activity(wait_share=0.4)]  # our threads waiting for each other, nobody else
    protocol, _ = _protocol(alone)
    (outcome,) = protocol.run(["a"], 1, lambda arm, repeat: 0.0)
    assert outcome.attempts == 1


def test_a_probe_that_moves_during_a_repeat_retakes_it() -> None:
    probes = iter([0.010, 0.010, 0.010,  # the job's reference
                   0.010, 0.016,  # repeat 0: +60% between before and after
                   0.010, 0.010])  # its retake
    protocol = MeasuringProtocol("job", watch=ScriptedWatch(), probe_fn=lambda: next(probes))
    (outcome,) = protocol.run(["a"], 1, lambda arm, repeat: 1.0)
    assert outcome.attempts == 2 and outcome.disturbed is None
    assert "probe moved 60%" in outcome.records[0]["discarded"][0]["disturbed"]


def test_proc_accounting_tells_our_children_from_other_processes() -> None:
    """A busy child of ours is our CPU time; a busy process outside our tree is others'."""
    # each spins until it has had a second of CPU time, however busy the machine is
    spin = "import time\nwhile time.process_time() < 1.0: pass"
    watch = Watch(neighbour_cores=0.0)
    started = watch.start()
    subprocess.run([sys.executable, "-c", spin], check=True)
    ours = watch.stop(started)
    assert ours.own_cpu_s >= 0.9
    # an orphan: its parent (the shell) exits at once, so it is no longer in our tree
    orphan = spin.replace("1.0", "2.5")
    subprocess.run(["bash", "-c", f"(timeout 10 {sys.executable} -c '{orphan}' &)"], check=True)
    time.sleep(0.2)
    started = watch.start()
    time.sleep(1.0)
    theirs = watch.stop(started)
    assert theirs.others_cores >= 0.7 and theirs.own_cpu_s < 0.3
    assert theirs.disturbed(QuietBounds()) is not None


def test_a_measurement_too_short_for_procs_ticks_is_judged_with_its_whole_repeat() -> None:
    bounds = QuietBounds()
    # one 10 ms tick of another process over a 20 ms launch reads as half a core: no signal
    assert activity(others_cores=0.5, wall_s=0.02).disturbed(bounds) is None
    assert activity(wait_share=0.3, others_cores=0.5, wall_s=0.02).disturbed(bounds) is None
    # over a second the same shares are real
    assert activity(others_cores=0.5, wall_s=1.0).disturbed(bounds) is not None
    assert activity(wait_share=0.3, others_cores=0.5, wall_s=1.0).disturbed(bounds) is not None


def test_our_wait_is_the_working_threads_not_the_idle_ones() -> None:
    """Dozens of idle helper threads each waiting a few ms per wake-up slow nothing; the
    engine thread waiting a third of the time does."""
    from feather.measuring.quiet import busiest_wait_s

    start = {(1, t): (0.0, 0.0) for t in range(40)}
    idle = {(1, t): (0.001, 0.004) for t in range(1, 40)}
    assert busiest_wait_s(start, {(1, 0): (1.0, 0.0), **idle}, wall_s=1.0) == 0.0
    assert busiest_wait_s(start, {(1, 0): (0.66, 0.33), **idle}, wall_s=1.0) == 0.33


def test_the_workflows_own_jobs_are_its_setup_not_another_process() -> None:
    """A busy job of the workflow ($FEATHER_PIPELINE_PID's tree, not ours) is recorded apart
    and disturbs nothing; the same process outside the workflow is another process."""
    spin = "import time\nwhile time.process_time() < 2.5: pass"
    # the workflow stands apart from us, as Snakemake is from a job's own process tree: a
    # shell whose parent exits at once, with a busy child
    started_root = subprocess.run(
        ["bash", "-c",
         f"bash -c \"{sys.executable} -c '{spin}'; sleep 5\" >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, check=True)
    root = int(started_root.stdout.strip())
    time.sleep(0.3)
    watch = Watch(neighbour_cores=0.0, pipeline_root=root)
    started = watch.start()
    time.sleep(1.0)
    seen = watch.stop(started)
    assert seen.pipeline_cores >= 0.1  # its busy job ran (however busy this machine is)
    # the same window, the workflow not told apart: its busy job counts as another process
    blind = between(replace(started, pipeline={}), replace(watch.last, pipeline={}), 0.0)
    assert blind.others_cpu_s == pytest.approx(seen.others_cpu_s + seen.pipeline_cpu_s)


def test_the_probe_waits_for_our_own_busy_children_to_finish() -> None:
    """An online job's servers still busy after a repeat are our work, not the machine's:
    the probe waits for them (bounded), and an idle tree costs one short look."""
    watch = Watch(neighbour_cores=0.0)
    assert watch.settle_own() < 0.5
    spin = "import time\nwhile time.process_time() < 1.0: pass"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.2)
        waited = watch.settle_own(most_s=8.0)
        assert child.poll() is not None  # it waited until the child had finished
        assert 0.3 <= waited < 8.0
    finally:
        child.kill()
    busy = subprocess.Popen([sys.executable, "-c", spin.replace("1.0", "3.0")])
    try:
        time.sleep(0.2)
        assert watch.settle_own(most_s=0.3) < 0.6  # never longer than it is told
        assert busy.poll() is None
    finally:
        busy.kill()


def test_the_protocol_settles_before_each_probe() -> None:
    watch = ScriptedWatch()
    protocol = MeasuringProtocol("job", watch=watch, probe_fn=lambda: 0.015)
    protocol.run(["a", "b"], 2, lambda arm, repeat: 1.0)
    assert watch.settles == 2 * 2  # before and after each repeat's arms

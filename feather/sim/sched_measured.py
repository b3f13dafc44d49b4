"""Scheduling time priced at what the real code costs: fits of the overhead bench.

The overhead experiment (`feather/overhead/`) times, each in its own process, SGLang's real
`SchedulePolicy.calc_priority` and `Req.init_next_round_input` (0.5.23 over its Python and
its Rust tree, 0.5.10), vLLM's real `KVCacheManager.get_computed_blocks` and our CHT policy.
`feather.sim.sched_fit` fits each one, as a linear form below, to the bench's full sweep;
the coefficients are committed data (`data/sched_costs_measured.json`, with the bench's
provenance). A model prices one engine step's `StepWork` for a policy by the kind of work
its class declares (`SchedCostKind`, feather/policies/base.py), never by its name:

  engine, every policy - the prefix lookup of each request the engine considers admitting:
    vllm mode:   get_computed_blocks   lookups + hit blocks + prompt blocks
    sglang mode: init_next_round_input requests + prompt tokens + cached (hit) tokens
  the policy's own work, on top:
    radix-lpm, radix-dfs-weight (lpm, dfs-weight): SGLang's calc_priority of the model's
      release, once in each step in which SGLang calls it (`work.policy_pass`, with
      requests waiting):
        1 + W waiting + T tokens of the waiting requests + N nodes of the tree
      radix-lpm with more than 128 waiting: SGLang's FCFS fallback (1 + W), no matching
    cht (every Feather policy): the CHT policy's ADD/STOP decision (decisions,
      decisions x log2(1 + W), chunks of the candidates) and the CHT insertion per arriving
      request (1 + chunks): in vllm mode from vLLM's own block hashes
      (`feather:arrival-hashes`; vLLM hashes every request whatever the scheduler, and
      Feather reuses those hashes), in sglang mode from the tokens, hashing them
      (`feather:arrival`)
    fifo (fcfs): nothing more
    plan (batches): nothing more, and named in the run's `sched_model_fallback_for` (no real
      engine runs a fixed plan, so none was measured)

Every price is in seconds of thread CPU time measured on the bench's host (a 2-core VM:
see `host` in the data); a server CPU pays less.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from feather.engine_limits import ENGINE_MODES
from feather.policies.base import SchedCostKind, declared_cost_kind, policy_label

if TYPE_CHECKING:
    from feather.policies.base import AdmissionPolicy
    from feather.sim.sched_cost import StepWork

MEASURED_DATA = Path(__file__).with_name("data") / "sched_costs_measured.json"
FORMAT = "feather-sched-costs-measured/1"
LPM_FALLBACK_ABOVE = 128  # SGLang's WAITING_QUEUE_PREFIX_MATCH_MAX (0.5.10 and 0.5.23)

# Each fitted component: its features, in the order of its coefficients.
FORMS: dict[str, tuple[str, ...]] = {
    "lookup": ("per_lookup_s", "per_hit_block_s", "per_block_s"),
    "match": ("per_request_s", "per_request_token_s", "per_hit_token_s"),
    "pass": ("per_pass_s", "per_waiting_s", "per_waiting_token_s", "per_tree_node_s"),
    "fallback": ("per_pass_s", "per_waiting_s"),
    "decision": ("per_decision_s", "per_decision_log2_waiting_s", "per_candidate_chunk_s"),
    "arrival": ("per_arrival_s", "per_arrival_chunk_s"),
}
# Component key in the data -> its form. SGLang's components are keyed "<release>:<name>".
COMPONENT_FORMS = {
    "vllm:lookup": "lookup",
    "feather:decision": "decision",
    "feather:arrival": "arrival",
    "feather:arrival-hashes": "arrival",
    "match": "match",
    "lpm": "pass",
    "lpm-fallback": "fallback",
    "dfs-weight": "pass",
}
RELEASES = ("sglang-0.5.23-rust", "sglang-0.5.23-python", "sglang-0.5.10")
# `port`: our ports' own CPU time (sched_cost); `none`: scheduling is free (C5 without the
# baselines' scheduling cost: what the order alone gives)
COST_MODELS = (*RELEASES, "port", "none")
# The model the paper's comparison needs (README, "What scheduling costs"): of the releases
# measured, only 0.5.10's calc_priority reaches the paper's C3 band (50-90% of step latency)
# for both lpm and dfs-weight; 0.5.23's lpm stays under ~23% (a faster tree, and its FCFS
# fallback above 128 waiting). `sglang-0.5.23-rust` prices today's server default.
DEFAULT_COST_MODEL = "sglang-0.5.10"
DEFAULT_REASON = "the release whose measured lpm and dfs-weight reproduce the paper's C3"


def form_of(component: str) -> str:
    """The form of a component key ("vllm:lookup", "sglang-0.5.10:dfs-weight", ...)."""
    release, _, name = component.partition(":")
    return COMPONENT_FORMS[name if release in RELEASES else component]


@dataclass(frozen=True)
class Linear:
    """A fitted linear price: sum of coefficient x feature value."""

    coefficients: dict[str, float]

    def __call__(self, values: dict[str, float]) -> float:
        return sum(c * values[name] for name, c in self.coefficients.items())


def step_features(form: str, work: StepWork, block_size: int) -> dict[str, float]:
    """A step's feature values for one form (what the bench's rows map to in `sched_fit`)."""
    if form == "lookup":
        return {
            "per_lookup_s": work.candidates,
            "per_hit_block_s": work.candidate_hit_tokens / block_size,
            "per_block_s": work.candidate_tokens / block_size,
        }
    if form == "match":
        return {
            "per_request_s": work.candidates,
            "per_request_token_s": work.candidate_tokens,
            "per_hit_token_s": work.candidate_hit_tokens,
        }
    if form in ("pass", "fallback"):
        values = {"per_pass_s": 1.0, "per_waiting_s": work.waiting}
        if form == "pass":
            values |= {"per_waiting_token_s": work.waiting_tokens,
                       "per_tree_node_s": work.tree_nodes}
        return values
    if form == "decision":
        decisions = work.decisions
        return {
            "per_decision_s": decisions,
            "per_decision_log2_waiting_s": decisions * math.log2(1 + work.waiting),
            "per_candidate_chunk_s": work.candidate_tokens / block_size,
        }
    if form == "arrival":
        return {"per_arrival_s": work.arrivals,
                "per_arrival_chunk_s": work.arrival_tokens / block_size}
    raise ValueError(f"unknown cost form {form!r}; known: {', '.join(FORMS)}")


class MeasuredCostModel:
    """Callable (policy class, StepWork) -> seconds for one SGLang release and engine mode."""

    def __init__(self, name: str, data: dict[str, Any], mode: str, block_size: int) -> None:
        if data.get("format") != FORMAT:
            raise ValueError(f"scheduling-cost data of format {data.get('format')!r}, "
                             f"expected {FORMAT!r}")
        if name not in data["models"]:
            raise ValueError(f"no measured scheduling-cost model {name!r} in the data; "
                             f"it has {', '.join(data['models'])}")
        if mode not in ENGINE_MODES:
            raise ValueError(f"engine mode must be vllm or sglang, got {mode!r}")
        release = data["models"][name]["release"]
        parts = data["components"]
        self.name, self.mode, self.block_size = name, mode, block_size
        self.uncalibrated: set[str] = set()

        def linear(key: str) -> Linear:
            return Linear(dict(parts[key]["coefficients"]))

        self.base = linear("vllm:lookup") if mode == "vllm" else linear(f"{release}:match")
        self.base_form = "lookup" if mode == "vllm" else "match"
        self.lpm, self.lpm_fallback = linear(f"{release}:lpm"), linear(f"{release}:lpm-fallback")
        self.dfs_weight = linear(f"{release}:dfs-weight")
        self.decision, self.arrival = linear("feather:decision"), linear("feather:arrival")
        if mode == "vllm" and "feather:arrival-hashes" in parts:
            self.arrival = linear("feather:arrival-hashes")
        self.source = {
            "name": name,
            "release": release,
            "engine_mode": mode,
            "engine_base": ("vLLM get_computed_blocks per candidate" if mode == "vllm"
                            else f"{release} Req.init_next_round_input per candidate"),
            "data": str(MEASURED_DATA.name),
            "bench": data["bench"],
            "host_note": data["host_note"],
        }

    def __call__(self, policy: type[AdmissionPolicy], work: StepWork) -> float:
        bs = self.block_size
        kind = declared_cost_kind(policy)
        seconds = self.base(step_features(self.base_form, work, bs))
        if kind in (SchedCostKind.RADIX_LPM, SchedCostKind.RADIX_DFS_WEIGHT):
            if work.policy_pass and work.waiting > 0:
                if kind is SchedCostKind.RADIX_DFS_WEIGHT:
                    seconds += self.dfs_weight(step_features("pass", work, bs))
                elif work.waiting > LPM_FALLBACK_ABOVE:
                    seconds += self.lpm_fallback(step_features("fallback", work, bs))
                else:
                    seconds += self.lpm(step_features("pass", work, bs))
        elif kind is SchedCostKind.CHT:
            seconds += self.decision(step_features("decision", work, bs))
            seconds += self.arrival(step_features("arrival", work, bs))
        elif kind is SchedCostKind.PLAN:
            self.uncalibrated.add(policy_label(policy))  # the engine's lookups only
        return seconds


def load_measured(path: Path = MEASURED_DATA) -> dict[str, Any]:
    return json.loads(Path(path).read_text())

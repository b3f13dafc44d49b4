"""Turn prompt groups into a workload: tokens, truncation, selection, order, arrivals.

Every choice is an option with a default and is recorded in the workload's provenance;
every request dropped is counted by reason, never silently.
"""

from __future__ import annotations

import math
import random
import re
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

from feather.models import get_model
from feather.workloads.schema import (
    WorkloadError,
    WorkloadRequest,
    measure_prefix_lens,
)
from feather.workloads.sources.base import PromptGroup, SourceData
from feather.workloads.tokenizer import Tokenizer

Order = Literal["grouped", "shuffled", "interleaved"]
NONCE_TOKENS = 8  # tokens that make an "unshared" request share nothing with any other


@dataclass(frozen=True)
class BuildOptions:
    """How requests are chosen and shaped (defaults: the paper's 1K-10K-token prefixes).

    model / max_context: the context the prompt plus its output must fit (max_context wins).
    overlength: "truncate" (the benchmark's own rule) or "reject" (drop the request).
    min/max_prefix_tokens: keep groups whose document prefix (BOS, template head and the
        document, after truncation) has this many tokens.
    min/max_per_group: drop groups with fewer requests; keep at most this many of each.
    max_groups: keep at most this many of the groups that qualify (a seeded choice, kept in
        the source's order): small slices for CPU engines.
    output: "reference" (the reference answer's token count, at most the benchmark's own
        generation limit or output_cap if smaller) or a fixed number of tokens.
    arrival: "all" (time 0), "poisson:RATE" (requests/s) or "bursts:SIZE:INTERVAL_S".
    order: "grouped", "shuffled" or "interleaved" (round-robin over groups).
    unshared_fraction: this fraction of requests gets 8 random tokens after BOS, so it
        shares no chunk with any other request (claim C6).
    add_bos: start every prompt with the tokenizer's BOS token, as engines do.
    """

    model: str = "llama-3.1-8b"
    max_context: int | None = None
    overlength: Literal["truncate", "reject"] = "truncate"
    min_prefix_tokens: int = 1_000
    max_prefix_tokens: int = 10_000
    min_per_group: int = 1
    max_per_group: int | None = None
    max_groups: int | None = None
    output: str = "reference"
    output_cap: int | None = None
    arrival: str = "all"
    order: Order = "grouped"
    unshared_fraction: float = 0.0
    add_bos: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.overlength not in ("truncate", "reject"):
            raise WorkloadError(f"overlength must be truncate or reject, got {self.overlength!r}")
        if self.order not in ("grouped", "shuffled", "interleaved"):
            raise WorkloadError(
                f"order must be grouped, shuffled or interleaved, got {self.order!r}"
            )
        if not 0.0 <= self.unshared_fraction <= 1.0:
            raise WorkloadError(
                f"unshared_fraction must be in [0, 1], got {self.unshared_fraction}"
            )
        if self.min_prefix_tokens > self.max_prefix_tokens:
            raise WorkloadError("min_prefix_tokens is larger than max_prefix_tokens")
        if self.min_per_group < 1 or (self.max_per_group is not None and self.max_per_group < 1):
            raise WorkloadError("min_per_group and max_per_group must be >= 1")
        if self.max_groups is not None and self.max_groups < 1:
            raise WorkloadError(f"max_groups must be >= 1, got {self.max_groups}")
        fixed_output(self.output)  # validates
        arrival_times(self.arrival, 0, random.Random(0))  # validates

    @property
    def context_tokens(self) -> int:
        return (
            self.max_context
            if self.max_context is not None
            else get_model(self.model).context_tokens
        )

    def to_json(self) -> dict:
        return asdict(self)


def fixed_output(output: str) -> int | None:
    """None for "reference", else the fixed output length."""
    if output == "reference":
        return None
    if re.fullmatch(r"[1-9][0-9]*", str(output)):
        return int(output)
    raise WorkloadError(f"output must be 'reference' or a positive integer, got {output!r}")


def arrival_times(spec: str, n: int, rng: random.Random) -> list[float]:
    """Arrival times (s) of n requests in order, by an arrival spec."""
    if spec == "all":
        return [0.0] * n
    parts = spec.split(":") if isinstance(spec, str) else [""]
    try:
        if parts[0] == "poisson" and len(parts) == 2 and 0 < float(parts[1]) < math.inf:
            rate, t, out = float(parts[1]), 0.0, []
            for i in range(n):
                if i:
                    t += rng.expovariate(rate)
                out.append(t)
            return out
        if (
            parts[0] == "bursts"
            and len(parts) == 3
            and int(parts[1]) >= 1
            and 0 <= float(parts[2]) < math.inf
        ):
            size, interval = int(parts[1]), float(parts[2])
            return [(i // size) * interval for i in range(n)]
    except ValueError:
        pass
    raise WorkloadError(
        f"arrival must be 'all', 'poisson:RATE' or 'bursts:SIZE:INTERVAL_S', got {spec!r}"
    )


def _tokenize_groups(
    groups: list[PromptGroup], tokenizer: Tokenizer, progress: Callable[[str], None]
) -> dict[str, list[int]]:
    """Every distinct segment text, tokenized once (tasks in order, with progress)."""
    cache: dict[str, list[int]] = {"": []}
    by_task: dict[str, list[PromptGroup]] = {}
    for g in groups:
        by_task.setdefault(f"{g.source}/{g.task}", []).append(g)
    for name, task_groups in by_task.items():
        texts = {g.head for g in task_groups} | {g.wrap_pre for g in task_groups}
        texts |= {g.wrap_post for g in task_groups} | {g.document for g in task_groups}
        for g in task_groups:
            texts.update(g.tails)
            texts.update(g.references)
        todo = sorted(t for t in texts if t not in cache)
        questions = sum(len(g.tails) for g in task_groups)
        progress(f"tokenizing {name}: {len(task_groups)} documents, {questions} requests")
        for text, ids in zip(todo, tokenizer.encode_many(todo), strict=True):
            cache[text] = ids
    return cache


@dataclass
class _Shaped:
    keep: list[int]  # indices of the group's requests that fit
    prompts: list[list[int]]
    doc_prefix: int  # tokens of BOS + chat prefix + head + document kept
    truncated: int
    overlength: int


def _shape(
    group: PromptGroup,
    parts: dict[str, list[int]],
    tails: list[list[int]],
    bos: list[int],
    budgets: list[int],
    overlength: str,
) -> _Shaped:
    """Each request's tokens within its budget, by the benchmark's own rule or by rejection."""
    pre, head, doc, post = (parts[k] for k in ("wrap_pre", "head", "document", "wrap_post"))
    lead = len(bos) + len(pre)
    full_prefix = lead + len(head) + len(doc)
    fits = [full_prefix + len(t) + len(post) <= b for t, b in zip(tails, budgets, strict=True)]
    whole = [bos + pre + head + doc + t + post for t in tails]
    if all(fits):
        return _Shaped(list(range(len(tails))), whole, full_prefix, 0, 0)
    if overlength == "reject":
        keep = [i for i, ok in enumerate(fits) if ok]
        return _Shaped(keep, [whole[i] for i in keep], full_prefix, 0, len(tails) - len(keep))
    if group.truncation == "document":  # L-Eval: cut the document, once for the whole group
        room = min(
            b - lead - len(post) - len(head) - len(t) for b, t in zip(budgets, tails, strict=True)
        )
        if room <= 0:
            return _Shaped([], [], 0, 0, len(tails))
        kept = doc[:room]
        prompts = [bos + pre + head + kept + t + post for t in tails]
        return _Shaped(
            list(range(len(tails))), prompts, lead + len(head) + len(kept), len(tails), 0
        )
    keep, prompts, prefixes, truncated = [], [], [], 0  # LongBench: cut the prompt's middle
    for i, (tail, budget) in enumerate(zip(tails, budgets, strict=True)):
        if fits[i]:
            keep.append(i)
            prompts.append(whole[i])
            prefixes.append(len(head) + len(doc))
            continue
        room = budget - lead - len(post)
        if room < 2:
            continue
        half = room // 2
        body = head + doc + tail
        keep.append(i)
        prompts.append(bos + pre + body[:half] + body[-half:] + post)
        prefixes.append(min(half, len(head) + len(doc)))
        truncated += 1
    return _Shaped(
        keep, prompts, lead + min(prefixes, default=0), truncated, len(tails) - len(keep)
    )


def build_workload(
    source: SourceData,
    tokenizer: Tokenizer,
    options: BuildOptions,
    *,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[WorkloadRequest], dict]:
    """The workload's requests (in arrival order) and what was dropped, by reason."""
    say = progress or (lambda message: None)
    tokens = _tokenize_groups(source.groups, tokenizer, say)
    bos_id = tokenizer.identity.bos_id
    bos = [bos_id] if options.add_bos and bos_id is not None else []
    context = options.context_tokens
    fixed = fixed_output(options.output)
    dropped = dict(source.dropped)
    for reason in (
        "overlength",
        "prefix_out_of_range",
        "too_few_requests",
        "over_max_per_group",
        "over_max_groups",
    ):
        dropped.setdefault(reason, 0)
    truncated = 0
    kept_groups: list[list[WorkloadRequest]] = []
    for group in source.groups:
        cap = min(group.max_output_tokens, options.output_cap or group.max_output_tokens)
        outputs = [
            fixed if fixed is not None else max(1, min(cap, len(tokens[ref])))
            for ref in group.references
        ]
        parts = {
            k: tokens[getattr(group, k)] for k in ("wrap_pre", "head", "document", "wrap_post")
        }
        tails = [tokens[t] for t in group.tails]
        shaped = _shape(
            group, parts, tails, bos, [context - o for o in outputs], options.overlength
        )
        dropped["overlength"] += shaped.overlength
        if not shaped.keep:
            continue
        if not options.min_prefix_tokens <= shaped.doc_prefix <= options.max_prefix_tokens:
            dropped["prefix_out_of_range"] += len(shaped.keep)
            continue
        if len(shaped.keep) < options.min_per_group:
            dropped["too_few_requests"] += len(shaped.keep)
            continue
        keep, prompts = shaped.keep, shaped.prompts
        if options.max_per_group is not None and len(keep) > options.max_per_group:
            dropped["over_max_per_group"] += len(keep) - options.max_per_group
            keep, prompts = keep[: options.max_per_group], prompts[: options.max_per_group]
        truncated += min(shaped.truncated, len(keep))
        task_id = f"{group.source}/{group.task}"
        kept_groups.append(
            [
                WorkloadRequest(
                    request_id=f"{task_id}/{group.doc_key}/{i}",
                    source=group.source,
                    task=group.task,
                    group_path=[task_id, f"{task_id}/{group.doc_key}"],
                    prefix_lens=[0, 0],
                    prompt_token_ids=np.asarray(prompt, dtype=np.int32),
                    output_len=outputs[i],
                )
                for i, prompt in zip(keep, prompts, strict=True)
            ]
        )
    if not kept_groups:
        raise WorkloadError(f"no request survived the selection (dropped: {dropped})")
    if options.max_groups is not None and len(kept_groups) > options.max_groups:
        rng = random.Random(f"{options.seed}:groups")
        chosen = set(rng.sample(range(len(kept_groups)), options.max_groups))
        dropped["over_max_groups"] += sum(
            len(g) for i, g in enumerate(kept_groups) if i not in chosen
        )
        kept_groups = [g for i, g in enumerate(kept_groups) if i in chosen]
    requests = order_requests(kept_groups, options)
    make_unshared(requests, options, tokenizer.identity.vocab_size, len(bos))
    measure_prefix_lens(requests)
    times = arrival_times(options.arrival, len(requests), random.Random(f"{options.seed}:arrival"))
    for request, t in zip(requests, times, strict=True):
        request.arrival_time_s = t
    return requests, {"dropped": dropped, "truncated_requests": truncated}


def order_requests(
    groups: list[list[WorkloadRequest]], options: BuildOptions
) -> list[WorkloadRequest]:
    if options.order == "grouped":
        return [r for g in groups for r in g]
    if options.order == "interleaved":
        longest = max((len(g) for g in groups), default=0)
        return [g[i] for i in range(longest) for g in groups if i < len(g)]
    flat = [r for g in groups for r in g]
    random.Random(f"{options.seed}:order").shuffle(flat)
    return flat


def make_unshared(
    requests: list[WorkloadRequest], options: BuildOptions, vocab: int, after: int
) -> None:
    """Give a seeded fraction of requests a unique token run right after BOS."""
    count = round(options.unshared_fraction * len(requests))
    if not count:
        return
    rng = random.Random(f"{options.seed}:unshared")
    for r in rng.sample(requests, count):
        nonce = np.array([rng.randrange(3, vocab) for _ in range(NONCE_TOKENS)], dtype=np.int32)
        ids = r.prompt_token_ids
        r.prompt_token_ids = np.concatenate([ids[:after], nonce, ids[after:]])
        r.group_path = [f"unshared/{r.request_id}"] * len(r.group_path)


def stderr_progress(message: str) -> None:
    print(f"[workload] {message}", file=sys.stderr, flush=True)

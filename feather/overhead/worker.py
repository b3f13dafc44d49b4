"""One implementation in its own process, answering the harness over JSON lines.

    python -m feather.overhead.worker feather|vllm|sglang [--tree python|unified]

Requests on stdin, one JSON object per line; one answer per request on the stdout it was
started with (the process's own prints go to stderr, so a library's chatter cannot corrupt
the protocol):

    {"op": "facts"}                          -> {"facts": {...}, "variants": [...]}
    {"op": "prepare", "case": {...}}         -> {"matches": [...], "arrival_s_per_request": x}
    {"op": "measure", "variant": "lpm"}      -> {"seconds": x, "decisions": n, "admitted": n}
    {"op": "release"}                        -> {}
    {"op": "order", ...}                     -> SGLang only: see `sglang_order`
    {"op": "exit"}

Errors come back as {"error": "..."}; the harness raises them with the implementation's name.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import traceback
from dataclasses import asdict
from typing import Any

from feather.overhead.base import Implementation
from feather.overhead.scenario import Case


def make_implementation(family: str, tree: str, page_size: int) -> Implementation:
    if family == "feather":
        from feather.overhead.feather_cht import FeatherCHT

        return FeatherCHT()
    if family == "vllm":
        from feather.overhead.vllm_fcfs import VLLMFCFS

        return VLLMFCFS()
    if family == "sglang":
        from feather.overhead.sglang_policies import SGLangPolicies

        return SGLangPolicies(tree=tree, page_size=page_size)
    raise ValueError(f"unknown implementation family {family!r}; known: feather, vllm, sglang")


def sglang_order(impl: Any, message: dict[str, Any]) -> dict[str, Any]:
    """SGLang's real calc_priority on a given cache and queue: the order it sorts the queue
    into (indices into `waiting`) and each request's matched length. For checking our ports."""
    api = impl.api
    tree = api.make_tree(message.get("tree", "python"), int(message.get("page_size", 1)))
    for tokens in message["cached"]:
        api.cache_prefix(tree, tokens)
    queue = [api.make_request(str(i), tokens) for i, tokens in enumerate(message["waiting"])]
    policy = api.make_policy(message["policy"], tree, fcfs_fallback=message.get("fallback", True))
    policy.calc_priority(queue)
    matches = [0] * len(queue)
    for req in queue:
        matches[int(req.rid)] = api.matched_tokens(req)
    return {"order": [int(req.rid) for req in queue], "matches": matches}


def handle(impl: Implementation, message: dict[str, Any]) -> dict[str, Any]:
    op = message.get("op")
    if op == "facts":
        return {"facts": impl.facts(), "variants": impl.variants()}
    if op == "prepare":
        return asdict(impl.prepare(Case.from_json(message["case"])))
    if op == "measure":
        return asdict(impl.measure(message["variant"]))
    if op == "release":
        impl.release()
        return {}
    if op == "order" and impl.family == "sglang":
        return sglang_order(impl, message)
    raise ValueError(f"unknown op {op!r} for a {impl.family} worker")


def serve(impl: Implementation, requests: Any, answers: Any) -> None:
    for line in requests:
        message = json.loads(line)
        if message.get("op") == "exit":
            return
        try:
            answer = handle(impl, message)
        except Exception as exc:  # the harness reports it with the implementation's name
            answer = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=["feather", "vllm", "sglang"])
    parser.add_argument("--tree", default="python", help="SGLang's radix tree: python|unified")
    parser.add_argument("--page-size", type=int, default=1, help="SGLang's page size")
    args = parser.parse_args(argv)
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # library prints go to stderr
    sys.stdout = sys.stderr
    try:
        impl = make_implementation(args.family, args.tree, args.page_size)
    except Exception as exc:
        answers.write(json.dumps({"error": f"{type(exc).__name__}: {exc}",
                                  "traceback": traceback.format_exc()}) + "\n")
        answers.flush()
        return 1
    # The imports (torch, SGLang, vLLM: millions of objects) never become garbage: freeze them
    # so the full collection before each timed batch (base.cpu_time) walks only what the
    # cases build - the state it is meant to settle - not the whole interpreter each time.
    gc.collect()
    gc.freeze()
    answers.write(json.dumps({"ready": True}) + "\n")
    answers.flush()
    serve(impl, sys.stdin, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main())

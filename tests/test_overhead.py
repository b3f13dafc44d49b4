"""The scheduling-overhead experiment (C3, C4): every implementation agrees on what it
computes before it is timed; our SGLang ports order queues exactly as SGLang's real
calc_priority; the environment builder skips cleanly; the report's arithmetic.

SGLang's real code runs in its own environment, built here on first use (about two minutes)
exactly as the pipeline builds it. These tests never skip: without the environment they fail.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feather.models import get_model
from feather.overhead import report
from feather.overhead.envs import (
    SHARED_DIR,
    STATUS_FILE,
    build_env,
    lock_file,
    lock_pins,
    read_status,
    shareable,
)
from feather.overhead.harness import AgreementError, Harness, ImplSpec, Worker
from feather.overhead.scenario import (
    Case,
    expected_matches,
    group_prefixes,
    head_hit_tokens,
    waiting_requests,
)
from feather.policies.base import Request, StepContext
from feather.policies.dfs_weight import DFSWeightPolicy
from feather.policies.lpm import LPMPolicy
from feather.sim.hardware import get_hardware

REPO = Path(__file__).resolve().parents[1]
SGLANG = "sglang-0.5.23"


@pytest.fixture(scope="module")
def sglang_python() -> str:
    envs = Path(os.environ.get("FEATHER_ENVS_DIR", REPO / ".envs"))
    status = build_env(SGLANG, envs / SGLANG, progress=print)
    if not status.ok:
        pytest.fail(f"SGLang's environment could not be built: {status.reason}")
    return str(status.python)


# ---- the scenario ----------------------------------------------------------------------------


def test_scenario_groups_share_exactly_their_prefix() -> None:
    case = Case(waiting=12, prefix_tokens=32, groups=3, batch=4, page=16, suffix_tokens=5)
    prompts = waiting_requests(case)
    for i, a in enumerate(prompts):
        for j, b in enumerate(prompts[:i]):
            common = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), 0)
            assert common == (32 if i % 3 == j % 3 else 0), (i, j)
    assert expected_matches(case) == [32] * 12


def test_cold_groups_share_nothing_with_the_cache() -> None:
    case = Case(waiting=12, prefix_tokens=32, groups=3, batch=5, page=16, uncached_groups=1)
    assert case.cached_groups == 2
    assert expected_matches(case) == [32, 32, 0] * 4
    assert head_hit_tokens(case) == 32 * 4  # the first 5 in arrival order: groups 0 1 2 0 1
    with pytest.raises(ValueError, match="uncached_groups"):
        Case(waiting=4, prefix_tokens=16, groups=2, batch=2, uncached_groups=3)


def test_case_rejects_prefixes_the_implementations_cannot_agree_on() -> None:
    with pytest.raises(ValueError, match="multiple of page"):
        Case(waiting=4, prefix_tokens=100, groups=2, batch=2, page=16)
    with pytest.raises(ValueError, match="groups"):
        Case(waiting=2, prefix_tokens=16, groups=3, batch=2)


# ---- all implementations on the same requests -------------------------------------------------


@pytest.fixture(scope="module")
def harness(sglang_python: str):
    specs = [
        ImplSpec("feather"),
        ImplSpec("vllm"),
        ImplSpec("sglang", python=sglang_python, tree="python", env_name=SGLANG),
        ImplSpec("sglang", python=sglang_python, tree="unified", env_name=SGLANG),
    ]
    with Harness(specs) as h:
        yield h


@pytest.mark.parametrize(
    "case",
    [
        Case(waiting=40, prefix_tokens=256, groups=4, batch=8, page=16),
        Case(waiting=150, prefix_tokens=64, groups=5, batch=32, page=32, suffix_tokens=40),
        Case(waiting=9, prefix_tokens=128, groups=1, batch=16, page=64, suffix_tokens=3),
        Case(waiting=30, prefix_tokens=128, groups=3, batch=8, page=16, uncached_groups=2),
    ],
    ids=lambda c: c.key,
)
def test_every_implementation_agrees_then_is_timed(harness: Harness, case: Case) -> None:
    rows = harness.run_case(case, repeats=2)
    seen = {(r["engine"], r["structure"], r["variant"]) for r in rows}
    # cht, policy; fcfs; lpm, lpm-nofallback, dfs-weight, match on each of 2 SGLang trees
    assert len(seen) == len(rows) == 2 + 1 + 4 + 4
    for row in rows:
        assert row["agreed"] and row["repeats"] == 2 and row["batch_s"] > 0
        if row["variant"] == "cht":  # one admission per decision, up to the batch size
            assert row["decisions"] == row["admitted"] == min(case.batch, case.waiting)
        if row["engine"] == "sglang":  # a pass over the queue forms the batch
            assert row["decisions"] == min(case.batch, case.waiting)
            assert row["engine_version"] == "0.5.23"


def test_disagreement_names_the_implementation_and_request(harness: Harness) -> None:
    case = Case(waiting=3, prefix_tokens=16, groups=1, batch=2)
    with pytest.raises(AgreementError, match=r"sglang-x finds a 0-token .* request 1 "):
        harness.check_agreement(case, {"sglang-x": [16, 0, 16]})
    with pytest.raises(AgreementError, match="answered for 2"):
        harness.check_agreement(case, {"vllm": [16, 16]})


# ---- our ports against SGLang's real calc_priority --------------------------------------------


@pytest.fixture(scope="module")
def sglang_worker(sglang_python: str, tmp_path_factory: pytest.TempPathFactory):
    link = tmp_path_factory.mktemp("pkg")
    (link / "feather").symlink_to(REPO / "feather")
    worker = Worker(ImplSpec("sglang", python=sglang_python, env_name=SGLANG), link)
    worker.handshake()
    yield worker
    worker.close()


def _our_order(policy_cls: type, cached: list[list[int]], waiting: list[list[int]]) -> list[int]:
    policy = policy_cls(page_size=1)
    for tokens in cached:
        policy.tree_cache.insert(tuple(tokens))
    for i, tokens in enumerate(waiting):
        policy.add_request(Request(req_id=i, prompt_token_ids=tokens))
    policy.begin_step(StepContext(num_running=0, max_running=len(waiting)))
    order = []
    while (req_id := policy.next_candidate()) is not None:
        policy.admitted(req_id)
        order.append(req_id)
    return order


def _prompts(draw: st.DrawFn, stems: list[list[int]], n: int) -> list[list[int]]:
    """Prompts that branch off a few stems at random depths, over a tiny vocabulary (so
    accidental matches and ties are common) - nested prefix groups, as in real workloads."""
    prompts = []
    for _ in range(n):
        stem = draw(st.sampled_from(stems))
        # whole stems often: long shared runs trigger SGLang's in-batch deprioritization
        cut = draw(st.one_of(st.just(len(stem)), st.integers(0, len(stem))))
        tail = draw(st.lists(st.integers(0, 3), min_size=1, max_size=40))
        prompts.append(stem[:cut] + tail)
    return prompts


@st.composite
def cache_and_queue(draw: st.DrawFn, max_waiting: int = 40) -> tuple[list, list]:
    stems = draw(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=80),
                          min_size=1, max_size=4))
    stems = [stem * (1 + 40 // len(stem)) for stem in stems]  # 40+ tokens: past the 32s
    cached = _prompts(draw, stems, draw(st.integers(0, 6)))
    waiting = _prompts(draw, stems, draw(st.integers(1, max_waiting)))
    return cached, waiting


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=cache_and_queue())
@pytest.mark.parametrize("tree", ["python", "unified"])
@pytest.mark.parametrize("policy,cls", [("lpm", LPMPolicy), ("dfs-weight", DFSWeightPolicy)])
def test_our_ports_order_queues_as_sglang(sglang_worker: Worker, policy: str, cls: type,
                                          tree: str, data: tuple[list, list]) -> None:
    """On both of SGLang's trees (the Python RadixCache and the Rust server default)."""
    cached, waiting = data
    real = sglang_worker.call({"op": "order", "policy": policy, "cached": cached,
                               "waiting": waiting, "tree": tree})
    assert _our_order(cls, cached, waiting) == real["order"]


def test_lpm_falls_back_to_fcfs_above_128_in_both(sglang_worker: Worker) -> None:
    waiting = [[i % 7, 1, 2] + [i] * (i % 5) for i in range(130)]
    cached = [[3, 1, 2, 9]]
    real = sglang_worker.call({"op": "order", "policy": "lpm", "cached": cached,
                               "waiting": waiting})
    assert real["order"] == list(range(130)) == _our_order(LPMPolicy, cached, waiting)
    matched = sglang_worker.call({"op": "order", "policy": "lpm", "cached": cached,
                                  "waiting": waiting, "fallback": False})
    assert matched["order"] != list(range(130))  # without the fallback it does sort
    assert matched["order"] == sorted(range(130), key=lambda i: -matched["matches"][i])


# ---- the environment builder ------------------------------------------------------------------


def test_env_builder_skips_with_the_reason_and_leaves_no_half_built_env(tmp_path: Path) -> None:
    lock = tmp_path / "broken.txt"
    lock.write_text("feather-no-such-package-anywhere==0.0.1\n")
    dest = tmp_path / "envs" / "broken"
    status = build_env("broken", dest, lock=lock)
    assert not status.ok and status.status == "skipped"
    assert "pip install failed" in status.reason
    assert "feather-no-such-package-anywhere" in status.reason
    assert sorted(p.name for p in dest.iterdir()) == ["build.log", STATUS_FILE]
    assert read_status(dest)["status"] == "skipped"


def _recorded_as_built(tmp_path: Path, lock_text: str) -> tuple[Path, Path]:
    """A lock and an environment whose status record says it was built from that lock."""
    import hashlib

    lock = tmp_path / "lock.txt"
    lock.write_text(lock_text)
    dest = tmp_path / "env"
    (dest / "bin").mkdir(parents=True)
    (dest / "bin" / "python").write_text("")
    record = {"status": "ok", "lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest(),
              "sglang": "9.9", "trees": ["python"]}
    (dest / STATUS_FILE).write_text(json.dumps(record))
    return lock, dest


def test_env_builder_reuses_a_built_env_with_the_same_lock(tmp_path: Path) -> None:
    lock, dest = _recorded_as_built(tmp_path, "x==1\n")
    status = build_env("fake", dest, lock=lock)
    assert status.ok and status.version == "9.9" and status.trees == ("python",)
    lock.write_text("x==2\n")  # a changed lock rebuilds (and fails here: x==2 is no package)
    assert not build_env("fake", dest, lock=lock).ok


def test_sglang_env_links_our_torch_instead_of_a_second_copy(sglang_python: str) -> None:
    """torch and Triton (~1.75 GB) are the builds our environment holds: linked, not copied;
    SGLang's interpreter imports exactly our torch and reports the pinned version."""
    import subprocess

    import torch

    env = Path(sglang_python).parents[1]
    pins = lock_pins(lock_file(SGLANG))
    assert read_status(env)["shared"] == {"torch": pins["torch"], "triton": pins["triton"]}
    links = sorted(p.name for p in (env / SHARED_DIR).iterdir())
    assert "torch" in links and "triton" in links
    assert all((env / SHARED_DIR / name).is_symlink() for name in links)
    probe = ("import torch, importlib.metadata as m, os; "
             "print(os.path.realpath(torch.__file__), m.version('torch'))")
    out = subprocess.run([sglang_python, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [os.path.realpath(torch.__file__), pins["torch"]]


def test_only_an_exactly_pinned_version_is_shared(tmp_path: Path) -> None:
    import torch

    lock = tmp_path / "lock.txt"
    lock.write_text(f"# comment\nTorch=={torch.__version__}\ntriton==0.0.1\nsglang>=1\n")
    assert lock_pins(lock) == {"torch": torch.__version__, "triton": "0.0.1"}
    assert sorted(shareable(lock)) == ["torch"]  # Triton's pin is not the version we hold
    lock.write_text("torch==0.0.1\n")
    assert shareable(lock) == {}


def test_a_reused_env_whose_shared_links_broke_is_rebuilt(tmp_path: Path) -> None:
    lock, dest = _recorded_as_built(tmp_path, "feather-no-such-package-anywhere==0.0.1\n")
    (dest / SHARED_DIR).mkdir()
    (dest / SHARED_DIR / "torch").symlink_to(tmp_path / "gone")
    status = build_env("fake", dest, lock=lock)  # rebuilt, and fails: the pin is no package
    assert not status.ok and "feather-no-such-package-anywhere" in status.reason


# ---- the report's arithmetic ------------------------------------------------------------------


def _row(engine: str, variant: str, batch_s: float, **case: int) -> dict:
    base = {"waiting": 1000, "prefix_tokens": 4096, "groups": 8, "batch": 64, "page": 16,
            "suffix_tokens": 64, "seed": 0}
    structure = {"sglang": "UnifiedRadixCache (Rust)", "vllm": "KVCacheManager",
                 "feather": "ChunkedHashTree"}[engine]
    return {**base, **case, "engine": engine, "variant": variant, "batch_s": batch_s,
            "engine_version": "0.5.23" if engine == "sglang" else "x", "structure": structure,
            "us_per_decision": batch_s / 64 * 1e6}


def test_speedups_and_fractions_by_hand() -> None:
    rows = pd.DataFrame([
        _row("feather", "cht", 0.001), _row("sglang", "dfs-weight", 0.5),
        _row("feather", "cht", 0.002, waiting=128), _row("sglang", "lpm", 0.004, waiting=128),
    ])
    sp = report.speedups(rows).set_index(["waiting", "label"])["speedup"]
    assert sp[(1000, "SGLang 0.5.23 dfs-weight (Rust tree)")] == pytest.approx(500)
    assert sp[(128, "SGLang 0.5.23 lpm (Rust tree)")] == pytest.approx(2)
    assert len(sp) == 2  # only baselines, each against the CHT of its own case
    model, hw = get_model("llama-3.1-8b"), get_hardware("a100-80gb")
    rows["decisions"] = 64
    frac = report.fractions(rows, model, [hw], cpu_step_s=0.5, output_tokens=32)
    case = Case(waiting=1000, prefix_tokens=4096, groups=8, batch=64, page=16)
    step = report.simulated_step_s(model, hw, case)
    dfs = frac[(frac.variant == "dfs-weight")].set_index("step_on")
    assert dfs.fraction["a100-80gb"] == pytest.approx(0.5 / (0.5 + step))  # a pass per step
    assert dfs.fraction["vllm-cpu step (measured)"] == pytest.approx(0.5)
    cht = frac[(frac.variant == "cht") & (frac.waiting == 1000)].set_index("step_on")
    # 64 running / 32 output tokens = 2 admissions per step, + the STOP: 3 decisions
    assert cht.sched_s["a100-80gb"] == pytest.approx(3 * 0.001 / 64)
    assert cht.fraction_batch["a100-80gb"] == pytest.approx(0.001 / (0.001 + step))
    # a decode step of 64 x 4K-token requests on an A100 takes milliseconds, not seconds
    assert 1e-3 < step < 0.1


def test_decode_batch_shares_the_prefix_blocks_only() -> None:
    case = Case(waiting=10, prefix_tokens=64, groups=2, batch=3, page=16, suffix_tokens=20)
    batch = report.decode_batch(case)
    assert len(batch.seqs) == 3
    first, second = batch.seqs[0].block_ids, batch.seqs[1].block_ids
    assert first[:4] == second[:4] and not set(first[4:]) & set(second[4:])
    assert len(first) == -(-(64 + 20 + 1) // 16)


def test_group_prefixes_are_deterministic() -> None:
    case = Case(waiting=4, prefix_tokens=16, groups=2, batch=2)
    assert group_prefixes(case) == group_prefixes(case)
    assert group_prefixes(case) != group_prefixes(Case(waiting=4, prefix_tokens=16, groups=2,
                                                       batch=2, seed=1))

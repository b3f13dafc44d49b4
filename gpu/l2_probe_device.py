"""The GPU side of the probe: NVML sampling, the device's tensors and timers, its facts.

NVML (nvidia-ml-py) is sampled on a thread while kernels run; `Device` holds the tensors, the
timers (CUDA events, or perf_counter under --cpu-smoke) and the L2 flush; `kernel_facts` and
`resident_programs_per_sm` read the compiled kernel's registers and shared memory into the
simulator's resident-program window; `environment` records versions and device facts. torch
and the `feather` package are imported inside the functions that need them, so importing this
module stays cheap and TRITON_INTERPRET can still be set first. gpu/kernel_bench.py uses the
NVML sampler where `feather.telemetry` cannot be imported.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from l2_probe_bookkeeping import error_record, run_bounded

if TYPE_CHECKING:
    from l2_probe_configs import ProbeConfig, ProbeShapes

NVML_PERIOD_S = 0.02
COPY_BYTES = 2 * 1024**3
COPY_REPEATS = 20
FLUSH_L2_MULTIPLE = 4  # the L2 flush buffer is this many times the L2 size
FLUSH_MIN_BYTES = 256 * 1024**2


# ---------------------------------------------------------------------------------------------
# NVML sampling
# ---------------------------------------------------------------------------------------------


class NvmlSampler:
    """Samples memory/SM utilisation, clocks and power every `period_s` on a daemon thread."""

    def __init__(self, nvml: Any, handle: Any, period_s: float = NVML_PERIOD_S) -> None:
        self.nvml, self.handle, self.period_s = nvml, handle, period_s
        self.samples: list[dict[str, float | None]] = []
        self.errors: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> NvmlSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)

    def _read(self, fn: Callable[[], float]) -> float | None:
        try:
            return float(fn())
        except Exception as exc:  # one unsupported query must not stop the others
            self.errors.add(f"{type(exc).__name__}: {exc}")
            return None

    def _loop(self) -> None:
        nvml, h = self.nvml, self.handle
        t0 = time.monotonic()
        while not self._stop.is_set():
            util = None
            try:
                util = nvml.nvmlDeviceGetUtilizationRates(h)
            except Exception as exc:
                self.errors.add(f"utilization: {type(exc).__name__}: {exc}")
            self.samples.append(
                {
                    "t_s": time.monotonic() - t0,
                    "mem_util_pct": None if util is None else float(util.memory),
                    "sm_util_pct": None if util is None else float(util.gpu),
                    "mem_clock_mhz": self._read(
                        lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)
                    ),
                    "sm_clock_mhz": self._read(
                        lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)
                    ),
                    "power_w": self._read(lambda: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
                }
            )
            self._stop.wait(self.period_s)


def summarise_samples(samples: Sequence[dict[str, float | None]]) -> dict[str, Any]:
    """Mean and max of each sampled NVML quantity (None readings left out)."""
    keys = sorted({k for s in samples for k in s if k != "t_s"})
    out: dict[str, Any] = {"samples": len(samples)}
    for key in keys:
        values = [s[key] for s in samples if s.get(key) is not None]
        out[key] = (
            {"mean": statistics.fmean(values), "max": max(values), "n": len(values)}
            if values
            else None
        )
    return out


def init_nvml() -> tuple[Any, Any, dict[str, Any]]:
    """(pynvml module, device handle, info) or (None, None, info with the error)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        info: dict[str, Any] = {"available": True}
        with contextlib.suppress(Exception):
            info["driver_version"] = _text(pynvml.nvmlSystemGetDriverVersion())
        with contextlib.suppress(Exception):
            info["device_name"] = _text(pynvml.nvmlDeviceGetName(handle))
        with contextlib.suppress(Exception):
            info["cuda_driver_version"] = pynvml.nvmlSystemGetCudaDriverVersion()
        return pynvml, handle, info
    except Exception as exc:
        return None, None, {"available": False, **error_record(exc)}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# Device work (torch imported here, lazily)
# ---------------------------------------------------------------------------------------------


class Device:
    """The device-specific pieces: tensors, timers, the L2 flush."""

    def __init__(self, smoke: bool, shapes: ProbeShapes) -> None:
        import torch

        self.torch = torch
        self.smoke = smoke
        self.shapes = shapes
        if not smoke and not torch.cuda.is_available():
            raise RuntimeError("no CUDA device visible to PyTorch (use --cpu-smoke on a CPU)")
        self.dev = torch.device("cpu" if smoke else "cuda")
        self.dtype = getattr(torch, shapes.dtype)
        self.flush_buf = None
        self.flush_sink = None
        if not smoke:
            l2 = torch.cuda.get_device_properties(0).L2_cache_size
            n = max(FLUSH_L2_MULTIPLE * l2, FLUSH_MIN_BYTES) // 4
            self.flush_buf = torch.ones(n, dtype=torch.int32, device=self.dev)

    def sync(self) -> None:
        if not self.smoke:
            self.torch.cuda.synchronize()

    def flush_l2(self) -> None:
        """Read a buffer several times the L2: evicts every KV line and leaves no dirty line."""
        if self.flush_buf is not None:
            self.flush_sink = self.flush_buf.sum()

    def time_launches(
        self, launch: Callable[[], object], repeats: int, flush: bool = True
    ) -> list[float]:
        """Per-launch milliseconds (CUDA events on the GPU, perf_counter on the CPU)."""
        torch = self.torch
        if self.smoke:
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                launch()
                times.append((time.perf_counter() - t0) * 1e3)
            return times
        pairs = []
        for _ in range(3 if flush else 0):  # queue GPU work ahead: no host gap in the first pair
            self.flush_l2()
        for _ in range(repeats):
            if flush:
                self.flush_l2()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            launch()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in pairs]

    def tensors(self, config: ProbeConfig, seed: int) -> dict[str, Any]:
        """Random q and KV pool (never zeros), block tables and lengths on the device."""
        torch, s = self.torch, self.shapes
        gen = torch.Generator(device=self.dev).manual_seed(seed)
        kv_shape = (config.num_blocks, s.block_size, s.num_kv_heads, s.head_dim)
        kw = {"dtype": self.dtype, "device": self.dev, "generator": gen}
        return {
            "q": torch.randn(config.num_seqs, s.num_q_heads, s.head_dim, **kw),
            "k": torch.randn(kv_shape, **kw),
            "v": torch.randn(kv_shape, **kw),
            "block_tables": torch.tensor(
                config.padded_tables(), dtype=torch.int32, device=self.dev
            ),
            "seq_lens": torch.tensor(config.seq_lens, dtype=torch.int32, device=self.dev),
        }

    def copy_bandwidth(self) -> dict[str, Any]:
        """Device-to-device copy of COPY_BYTES (median), counting bytes read plus written."""
        torch = self.torch
        nbytes = COPY_BYTES if not self.smoke else 64 * 1024**2
        src = torch.randn(nbytes // 2, dtype=torch.bfloat16, device=self.dev)
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        self.sync()
        times = self.time_launches(lambda: dst.copy_(src), COPY_REPEATS, flush=False)
        sum_times = self.time_launches(
            lambda: torch.sum(src, dtype=torch.float32), COPY_REPEATS, flush=False
        )
        med = statistics.median(times)
        med_sum = statistics.median(sum_times)
        return {
            "bytes": nbytes,
            "median_ms": med,
            "read_plus_write_bytes_per_s": 2 * nbytes / (med / 1e3),
            "read_bytes_per_s": nbytes / (med / 1e3),
            "sum_read_median_ms": med_sum,
            "sum_read_bytes_per_s": nbytes / (med_sum / 1e3),
            "note": "copy: bytes read + written over time (KINDS.md convention, ~4.3 TB/s on "
            "H200); sum_read: a reduction reading the buffer once (a read-only ceiling)",
        }


def kernel_facts(handle: object, torch: Any, smoke: bool, shapes: ProbeShapes) -> dict[str, Any]:
    """Registers, spills, shared memory of the compiled kernel and resident programs per SM."""
    from feather.kernels.paged_decode import TRITON_KERNEL_NAME, tile_tokens_for

    meta = getattr(handle, "metadata", None)
    facts: dict[str, Any] = {
        "name": TRITON_KERNEL_NAME,
        "tile_tokens": tile_tokens_for(shapes.block_size),
        "n_regs": getattr(handle, "n_regs", None),
        "n_spills": getattr(handle, "n_spills", None),
        "shared_bytes": getattr(meta, "shared", None),
        "num_warps": getattr(meta, "num_warps", None),
        "num_stages": getattr(meta, "num_stages", None),
    }
    if smoke or facts["n_regs"] is None or facts["num_warps"] is None:
        return facts
    props = torch.cuda.get_device_properties(0)
    limits = {
        "regs_per_sm": getattr(props, "regs_per_multiprocessor", 65536),
        "shared_per_sm": getattr(props, "shared_memory_per_multiprocessor", 233472),
        "threads_per_sm": getattr(props, "max_threads_per_multi_processor", 2048),
    }
    facts["occupancy_inputs"] = limits
    facts["resident_programs_per_sm_estimate"] = resident_programs_per_sm(
        int(facts["n_regs"]), int(facts["shared_bytes"] or 0), int(facts["num_warps"]), **limits
    )
    return facts


def resident_programs_per_sm(
    n_regs: int,
    shared_bytes: int,
    num_warps: int,
    regs_per_sm: int = 65536,
    shared_per_sm: int = 233472,
    threads_per_sm: int = 2048,
    max_blocks_per_sm: int = 32,
) -> int:
    """Programs (CTAs) one SM holds at once: the tightest of registers (allocated per thread in
    units of 8), shared memory (+1 KiB the driver reserves per CTA), threads and CTA slots."""
    threads = num_warps * 32
    regs = max(8, -(-n_regs // 8) * 8) * threads
    by_shared = shared_per_sm // (shared_bytes + 1024)
    return int(min(regs_per_sm // regs, by_shared, threads_per_sm // threads, max_blocks_per_sm))


def environment(smoke: bool, nvml_info: dict[str, Any]) -> dict[str, Any]:
    """Versions and device facts."""
    import torch

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": platform.node(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": None,
        "driver_version": nvml_info.get("driver_version"),
        "cuda_driver_version": nvml_info.get("cuda_driver_version"),
        "triton_interpret": os.environ.get("TRITON_INTERPRET"),
    }
    with contextlib.suppress(Exception):
        import triton

        env["triton"] = triton.__version__
    if not smoke and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            gpu_name=torch.cuda.get_device_name(0),
            l2_cache_bytes=props.L2_cache_size,
            sm_count=props.multi_processor_count,
            total_memory_bytes=props.total_memory,
            compute_capability=f"{props.major}.{props.minor}",
        )
    if env["driver_version"] is None and shutil.which("nvidia-smi"):
        run = run_bounded(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], 20.0
        )
        env["driver_version"] = run["stdout"].strip() or None
    return env

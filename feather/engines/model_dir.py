"""A model directory holding only `config.json`: what engines need to run with dummy weights.

Real engines (vLLM's `load_format="dummy"`) build a model from its config alone, so a run
with the paper's model shapes needs no download. The config is written from our model
profile (`feather.models`), so the simulator and the real engine use the same shapes.
"""

from __future__ import annotations

import json
from pathlib import Path

from feather.atomic import write_text_atomic
from feather.models import ModelProfile

_MODEL_TYPE = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
}


def hf_config(model: ModelProfile) -> dict:
    """The config.json fields that set the model's shapes (the rest keeps its defaults)."""
    if model.architecture not in _MODEL_TYPE:
        raise ValueError(
            f"model {model.name!r}: no config.json for architecture {model.architecture!r}; "
            f"known: {', '.join(_MODEL_TYPE)}"
        )
    missing = [f for f in ("vocab_size", "intermediate_size") if not getattr(model, f)]
    if missing:
        raise ValueError(f"model {model.name!r}: profile lacks {', '.join(missing)}")
    return {
        "architectures": [model.architecture],
        "model_type": _MODEL_TYPE[model.architecture],
        "hidden_size": model.hidden,
        "intermediate_size": model.intermediate_size,
        "num_hidden_layers": model.layers,
        "num_attention_heads": model.q_heads,
        "num_key_value_heads": model.kv_heads,
        "head_dim": model.head_dim,
        "vocab_size": model.vocab_size,
        "max_position_embeddings": model.context_tokens,
        "tie_word_embeddings": model.tie_word_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "_feather_profile": model.source,
    }


def model_directory(model: ModelProfile, root: str | Path) -> Path:
    """`root/<model>/config.json`, written (atomically) when absent or different."""
    folder = Path(root) / model.name
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps(hf_config(model), indent=2, sort_keys=True) + "\n"
    path = folder / "config.json"
    if not path.is_file() or path.read_text() != text:
        write_text_atomic(path, text)
    return folder

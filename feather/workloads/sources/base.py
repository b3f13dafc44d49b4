"""What every source yields: prompt groups as text segments, plus what it read and dropped.

A request's prompt is the concatenation of segments, each tokenized on its own:
    BOS + wrap_pre + head + document + tail_i + wrap_post
`head` is shared by every request of a task (its system prompt / template), `document` by
every request over one document; `tail_i` carries the question. Tokenizing segments
separately is what makes requests over one document share exactly that document's tokens
(a whole-string tokenization may merge a token or two across a segment boundary). The price:
SentencePiece starts every segment with its word-start marker, so a boundary after a
trailing space costs one token more than whole-string tokenization would.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from feather.workloads.schema import WorkloadError

Truncation = Literal["document", "middle"]


class DataUnavailableError(RuntimeError):
    """The benchmark's files can be neither downloaded nor found locally."""


class UnknownTaskError(ValueError):
    """A task name the benchmark does not have."""


@dataclass
class PromptGroup:
    """Requests over one document of one task."""

    source: str
    task: str
    doc_key: str
    head: str
    document: str
    tails: list[str]
    references: list[str]  # reference answers, for output lengths
    truncation: Truncation  # the benchmark's own rule for prompts that are too long
    max_output_tokens: int  # the benchmark's own generation limit for the task
    wrap_pre: str = ""  # a chat template around the (truncated) prompt
    wrap_post: str = ""


@dataclass
class SourceData:
    groups: list[PromptGroup]
    files: list[dict] = field(default_factory=list)  # {"path", "sha256", "bytes"}
    dropped: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, dict[str, int]]:
        """Per task, before any selection: documents, requests, documents asked twice or more."""
        out: dict[str, dict[str, int]] = {}
        for g in self.groups:
            entry = out.setdefault(g.task, {"documents": 0, "requests": 0, "groups_2plus": 0})
            entry["documents"] += 1
            entry["requests"] += len(g.tails)
            entry["groups_2plus"] += len(g.tails) >= 2
        return out


def document_key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class GroupsByDocument:
    """One task's requests, grouped by (a hash of) their document."""

    def __init__(self) -> None:
        self._groups: dict[str, PromptGroup] = {}

    def add(
        self, document: str, tail: str, reference: str, new: Callable[[str], PromptGroup]
    ) -> None:
        """Add a request; `new(doc_key)` makes its group if the document is new."""
        key = document_key(document)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = new(key)
        group.tails.append(tail)
        group.references.append(reference)

    def groups(self) -> list[PromptGroup]:
        return list(self._groups.values())


def file_record(path: Path) -> dict:
    data = path.read_bytes()
    return {"path": str(path), "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def find_task_file(root: Path, task: str) -> Path | None:
    """`<task>.jsonl` anywhere below root (flat copies and the hub's folders alike)."""
    matches = sorted(root.rglob(f"{task}.jsonl"))
    return matches[0] if matches else None


# What a record's fields must be, where present and not null: (description, test).
FieldCheck = tuple[str, Callable[[Any], bool]]
STRING: FieldCheck = ("a string", lambda v: isinstance(v, str))
STRINGS: FieldCheck = (
    "a list of strings",
    lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
)


def read_jsonl(path: Path, what: str, fields: dict[str, FieldCheck]) -> list[dict]:
    """The records of a JSON-lines file, each checked: a JSON object whose `fields` have the
    expected types where present and not null. The first that is not is a WorkloadError
    naming the file, the line and the field. (Read with the standard library: the `datasets`
    json builder gave no line numbers, kept an Arrow cache per file and, on every call, sent
    a HEAD request to s3.amazonaws.com to count the load.)"""
    try:
        # bytes, then decoded: read_text's universal newlines would make a "\r" inside a
        # record a line break, and half a record a line of its own
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{what} file {path}: not UTF-8 text ({exc.reason})") from None
    records = []
    for number, line in enumerate(text.split("\n"), 1):  # JSON Lines: "\n" only (U+2028 is text)
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{what} file {path}, line {number}: not JSON ({exc})") from None
        if not isinstance(record, dict):
            raise WorkloadError(
                f"{what} file {path}, line {number}: a record is a JSON object, "
                f"got {type(record).__name__}"
            )
        for name, (expected, ok) in fields.items():
            value = record.get(name)
            if value is not None and not ok(value):
                shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
                raise WorkloadError(
                    f"{what} file {path}, line {number}: field {name!r} = {shown}: "
                    f"expected {expected}"
                )
        records.append(record)
    return records

"""LongBench-format data from our own text: the exact schema and archive layout, no real data.

Used where LongBench itself is unavailable (no network): the pipeline's LongBench-format
workloads and the tests exercise the whole LongBench path (data.zip -> unpack -> load ->
group by context -> templates -> truncation) on records we generate. A workload built from
these records is labelled as such everywhere; it says nothing about LongBench's real
question distribution.
"""

from __future__ import annotations

import json
import random
import zipfile
from pathlib import Path

from feather.atomic import atomic_target

WORDS = (
    "prefix",
    "cache",
    "batch",
    "decode",
    "kernel",
    "memory",
    "token",
    "request",
    "block",
    "tree",
    "hash",
    "queue",
    "policy",
    "throughput",
    "latency",
    "model",
    "layer",
    "head",
)


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "."


def records(task: str, contexts: list[int], seed: int = 0, context_words: int = 400) -> list[dict]:
    """One record per entry of `contexts` (an index: equal indices share one context; a
    negative index gives an empty context). Context i has context_words + 50 i words."""
    rng = random.Random(f"{task}:{seed}")
    bodies = {i: text(rng, context_words + 50 * i) for i in set(contexts) if i >= 0}
    out = []
    for n, i in enumerate(contexts):
        question = (
            ""
            if task.startswith(("gov_report", "multi_news"))
            else f"What is {rng.choice(WORDS)} {n}?"
        )
        body = bodies.get(i, "")
        out.append(
            {
                "input": question,
                "context": body,
                "answers": [text(rng, 5 + n % 20)],
                "length": len(body.split()),
                "dataset": task,
                "language": "en",
                "all_classes": None,
                "_id": f"{task}-{n:04d}",
            }
        )
    return out


def write_data_zip(folder: str | Path, tasks: dict[str, list[dict]]) -> Path:
    """data.zip with data/<task>.jsonl members, as the hub's THUDM/LongBench archive."""
    archive = Path(folder) / "data.zip"
    with atomic_target(archive) as tmp, zipfile.ZipFile(tmp, "w") as zf:
        for task, rows in tasks.items():
            zf.writestr(f"data/{task}.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return archive


def prefix_groups(
    folder: str | Path, prefix_words: int, groups: int = 12, per_group: int = 8, seed: int = 0
) -> Path:
    """A qasper/qmsum archive: `groups` contexts of about `prefix_words` words per task, each
    asked `per_group` questions (the tasks where LongBench repeats contexts)."""
    contexts = [g for g in range(groups) for _ in range(per_group)]
    data = {
        task: records(task, contexts, seed, context_words=prefix_words)
        for task in ("qasper", "qmsum")
    }
    return write_data_zip(folder, data)

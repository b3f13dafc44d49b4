"""A LongBench-format fixture from our own synthetic text: exact schema, exact archive layout.

data.zip holds data/<task>.jsonl with one JSON object per line: input, context, answers,
length, dataset, language, all_classes, _id - as the hub's THUDM/LongBench data.zip does.
"""

from __future__ import annotations

import json
import random
import zipfile
from pathlib import Path

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


def records(task: str, contexts: list[int], seed: int = 0) -> list[dict]:
    """One record per entry of `contexts` (an index: equal indices share one context)."""
    rng = random.Random(f"{task}:{seed}")
    bodies = {i: text(rng, 400 + 50 * i) for i in set(contexts)}
    out = []
    for n, i in enumerate(contexts):
        question = "" if task.startswith("gov_report") else f"What is {rng.choice(WORDS)} {n}?"
        out.append(
            {
                "input": question,
                "context": bodies[i] if i >= 0 else "",
                "answers": [text(rng, 5 + n)],
                "length": len(bodies.get(i, "").split()),
                "dataset": task,
                "language": "en",
                "all_classes": None,
                "_id": f"{task}-{n:04d}",
            }
        )
    return out


def write_data_zip(folder: Path, tasks: dict[str, list[dict]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / "data.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for task, rows in tasks.items():
            zf.writestr(f"data/{task}.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return archive

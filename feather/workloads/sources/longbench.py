"""LongBench (THUDM/LongBench, also zai-org/LongBench): records grouped by their context.

Each record is one question over one context (fields input, context, answers, length,
dataset, language, all_classes, _id); records of a task with the same context (hashed) form
one prefix group - only narrativeqa, qasper, multifieldqa and qmsum repeat contexts, and the
statistics say how often. Prompts follow LongBench's `pred.py` with its per-task templates
(`config/dataset2prompt.json`, context before question in every task) and generation limits
(`config/dataset2maxlen.json`): a too-long prompt has its *middle* cut (first and last
half kept), then - except for trec, triviaqa, samsum, lsht, lcc and repobench-p - the chat
template of a LongChat/Vicuna model wraps it (`chat="none"` leaves prompts unwrapped).

Files: `data.zip` (from the hub, or found below the local directory) is unpacked into the
raw-data directory before loading - `zip://` paths do not work offline.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import zipfile
import zlib
from pathlib import Path

from feather.workloads.hub import download, file_provenance
from feather.workloads.schema import WorkloadError
from feather.workloads.sources.base import (
    STRING,
    STRINGS,
    DataUnavailableError,
    GroupsByDocument,
    PromptGroup,
    SourceData,
    UnknownTaskError,
    file_record,
    find_task_file,
    read_jsonl,
)

HUB_REPO = "THUDM/LongBench"
RECORD_FIELDS = {"context": STRING, "input": STRING, "answers": STRINGS}

# LongBench's config/dataset2prompt.json (v1), kept as data beside this module.
TEMPLATES: dict[str, str] = json.loads(
    (Path(__file__).with_name("longbench_prompts.json")).read_text(encoding="utf-8")
)
MAX_NEW_TOKENS = {
    "narrativeqa": 128, "qasper": 128, "multifieldqa_en": 64, "multifieldqa_zh": 64,
    "hotpotqa": 32, "2wikimqa": 32, "musique": 32, "dureader": 128, "gov_report": 512,
    "qmsum": 512, "multi_news": 512, "vcsum": 512, "trec": 64, "triviaqa": 32, "samsum": 128,
    "lsht": 64, "passage_count": 32, "passage_retrieval_en": 32, "passage_retrieval_zh": 32,
    "lcc": 64, "repobench-p": 64,
}  # fmt: skip
E_TASKS = (
    "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "gov_report", "multi_news", "trec",
    "triviaqa", "samsum", "passage_count", "passage_retrieval_en", "lcc", "repobench-p",
)  # fmt: skip
TASKS = tuple(TEMPLATES) + tuple(f"{t}_e" for t in E_TASKS)
NO_CHAT = ("trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p")
VICUNA_SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)


def _base(task: str) -> str:
    return task[:-2] if task.endswith("_e") else task


def unpack_zip(archive: Path, dest: Path) -> Path:
    """Extract a LongBench data.zip into dest (refusing members that escape it, and archives
    that are not zip files or would not fit on the disk)."""
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    try:
        with zipfile.ZipFile(archive) as zf:
            members = zf.infolist()
            for member in members:
                target = (dest / member.filename).resolve()
                if not target.is_relative_to(root):
                    raise DataUnavailableError(
                        f"{archive}: member {member.filename!r} escapes {dest}"
                    )
            needed = sum(m.file_size for m in members)
            free = shutil.disk_usage(dest).free
            if needed > free:
                raise DataUnavailableError(
                    f"{archive} unpacks to {needed} bytes, more than the {free} free in {dest}"
                )
            zf.extractall(dest)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as exc:
        raise WorkloadError(
            f"LongBench archive {archive} is not a readable zip file ({exc})"
        ) from None
    return dest


def _unpacked(archive: Path, raw_dir: Path) -> Path:
    """The archive's members, unpacked once into a folder named by its SHA-256 (whole or not
    at all: unpacked beside it, then renamed), so a changed archive is never mixed with an
    older one's files."""
    digest = file_record(archive)["sha256"]
    folder = raw_dir / "longbench" / digest[:16]
    if not folder.is_dir():
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            unpack_zip(archive, staging)
            staging.rename(folder)
        except OSError:
            if not folder.is_dir():  # not a concurrent job that unpacked it first
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return folder


def _check_member(archive: Path, folder: Path, path: Path) -> None:
    """An unpacked file is still its archive member (size and CRC-32)."""
    name = path.relative_to(folder).as_posix()
    with zipfile.ZipFile(archive) as zf:
        info = zf.getinfo(name)
    crc = 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            crc = zlib.crc32(block, crc)
    if path.stat().st_size != info.file_size or crc != info.CRC:
        raise DataUnavailableError(
            f"{path} differs from member {name} of {archive} (altered after unpacking); "
            f"delete {folder} to unpack it again"
        )


def _locate(tasks: list[str], data_dir: Path | None, raw_dir: Path) -> tuple[dict[str, Path], list]:
    """Each task's jsonl: in the local directory, else in its data.zip (local, or downloaded
    from the hub and checked against the hub on every build), unpacked."""
    files: dict[str, Path] = {}
    if data_dir is not None:
        files = {t: f for t in tasks if (f := find_task_file(data_dir, t)) is not None}
        if len(files) == len(tasks):
            return files, []
        archives = sorted(data_dir.rglob("data.zip"))
        if not archives:
            missing = [t for t in tasks if t not in files]
            raise DataUnavailableError(
                f"LongBench task(s) {', '.join(missing)}: no <task>.jsonl and no data.zip "
                f"below {data_dir}"
            )
        archive = archives[0]
    else:
        archive = download(
            HUB_REPO, "data.zip", raw_dir / "longbench-zip", what="LongBench data.zip"
        )
    folder = _unpacked(archive, raw_dir)
    for task in tasks:
        if task not in files:
            found = find_task_file(folder, task)
            if found is None:
                raise DataUnavailableError(f"LongBench task {task!r}: not in {archive}")
            _check_member(archive, folder, found)
            files[task] = found
    return files, [file_provenance(archive)]


def load_longbench(
    tasks: list[str] | None,
    data_dir: Path | None,
    raw_dir: Path,
    chat: str = "vicuna",
) -> SourceData:
    """Prompt groups of the chosen LongBench tasks (default: the 21 LongBench tasks)."""
    if chat not in ("vicuna", "none"):
        raise ValueError(f"chat must be 'vicuna' or 'none', got {chat!r}")
    chosen = list(tasks) if tasks else list(TEMPLATES)
    unknown = [t for t in chosen if t not in TASKS]
    if unknown:
        raise UnknownTaskError(
            f"unknown LongBench task(s) {', '.join(unknown)}; tasks: {', '.join(TASKS)}"
        )
    files, records = _locate(chosen, data_dir, raw_dir)
    data = SourceData(groups=[], files=records + [file_record(files[t]) for t in chosen])
    data.dropped = {"empty_documents": 0, "empty_questions": 0}
    for task in chosen:
        base = _base(task)
        head, tail_template = TEMPLATES[base].split("{context}")
        wrapped = chat == "vicuna" and base not in NO_CHAT
        by_context = GroupsByDocument()
        records = read_jsonl(files[task], f"LongBench {task}", RECORD_FIELDS)
        for record in records:
            context = record.get("context") or ""
            if not context.strip():
                data.dropped["empty_documents"] += 1
                continue
            question = record.get("input") or ""
            if "{input}" in tail_template and not question.strip():
                data.dropped["empty_questions"] += 1
                continue
            answers = record.get("answers") or [""]
            by_context.add(
                context,
                tail_template.replace("{input}", question),
                answers[0] or "",
                lambda key, task=task, head=head, context=context, wrapped=wrapped, base=base: (
                    PromptGroup(
                        source="longbench",
                        task=task,
                        doc_key=key,
                        head=head,
                        document=context,
                        tails=[],
                        references=[],
                        truncation="middle",
                        max_output_tokens=MAX_NEW_TOKENS[base],
                        wrap_pre=VICUNA_SYSTEM + " USER: " if wrapped else "",
                        wrap_post=" ASSISTANT:" if wrapped else "",
                    )
                ),
            )
        data.groups.extend(by_context.groups())
    return data

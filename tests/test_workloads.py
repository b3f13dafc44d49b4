"""Workloads from the real L-Eval copy, a LongBench-format fixture and synthetic specs."""

from __future__ import annotations

import hashlib
import json
import socket
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from toy_engine import lcp

from feather.cli import main
from feather.workloads import BuildOptions, WorkloadError, build, load_workload, write_workload
from feather.workloads.longbench_synthetic import records, write_data_zip
from feather.workloads.schema import read_workload, sidecar_path
from feather.workloads.sources.base import DataUnavailableError, UnknownTaskError
from feather.workloads.sources.leval import SYSTEM_EXAM
from feather.workloads.tokenizer import TokenizerError, load_tokenizer

EVERYTHING = {"min_prefix_tokens": 0, "max_prefix_tokens": 10**9}


@pytest.fixture(scope="module")
def leval_all(leval_dir, tmp_path_factory):
    """Every L-Eval request, no selection (prefix filter off)."""
    raw = tmp_path_factory.mktemp("raw")
    return build("leval", data_dir=leval_dir, raw_dir=raw, options=BuildOptions(**EVERYTHING))


def test_leval_groups_and_requests_match_the_source_records(leval_dir, leval_all) -> None:
    expected: dict[tuple[str, str], int] = defaultdict(int)
    for path in sorted(leval_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["input"].strip():
                expected[(path.stem, record["input"])] += sum(
                    1 for q in record["instructions"] if q.strip()
                )
    built = Counter((r.task, r.group_id) for r in leval_all.requests)
    assert len(built) == len(expected)  # one group per distinct document of a task
    assert sorted(built.values()) == sorted(expected.values())
    assert len(leval_all) == sum(expected.values())
    gsm = [r for r in leval_all.requests if r.task == "gsm100"]
    assert len(gsm) == 100 and len({r.group_id for r in gsm}) == 1  # one 16-shot prefix
    provenance = leval_all.provenance["workload"]
    assert provenance["tokenizer"]["vocab_size"] == 32_000
    assert len(provenance["files"]) == 18 and all(
        len(f["sha256"]) == 64 for f in provenance["files"]
    )
    assert provenance["source_summary"]["quality"] == {
        "documents": 15,
        "requests": 202,
        "groups_2plus": 15,
    }


def test_leval_requests_of_a_document_share_exactly_its_prefix(leval_dir, leval_all) -> None:
    tokenizer = load_tokenizer()
    record = json.loads((leval_dir / "quality.jsonl").read_text().splitlines()[0])
    head = (
        "A chat between a curious user and an artificial intelligence assistant.The assistant "
        "gives helpful, detailed, and polite answers to the user's questions. USER: "
        + SYSTEM_EXAM
        + "Document is as follows. "
    )
    head_ids, doc_ids = tokenizer.encode_many([head, record["input"]])
    expected = [tokenizer.identity.bos_id, *head_ids, *doc_ids]
    group = [
        r
        for r in leval_all.requests
        if r.task == "quality" and list(r.prompt_token_ids[: len(expected)]) == expected
    ]
    assert len(group) == len(record["instructions"])
    for r in group:
        assert r.shared_prefix_len >= len(expected)  # the document, plus " \nQuestion:"
        assert r.shared_prefix_len == min(
            lcp(r.prompt_token_ids.tolist(), o.prompt_token_ids.tolist())
            for o in group
            if o is not r
        )
    assert all(r.prefix_lens[0] == 105 for r in group)  # BOS + the quality task's template head


def test_default_leval_workload_meets_the_paper_shape(leval_dir, tmp_path) -> None:
    out = tmp_path / "leval.parquet"
    code = main(
        [
            "workload",
            "build",
            "--source",
            "leval",
            "--data-dir",
            str(leval_dir),
            "--raw-dir",
            str(tmp_path / "raw"),
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0
    stats = read_workload(out).statistics
    assert stats["groups_with_2plus_requests"] >= 100
    assert stats["shared_groups_with_prefix_1k_to_10k"] == stats["groups_with_2plus_requests"]
    prefix = stats["shared_prefix_tokens_per_group"]
    assert prefix["min"] >= 1_000 and prefix["max"] <= 10_000 + 64


def test_same_seed_gives_a_byte_identical_file(leval_dir, tmp_path) -> None:
    options = BuildOptions(order="shuffled", arrival="poisson:4", unshared_fraction=0.2, seed=7)
    paths = []
    for name in ("a", "b", "c"):
        workload = build(
            "leval",
            tasks=["quality", "gsm100"],
            data_dir=leval_dir,
            raw_dir=tmp_path / "raw",
            options=options
            if name != "c"
            else BuildOptions(order="shuffled", arrival="poisson:4", unshared_fraction=0.2, seed=8),
        )
        paths.append(write_workload(workload, tmp_path / f"{name}.parquet"))
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert paths[0].read_bytes() != paths[2].read_bytes()


def test_too_long_prompts_are_truncated_by_the_benchmark_rule_or_rejected(leval_dir, tmp_path):
    cut = build(
        "leval",
        tasks=["quality"],
        data_dir=leval_dir,
        raw_dir=tmp_path,
        options=BuildOptions(max_context=4096, **EVERYTHING),
    )
    truncated = cut.provenance["workload"]["truncated_requests"]
    assert len(cut) == 202 and 100 < truncated < 202  # most quality documents exceed 4K tokens
    for r in cut.requests:
        assert r.prompt_len + r.output_len <= 4096
    by_group = defaultdict(list)
    for r in cut.requests:
        by_group[r.group_id].append(r)
    for group in by_group.values():  # the document is cut once: the group still shares it
        assert group[0].shared_prefix_len > 3_000
    rejected = build(
        "leval",
        tasks=["quality"],
        data_dir=leval_dir,
        raw_dir=tmp_path,
        options=BuildOptions(max_context=6000, overlength="reject", **EVERYTHING),
    )
    dropped = rejected.provenance["workload"]["dropped"]["overlength"]
    assert dropped > 0 and len(rejected) + dropped == 202


def test_longbench_from_its_archive_end_to_end(tmp_path) -> None:
    data = {
        "qasper": records("qasper", [0, 0, 0, 1, 2, 2]),
        "gov_report": records("gov_report", [0, 1]),
        "trec": records("trec", [0, 0, -1]),  # -1: an empty context, dropped and counted
    }
    write_data_zip(tmp_path / "hub", data)
    raw = tmp_path / "raw"
    workload = build(
        "longbench",
        tasks=list(data),
        data_dir=tmp_path / "hub",
        raw_dir=raw,
        options=BuildOptions(**EVERYTHING),
    )
    # unpacked before loading, into a folder named by the archive's SHA-256
    digest = hashlib.sha256((tmp_path / "hub" / "data.zip").read_bytes()).hexdigest()
    assert (raw / "longbench" / digest[:16] / "data" / "qasper.jsonl").is_file()
    summary = workload.provenance["workload"]["source_summary"]
    assert summary["qasper"] == {"documents": 3, "requests": 6, "groups_2plus": 2}
    assert summary["trec"] == {"documents": 1, "requests": 2, "groups_2plus": 1}
    assert workload.provenance["workload"]["dropped"]["empty_documents"] == 1
    assert workload.statistics["per_task"]["qasper"]["groups_2plus"] == 2
    tokenizer = load_tokenizer()
    sp_decode = tokenizer._sp.decode
    qasper = [r for r in workload.requests if r.task == "qasper"]
    text = sp_decode(qasper[0].prompt_token_ids.tolist())
    # Vicuna's chat wrapper, as pred.py applies it (segments are tokenized separately, so a
    # boundary decodes with one more space than the template has)
    assert text.startswith("A chat between a curious user")
    assert " USER:  You are given a scientific article" in text
    assert text.endswith("\n\nAnswer:  ASSISTANT:")
    trec = [r for r in workload.requests if r.task == "trec"]
    assert sp_decode(trec[0].prompt_token_ids.tolist()).startswith("Please determine")  # no chat
    gov = [r for r in workload.requests if r.task == "gov_report"]
    assert {r.output_len for r in gov} <= set(range(1, 513))
    first = [r for r in qasper if r.group_id == qasper[0].group_id]
    assert len(first) == 3 and first[0].shared_prefix_len > 300


def test_longbench_cuts_the_middle_of_too_long_prompts(tmp_path) -> None:
    write_data_zip(tmp_path / "hub", {"qasper": records("qasper", [3, 3])})
    options = BuildOptions(max_context=400, output="16", **EVERYTHING)
    workload = build(
        "longbench",
        tasks=["qasper"],
        data_dir=tmp_path / "hub",
        raw_dir=tmp_path / "raw",
        options=options,
        chat="none",
    )
    decode = load_tokenizer()._sp.decode
    for r in workload.requests:
        assert r.prompt_len + r.output_len <= 400
        text = decode(r.prompt_token_ids.tolist())
        assert text.startswith("You are given a scientific article")  # head kept
        assert text.rstrip().endswith("Answer:") and "Question: What is" in text  # tail kept
    assert workload.provenance["workload"]["truncated_requests"] == 2


def test_synthetic_specs_produce_the_requested_structure() -> None:
    spec = (
        "synthetic:groups=4,per_group=5,prefix=300,system=100,suffix=20,output=7,"
        "order=interleaved,seed=3"
    )
    w = load_workload(spec)
    assert len(w) == 20 and [r.group_id for r in w.requests[:4]] == [
        f"synthetic/g{g}" for g in range(4)
    ]
    assert all(r.prompt_len == 320 and r.output_len == 7 for r in w.requests)
    assert all(r.shared_prefix_len >= 300 and r.prefix_lens[0] >= 100 for r in w.requests)
    assert w.statistics["groups_with_2plus_requests"] == 4
    again = load_workload(spec)
    assert all(
        np.array_equal(a.prompt_token_ids, b.prompt_token_ids)
        for a, b in zip(w.requests, again.requests, strict=True)
    )
    apart = load_workload("synthetic:groups=2,per_group=50,prefix=64,suffix=8,unshared=1.0")
    tokens = [r.prompt_token_ids.tolist() for r in apart.requests]
    assert max(lcp(a, b) for i, a in enumerate(tokens) for b in tokens[i + 1 :]) < 8
    assert apart.statistics["groups_with_2plus_requests"] == 0


def test_arrivals() -> None:
    poisson = load_workload(
        "synthetic:groups=2,per_group=500,prefix=16,suffix=1,arrival=poisson:50,seed=1"
    )
    times = [r.arrival_time_s for r in poisson.requests]
    assert times == sorted(times) and times[0] == 0.0
    assert 15 < times[-1] < 25  # 999 gaps of mean 1/50 s
    bursts = load_workload(
        "synthetic:groups=1,per_group=10,prefix=16,suffix=1,arrival=bursts:4:2.5"
    )
    assert [r.arrival_time_s for r in bursts.requests] == [0.0] * 4 + [2.5] * 4 + [5.0] * 2


def test_synthetic_spread_makes_the_seed_change_the_shape() -> None:
    base = "synthetic:groups=6,per_group=10,prefix=200,system=40,suffix=8,output=4"
    plain = load_workload(base + ",seed=3").requests
    zero = load_workload(base + ",spread=0.0,seed=3").requests
    assert [list(r.prompt_token_ids) for r in plain] == [list(r.prompt_token_ids) for r in zero]
    shapes = []
    for seed in (0, 1):
        requests = load_workload(f"{base},spread=0.5,seed={seed}").requests
        sizes = Counter(r.group_id for r in requests)
        lengths = {r.group_id: len(r.prompt_token_ids) for r in requests}
        assert all(5 <= n <= 15 for n in sizes.values())
        assert all(40 + 80 + 8 <= n <= 40 + 240 + 8 for n in lengths.values())
        assert {tuple(r.prompt_token_ids[:40]) for r in requests} == {  # one system prompt
            tuple(requests[0].prompt_token_ids[:40])
        }
        shapes.append((sorted(sizes.values()), sorted(lengths.values())))
    assert shapes[0] != shapes[1]
    with pytest.raises(WorkloadError, match=r"spread=1\.5: expected 0 <= spread < 1"):
        load_workload(base + ",spread=1.5")


def test_bad_input_fails_early_and_clearly(leval_dir, tmp_path, monkeypatch) -> None:
    with pytest.raises(UnknownTaskError, match=r"unknown L-Eval task.*nosuch.*coursera"):
        build("leval", tasks=["nosuch"], data_dir=leval_dir, raw_dir=tmp_path)
    with pytest.raises(WorkloadError, match="unknown workload source 'squad'"):
        build("squad")
    for spec, message in [
        ("synthetic:groups=8,prefix", "malformed synthetic spec item 'prefix'"),
        ("synthetic:grups=8", "unknown synthetic spec key 'grups'"),
        ("synthetic:groups=x", "groups='x': expected int"),
        ("synthetic:order=sideways", "order must be grouped, shuffled or interleaved"),
        ("synthetic:arrival=poisson:-1", "arrival must be"),
        ("synthetic:system=10,prefix=5", "system <= prefix"),
    ]:
        with pytest.raises(WorkloadError, match=message):
            load_workload(spec)
    with socket.socket() as closed:  # a local port nothing listens on: no network touched
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    start = time.monotonic()
    with pytest.raises(DataUnavailableError, match=r"hub is unreachable.*--data-dir"):
        build("leval", tasks=["quality"], raw_dir=tmp_path)
    assert time.monotonic() - start < 10  # a quick, clear failure, not a long hang
    assert (
        main(
            [
                "workload",
                "build",
                "--source",
                "leval",
                "--tasks",
                "quality",
                "--raw-dir",
                str(tmp_path),
                "--out",
                str(tmp_path / "x.parquet"),
                "--quiet",
            ]
        )
        == 2
    )
    assert not (tmp_path / "x.parquet").exists()


def test_nothing_is_half_written(tmp_path, monkeypatch) -> None:
    import feather.workloads.schema as schema

    workload = load_workload("synthetic:groups=2,per_group=3,prefix=32,suffix=4")

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(schema.pq, "write_table", broken)
    with pytest.raises(OSError, match="disk full"):
        write_workload(workload, tmp_path / "w.parquet")
    assert list(tmp_path.iterdir()) == []


def test_sidecar_guards_against_a_swapped_file(tmp_path) -> None:
    a = write_workload(
        load_workload("synthetic:groups=1,per_group=2,prefix=8,suffix=1"), tmp_path / "a.parquet"
    )
    b = write_workload(
        load_workload("synthetic:groups=1,per_group=2,prefix=8,suffix=2"), tmp_path / "b.parquet"
    )
    sidecar_path(b).write_text(sidecar_path(a).read_text())
    with pytest.raises(WorkloadError, match="SHA-256 differs"):
        read_workload(b)


def test_cli_build_and_stats(tmp_path, capsys) -> None:
    out = tmp_path / "syn.parquet"
    assert (
        main(
            [
                "workload",
                "build",
                "--source",
                "synthetic:groups=3,per_group=4,prefix=1200",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    assert main(["workload", "stats", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert stats["requests"] == 12 and stats["groups_with_2plus_requests"] == 3
    assert json.loads(Path(str(out) + ".json").read_text())["provenance"]["config"][
        "source"
    ].startswith("synthetic:groups=3,per_group=4,prefix=1200")


def test_a_models_own_tokenizer_json_is_used_and_identified(tmp_path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<s>": 0, "<unk>": 1, "prefix": 2, "cache": 3, "batch": 4, "decode": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "model").mkdir()
    tok.save(str(tmp_path / "model" / "tokenizer.json"))
    loaded = load_tokenizer(tmp_path / "model")
    assert loaded.identity.kind == "hf-tokenizers" and loaded.identity.bos_id == 0
    assert loaded.identity.vocab_size == 6 and len(loaded.identity.sha256) == 64
    assert loaded.encode_many(["prefix cache batch", "decode nope"]) == [[2, 3, 4], [5, 1]]
    with pytest.raises(TokenizerError, match=r"no tokenizer\.json or tokenizer\.model"):
        load_tokenizer(tmp_path)

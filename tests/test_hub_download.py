"""The download path, end to end, against a real HTTP server speaking the hub's protocol.

`feather workload build` without --data-dir downloads L-Eval's files and LongBench's data.zip
with the real `huggingface_hub.hf_hub_download`, pointed by HF_ENDPOINT at a local server
(tests/hub_server.py) that serves the real L-Eval files from ../shared and a LongBench-format
archive built here. Nothing leaves 127.0.0.1: a guard refuses any other connection or name
lookup for the whole module.

Where the recorded hash lives: `<raw-dir>/<source>/.cache/feather/<file>.json`, written by
`feather.workloads.hub.download` once the client has moved a complete file into place; every
build compares the hub's ETag with it and the local bytes with its SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hub_server import COMMIT, HubServer

from feather.cli import main
from feather.workloads.hub import download, record_path
from feather.workloads.longbench_synthetic import records, write_data_zip

LEVAL = "L4NLP/LEval"
LONGBENCH = "THUDM/LongBench"
TASKS = {"tpo": "LEval/Exam/tpo.jsonl", "financial_qa": "LEval/Generation/financial_qa.jsonl"}
CHUNK = 64 * 1024
ALL_PREFIXES = ["--min-prefix-tokens", "0", "--max-prefix-tokens", "1000000000"]


@pytest.fixture(autouse=True)
def no_internet(monkeypatch):
    """Only loopback: a connection or DNS lookup of anything else is refused, and fails the
    test even where the caller swallows the error (huggingface_hub does, for some calls)."""
    local = {"127.0.0.1", "::1", "localhost"}
    connect, getaddrinfo = socket.socket.connect, socket.getaddrinfo
    attempts: list[str] = []

    def guarded_connect(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if isinstance(host, str) and host not in local and not host.startswith("/"):
            attempts.append(f"connect {address!r}")
            raise OSError(f"no network in tests: {address!r}")
        return connect(self, address)

    def guarded_getaddrinfo(host, *args, **kwargs):
        if host is not None and host not in local:
            attempts.append(f"lookup {host!r}")
            raise socket.gaierror(f"no network in tests: {host!r}")
        return getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)
    yield
    assert attempts == [], "a test tried to leave 127.0.0.1"


@pytest.fixture
def hub(leval_dir, tmp_path, monkeypatch):
    import huggingface_hub.constants

    server = HubServer()
    for task, path in TASKS.items():
        server.put(LEVAL, path, (Path(leval_dir) / f"{task}.jsonl").read_bytes())
    archive = write_data_zip(tmp_path / "zip", {"qasper": records("qasper", [0, 0, 0, 1, 1])})
    server.put(LONGBENCH, "data.zip", archive.read_bytes(), lfs=False)  # a regular git file
    server.start()
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    # huggingface_hub reads these at import (another test may have imported it already): set
    # what it would have read had the environment above been there from the start
    constants = huggingface_hub.constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", server.endpoint)  # also its agent registry's
    template = server.endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(tmp_path / "hf-home" / "agents"))
    # The client writes what it receives in chunks of DOWNLOAD_CHUNK_SIZE (10 MiB) and resumes
    # a cut transfer from the last whole chunk; with 64 KiB chunks these 0.2-0.3 MB files take
    # the resume path that real multi-chunk files take.
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", CHUNK)
    yield server
    server.stop()


def build(tmp_path: Path, out: str, source: str = "leval", tasks: str = "tpo,financial_qa"):
    """`feather workload build` in process: (exit code, its output file)."""
    target = tmp_path / out
    argv = ["workload", "build", "--source", source, "--tasks", tasks, *ALL_PREFIXES]
    argv += ["--raw-dir", str(tmp_path / "raw"), "--out", str(target), "--quiet"]
    return main(argv), target


def provenance_files(workload: Path) -> list[dict]:
    sidecar = json.loads(Path(f"{workload}.json").read_text())
    return sidecar["provenance"]["workload"]["files"]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_the_real_client_downloads_and_provenance_records_each_files_sha256(
    hub, tmp_path, capsys
) -> None:
    code, out = build(tmp_path, "leval.parquet")
    assert code == 0, capsys.readouterr().err
    files = {Path(f["path"]).name: f for f in provenance_files(out)}
    for task, path in TASKS.items():
        served = hub.files[(LEVAL, path)]
        local = tmp_path / "raw" / "leval" / path
        assert local.read_bytes() == served.data  # what the client wrote is what was served
        entry = files[f"{task}.jsonl"]
        assert entry["sha256"] == served.sha256 == sha256(local.read_bytes())
        assert entry["bytes"] == len(served.data)
        assert entry["download"] == {
            "repo_id": LEVAL,
            "revision": "main",
            "commit": COMMIT,
            "etag": served.sha256,
            "url": f"{hub.endpoint}/datasets/{LEVAL}/resolve/main/{path}",
        }
        record = json.loads(record_path(tmp_path / "raw" / "leval", path).read_text())
        assert record["sha256"] == served.sha256 and record["commit"] == COMMIT
        # the client's own protocol: HEAD on the hub, redirected to the CDN for the bytes
        assert (f"/datasets/{LEVAL}/resolve/main/{path}", None) in hub.requests("HEAD")
        assert (f"/blobs/{served.sha256}?signed=1", None) in hub.requests("GET")
    stats = json.loads(Path(f"{out}.json").read_text())["statistics"]
    assert set(stats["per_task"]) == set(TASKS) and stats["requests"] > 10

    # LongBench: data.zip as a regular (non-LFS) file, unpacked, its member loaded
    code, out = build(tmp_path, "longbench.parquet", source="longbench", tasks="qasper")
    assert code == 0, capsys.readouterr().err
    archive, member = provenance_files(out)
    served = hub.files[(LONGBENCH, "data.zip")]
    assert archive["sha256"] == served.sha256
    assert archive["download"]["etag"] == served.git_oid
    assert member["path"].endswith("data/qasper.jsonl") and len(member["sha256"]) == 64
    assert json.loads(Path(f"{out}.json").read_text())["statistics"]["requests"] == 5

    # a second build asks the hub (HEAD) and reuses the verified copies: no GET
    gets = len(hub.requests("GET"))
    assert build(tmp_path, "again.parquet")[0] == 0
    assert len(hub.requests("GET")) == gets
    assert {f["sha256"] for f in provenance_files(tmp_path / "again.parquet")} == {
        hub.files[(LEVAL, p)].sha256 for p in TASKS.values()
    }


@pytest.mark.parametrize(
    "fault",
    [
        {"content_length": True, "then": "fail"},  # connection closed early, resume refused
        {"content_length": False, "then": "serve"},  # body just ends early: size check
    ],
    ids=["closed-early-resume-refused", "short-body"],
)
def test_a_download_cut_off_halfway_is_never_used_as_complete(hub, tmp_path, capsys, fault) -> None:
    path = TASKS["financial_qa"]
    served = hub.files[(LEVAL, path)]
    hub.cut_next_download(LEVAL, path, **fault)
    code, out = build(tmp_path, "cut.parquet", tasks="financial_qa")
    assert code == 2 and not out.exists() and not Path(f"{out}.json").exists()
    message = one_line_error(capsys)
    assert "cannot download L-Eval financial_qa" in message
    dest = tmp_path / "raw" / "leval"
    assert not (dest / path).exists()  # no half file where the build would look
    assert not record_path(dest, path).exists()
    leftovers = [
        p for p in dest.rglob("*") if p.is_file() and p.stat().st_size == len(served.data) // 2
    ]
    assert leftovers == []
    if fault["content_length"]:  # the client tried to resume after its last whole chunk
        resume = len(served.data) // 2 // CHUNK * CHUNK
        assert (f"/blobs/{served.sha256}?signed=1", f"bytes={resume}-") in hub.requests("GET")
    code, out = build(tmp_path, "whole.parquet", tasks="financial_qa")  # the hub is fine again
    assert code == 0, capsys.readouterr().err
    assert (dest / path).read_bytes() == served.data
    assert provenance_files(out)[0]["sha256"] == served.sha256


def test_a_cut_transfer_is_resumed_with_a_range_request(hub, tmp_path, capsys) -> None:
    path = TASKS["tpo"]
    served = hub.files[(LEVAL, path)]
    hub.cut_next_download(LEVAL, path, then="serve")
    code, out = build(tmp_path, "resumed.parquet", tasks="tpo")
    assert code == 0, capsys.readouterr().err
    resume = len(served.data) // 2 // CHUNK * CHUNK
    assert resume > 0
    assert (f"/blobs/{served.sha256}?signed=1", f"bytes={resume}-") in hub.requests("GET")
    assert (tmp_path / "raw" / "leval" / path).read_bytes() == served.data
    assert provenance_files(out)[0]["sha256"] == served.sha256


def test_a_changed_file_is_fetched_again_and_its_new_sha256_recorded(hub, tmp_path, capsys) -> None:
    path = TASKS["tpo"]
    assert build(tmp_path, "before.parquet", tasks="tpo")[0] == 0
    old = hub.files[(LEVAL, path)]
    lines = old.data.decode().splitlines(keepends=True)
    new = hub.put(LEVAL, path, "".join(lines[:-1]).encode())  # a record removed: new ETag
    code, out = build(tmp_path, "after.parquet", tasks="tpo")
    assert code == 0, capsys.readouterr().err
    assert (f"/blobs/{new.sha256}?signed=1", None) in hub.requests("GET")
    (entry,) = provenance_files(out)
    assert entry["sha256"] == new.sha256 != old.sha256
    assert entry["download"]["etag"] == new.sha256
    record = json.loads(record_path(tmp_path / "raw" / "leval", path).read_text())
    assert record["sha256"] == new.sha256
    assert (tmp_path / "raw" / "leval" / path).read_bytes() == new.data
    before = json.loads(Path(f"{tmp_path / 'before.parquet'}.json").read_text())
    after = json.loads(Path(f"{out}.json").read_text())
    assert after["statistics"]["requests"] < before["statistics"]["requests"]


def test_a_local_copy_altered_after_download_is_caught(hub, tmp_path, capsys) -> None:
    path = TASKS["tpo"]
    assert build(tmp_path, "first.parquet", tasks="tpo")[0] == 0
    local = tmp_path / "raw" / "leval" / path
    recorded = hub.files[(LEVAL, path)].sha256
    data = bytearray(local.read_bytes())
    data[100] ^= 0x20  # one letter's case: same size, still valid JSON
    local.write_bytes(bytes(data))
    code, out = build(tmp_path, "second.parquet", tasks="tpo")
    assert code == 2 and not out.exists()
    message = one_line_error(capsys)
    assert f"local copy {local} was altered after download" in message
    assert f"recorded {recorded}" in message and sha256(bytes(data)) in message
    local.unlink()  # as the message says: delete it, and the next build downloads it again
    assert build(tmp_path, "third.parquet", tasks="tpo")[0] == 0
    assert local.read_bytes() == hub.files[(LEVAL, path)].data

    # LongBench: the downloaded archive, and a member unpacked from it
    assert build(tmp_path, "lb.parquet", source="longbench", tasks="qasper")[0] == 0
    (unpacked,) = (tmp_path / "raw" / "longbench").glob("*/data/qasper.jsonl")
    unpacked.write_text(unpacked.read_text().replace("What is", "What was", 1))
    code, out = build(tmp_path, "lb2.parquet", source="longbench", tasks="qasper")
    assert code == 2 and not out.exists()
    assert "altered after unpacking" in one_line_error(capsys)
    archive = tmp_path / "raw" / "longbench-zip" / "data.zip"
    archive.write_bytes(archive.read_bytes() + b"\0")
    code, out = build(tmp_path, "lb3.parquet", source="longbench", tasks="qasper")
    assert code == 2 and "data.zip was altered after download" in one_line_error(capsys)


def test_concurrent_builds_fetch_a_file_once(hub, tmp_path) -> None:
    """Workflow jobs build several workloads at once from one download folder: the second
    waits for the first's download and uses it (no second fetch replacing the file)."""
    hub.body_delay_s = 0.5
    path = TASKS["tpo"]
    dest = tmp_path / "raw" / "leval"
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda _: download(LEVAL, path, dest, what="L-Eval tpo"), range(2)))
    assert got == [dest / path] * 2
    assert (dest / path).read_bytes() == hub.files[(LEVAL, path)].data
    blob = f"/blobs/{hub.files[(LEVAL, path)].sha256}?signed=1"
    assert [p for p, _ in hub.requests("GET")].count(blob) == 1
    assert len([p for p, _ in hub.requests("HEAD") if p.endswith(path)]) == 3  # 2 checks + client


def test_a_file_that_does_not_hash_to_its_etag_is_refused(hub, tmp_path, capsys) -> None:
    hub.lying_etag = True  # LFS ETags are the SHA-256 of the bytes: these are not
    code, out = build(tmp_path, "lie.parquet", tasks="tpo")
    assert code == 2 and not out.exists()
    assert "not to its ETag" in one_line_error(capsys)
    local = tmp_path / "raw" / "leval" / TASKS["tpo"]
    assert not local.exists() and not record_path(local.parents[2], TASKS["tpo"]).exists()


def test_a_file_the_hub_does_not_have_is_one_clear_line(hub, tmp_path, capsys) -> None:
    code, out = build(tmp_path, "missing.parquet", tasks="quality")  # not on this server
    assert code == 2 and not out.exists()
    message = one_line_error(capsys)
    assert "cannot download L-Eval quality (L4NLP/LEval/LEval/Exam/quality.jsonl)" in message
    assert "RemoteEntryNotFoundError" in message


def test_an_unreachable_endpoint_fails_fast_and_clearly(tmp_path, monkeypatch, capsys) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    start = time.monotonic()
    code, out = build(tmp_path, "x.parquet", tasks="tpo")
    elapsed = time.monotonic() - start
    assert code == 2 and not out.exists() and elapsed < 10
    message = one_line_error(capsys)
    assert f"the HuggingFace hub is unreachable (127.0.0.1:{port} unreachable" in message
    assert "Pass --data-dir DIR" in message

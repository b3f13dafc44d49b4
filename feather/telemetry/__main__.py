"""Sample NVML around any command: `python -m feather.telemetry sample --out DIR -- cmd ...`.

For scripts that are not Python runners (gpu/*.sh): DIR receives nvml.parquet (where NVML
sampled) and nvml.json (the record, the command, its exit status, and provenance). The exit
status is the command's, so the wrapper can sit in front of any step of a script.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from feather.atomic import write_json_atomic
from feather.provenance import collect_provenance
from feather.telemetry.nvml import default_interval_ms, sample_nvml


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m feather.telemetry")
    commands = parser.add_subparsers(dest="command", required=True)
    sample = commands.add_parser("sample", help="sample NVML while a command runs")
    sample.add_argument("--out", required=True, help="directory for nvml.parquet and nvml.json")
    sample.add_argument(
        "--interval-ms",
        type=float,
        default=None,
        help=f"sampling interval (default {default_interval_ms():g}, $FEATHER_NVML_INTERVAL_MS)",
    )
    sample.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command to run")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("give the command to sample after --")
    out = Path(args.out)
    started = datetime.now(UTC).isoformat(timespec="milliseconds")
    with sample_nvml(out, args.interval_ms) as nvml:
        returncode = subprocess.run(cmd, check=False).returncode
    write_json_atomic(
        out / "nvml.json",
        {
            "command": cmd,
            "returncode": returncode,
            "nvml": nvml.record,
            "provenance": collect_provenance(
                config={"command": cmd}, command=cmd, started_utc=started
            ),
        },
    )
    return returncode


if __name__ == "__main__":
    sys.exit(main())

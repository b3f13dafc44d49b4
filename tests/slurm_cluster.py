"""A real single-node SLURM cluster on this machine, for the tests and by hand.

    python tests/slurm_cluster.py up DIR      # then: export SLURM_CONF=DIR/slurm.conf
    python tests/slurm_cluster.py down DIR

Debian's SLURM 22.05 (slurmctld, slurmd, clients) with munge, plus slurmdbd over MariaDB:
the SLURM executor plugin we pin (1.4.0) learns job states from `sacct`, which needs the
accounting database. What is missing is installed with apt. Everything else lives in DIR -
its own munge key and socket, database, state, spool, logs - on ports picked free, so
nothing else on the machine is touched. Partitions: `cpu` (default) and `gpu`, the names
profiles/slurm uses, both on this one node (which has no GPUs). Needs root (apt, slurmd),
as CI has.
"""

from __future__ import annotations

import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

# slurm-wlm's parts without its recommends, and MariaDB's server and client cores
PACKAGES = ["slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "mariadb-server-core",
            "mariadb-client-core"]
PROGRAMS = ["slurmctld", "slurmd", "slurmdbd", "sbatch", "sacct", "sacctmgr", "munged",
            "mungekey", "mariadbd", "mariadb-install-db", "mariadb"]
PARTITIONS = ("cpu", "gpu")  # profiles/slurm's defaults (FEATHER_SLURM_*PARTITION)
CLUSTER = "feather"
DB_PASSWORD = "feather-test"  # a throw-away database on 127.0.0.1, gone with DIR


class ClusterUnavailable(RuntimeError):
    """SLURM cannot be brought up here; the message says what it needs."""


def _free_ports(names: tuple[str, ...]) -> dict[str, int]:
    """Distinct free ports below the kernel's ephemeral range.

    Asking the kernel for port 0 hands out ephemeral ports, which any outgoing connection
    (slurmdbd to MariaDB, munge, sinfo) may take before the daemon meant to listen there
    binds it; and sockets closed one by one may be handed out twice. A clean-clone test run
    failed that way (slurmd: "protocol_version 1433 not supported" from a localhost peer; the
    node never became idle).
    So the ports come from below the ephemeral range, all held until every one is chosen.
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    held: dict[str, socket.socket] = {}
    try:
        while len(held) < len(names):
            port = rng.randrange(10_000, max(low, 20_000))
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            held[names[len(held)]] = sock
        return {name: sock.getsockname()[1] for name, sock in held.items()}
    finally:
        for sock in held.values():
            sock.close()


def _wait(what: str, check, timeout_s: float = 60.0, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    tail = log.read_text()[-2000:] if log and log.is_file() else ""
    raise ClusterUnavailable(f"{what} did not come up within {timeout_s:.0f} s\n{tail}")


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise ClusterUnavailable("no MemTotal in /proc/meminfo")


class LocalSlurm:
    """The cluster's daemons (munged, mariadbd, slurmdbd, slurmctld, slurmd), all in `root`."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self.run_dir, self.log_dir = self.root / "run", self.root / "log"
        self.conf = self.root / "slurm.conf"
        self.host = socket.gethostname().split(".")[0]

    @property
    def env(self) -> dict[str, str]:
        """What a SLURM client (sbatch, sacct, the plugin) needs to reach this cluster."""
        user = pwd.getpwuid(os.getuid()).pw_name
        return {**os.environ, "SLURM_CONF": str(self.conf), "USER": user}

    # ---- up ----

    def up(self) -> None:
        if os.geteuid() != 0:
            raise ClusterUnavailable(
                "the SLURM test needs root: to install " + ", ".join(PACKAGES) + " with apt "
                "where missing and to run slurmd; run the tests as root (CI does)"
            )
        self._install()
        for sub in ("run", "log", "state", "spool", "munge", "mysql"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        os.chmod(self.run_dir, 0o755)  # munged insists its socket's directory is reachable
        os.chmod(self.root / "munge", 0o700)
        ports = _free_ports(("db", "dbd", "ctld", "slurmd"))
        self._start_munge()
        self._start_database(ports["db"])
        self._write_configs(ports)
        self._start_slurmdbd()
        self._run(["sacctmgr", "-i", "add", "cluster", CLUSTER])
        self._run(["slurmctld"])
        self._run(["slurmd"])
        _wait("the node (sinfo: idle)", self._node_idle, log=self.log_dir / "slurmd.log")

    def _install(self) -> None:
        if all(shutil.which(p) for p in PROGRAMS):
            return
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]
        for cmd in (["apt-get", "update", "-qq"], install):
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            if done.returncode != 0:
                raise ClusterUnavailable(
                    f"`{' '.join(cmd)}` failed (the SLURM test needs Debian's {', '.join(PACKAGES)}"
                    f" and apt's package sources):\n{done.stderr[-2000:]}"
                )
        missing = [p for p in PROGRAMS if not shutil.which(p)]
        if missing:
            raise ClusterUnavailable(f"installed {PACKAGES} but still missing {missing}")

    def _run(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        done = subprocess.run(cmd, capture_output=True, text=True, env=self.env, check=False,
                              timeout=120, **kw)
        if done.returncode != 0:
            raise ClusterUnavailable(f"`{' '.join(cmd)}` failed: {done.stdout}{done.stderr}")
        return done

    def _start_munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        self._run(["mungekey", "--create", f"--keyfile={key}"])
        self._run(["munged", f"--socket={self.run_dir / 'munge.socket'}", f"--key-file={key}",
                   f"--pid-file={self.run_dir / 'munged.pid'}",
                   f"--log-file={self.log_dir / 'munged.log'}",
                   f"--seed-file={self.root / 'munge' / 'seed'}"])

    def _mariadb(self, sql: str) -> None:
        self._run(["mariadb", "--no-defaults", f"--socket={self.run_dir / 'mysqld.sock'}",
                   "-u", "root", "-e", sql])

    def _start_database(self, port: int) -> None:
        data = self.root / "mysql"
        self._run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
                   "--auth-root-authentication-method=socket", "--skip-test-db"])
        subprocess.Popen(
            ["mariadbd", "--no-defaults", f"--datadir={data}", "--user=root",
             f"--socket={self.run_dir / 'mysqld.sock'}", f"--port={port}",
             "--bind-address=127.0.0.1", f"--pid-file={self.run_dir / 'mysqld.pid'}",
             f"--log-error={self.log_dir / 'mysqld.log'}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        _wait("MariaDB", (self.run_dir / "mysqld.pid").is_file, log=self.log_dir / "mysqld.log")
        _wait("MariaDB's socket", (self.run_dir / "mysqld.sock").exists)
        self._mariadb(f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY "
                      f"'{DB_PASSWORD}'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")

    def _write_configs(self, ports: dict[str, int]) -> None:
        munge = self.run_dir / "munge.socket"
        dbd = self.root / "slurmdbd.conf"
        dbd.write_text("\n".join([
            "AuthType=auth/munge", f"AuthInfo=socket={munge}", f"DbdHost={self.host}",
            f"DbdPort={ports['dbd']}", "SlurmUser=root",
            f"LogFile={self.log_dir / 'slurmdbd.log'}", f"PidFile={self.run_dir / 'slurmdbd.pid'}",
            "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1",
            f"StoragePort={ports['db']}", "StorageUser=slurm", f"StoragePass={DB_PASSWORD}",
            "StorageLoc=slurm_acct_db", "",
        ]))
        os.chmod(dbd, 0o600)  # slurmdbd refuses a readable password file
        cpus, memory = os.cpu_count() or 1, int(_memory_mb() * 0.8)
        self.conf.write_text("\n".join([
            f"ClusterName={CLUSTER}", f"SlurmctldHost={self.host}",
            f"SlurmctldPort={ports['ctld']}", f"SlurmdPort={ports['slurmd']}", "SlurmUser=root",
            "AuthType=auth/munge", f"AuthInfo=socket={munge}", "CredType=cred/munge",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}",
            f"SlurmctldPidFile={self.run_dir / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.run_dir / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.log_dir / 'slurmctld.log'}",
            f"SlurmdLogFile={self.log_dir / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core_Memory",
            "ReturnToService=2", "MinJobAge=3600", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/slurmdbd",
            f"AccountingStorageHost={self.host}", f"AccountingStoragePort={ports['dbd']}",
            # clients reach slurmdbd through this munge socket, not the system's default one
            f"AccountingStoragePass={munge}", "AccountingStoreFlags=job_comment",
            f"NodeName={self.host} CPUs={cpus} RealMemory={memory} State=UNKNOWN",
            *(f"PartitionName={name} Nodes={self.host} Default={'YES' if i == 0 else 'NO'} "
              f"MaxTime=INFINITE State=UP" for i, name in enumerate(PARTITIONS)),
            "",
        ]))

    def _start_slurmdbd(self) -> None:
        self._run(["slurmdbd"])

        def answers() -> bool:
            listed = subprocess.run(["sacctmgr", "-n", "list", "cluster"], capture_output=True,
                                    env=self.env, check=False, timeout=30)
            return listed.returncode == 0

        _wait("slurmdbd", answers, log=self.log_dir / "slurmdbd.log")

    def _node_idle(self) -> bool:
        state = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True,
                               text=True, env=self.env, check=False, timeout=30)
        return state.returncode == 0 and state.stdout.split()[:1] == ["idle"]

    # ---- down ----

    def down(self) -> None:
        """Stop every daemon this cluster started (by its pid file), newest first."""
        for name in ("slurmd", "slurmctld", "slurmdbd", "mysqld", "munged"):
            pid_file = self.run_dir / f"{name}.pid"
            try:
                pid = int(pid_file.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.2)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a daemon we started whose parent has gone is reaped by init; a zombie child is not
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("up", "down"):
        print(__doc__, file=sys.stderr)
        return 2
    cluster = LocalSlurm(argv[1])
    if argv[0] == "down":
        cluster.down()
        return 0
    try:
        cluster.up()
    except ClusterUnavailable as exc:
        cluster.down()
        print(f"slurm_cluster: {exc}", file=sys.stderr)
        return 1
    print(f"export SLURM_CONF={cluster.conf}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

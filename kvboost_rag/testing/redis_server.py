"""A throwaway `redis-server` on a free loopback port, for tests, benchmarks and trying the tier
on one machine (Debian's `redis-server` package; `make test` installs it where it can). Needs the
`redis` extra."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis


def free_port(below: int = 55000) -> int:
    """A free loopback port under `below` (a cluster node also listens on its port + 10000)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port < below:
            return port
    raise OSError(f"no free loopback port under {below}")


@dataclass(slots=True)
class LocalRedis:
    """One server process; `stop` and `start` again keep its port (a restart, for fault tests)."""

    port: int = field(default_factory=free_port)
    options: Sequence[str] = ()
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="kvboost-redis-")))
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server is not installed (Debian: apt-get install redis-server)")
        command = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(
            [*command, "--dir", str(self.workdir), *self.options],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until_up(self.port, timeout_s)

    def stop(self) -> None:
        """Killed, as a crash would (no shutdown save)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)


def wait_until_up(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if redis.Redis(port=port, socket_connect_timeout=0.2).ping():
                return
        except (redis.AuthenticationError, redis.ResponseError):
            return  # it answers: it asks for a password
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"redis-server on port {port} did not start in {timeout_s}s") from None
            time.sleep(0.05)


@contextmanager
def local_redis(*options: str) -> Iterator[LocalRedis]:
    server = LocalRedis(options=options)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.workdir, ignore_errors=True)


@contextmanager
def local_redis_or_skip(*options: str) -> Iterator[LocalRedis]:
    """`local_redis` in a test that skips, saying why, where no redis-server is installed (a
    package's tests run wherever it is installed; kvboost-rag's own suite requires the server)."""
    if shutil.which("redis-server") is None:
        import pytest

        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    with local_redis(*options) as server:
        yield server


@contextmanager
def local_cluster(nodes: int = 3) -> Iterator[list[LocalRedis]]:
    """A Redis Cluster of `nodes` primaries on loopback, its slots spread by `redis-cli --cluster create`."""
    servers = [LocalRedis(options=("--cluster-enabled", "yes", "--cluster-node-timeout", "2000")) for _ in range(nodes)]
    try:
        for server in servers:
            server.options = (*server.options, "--cluster-config-file", str(server.workdir / "nodes.conf"))
            server.start()
        addresses = [f"127.0.0.1:{s.port}" for s in servers]
        subprocess.run(
            ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=30,
        )
        deadline = time.monotonic() + 20
        while servers[0].client().cluster("info").get("cluster_state") != "ok":
            if time.monotonic() > deadline:
                raise TimeoutError("the local cluster did not reach cluster_state:ok")
            time.sleep(0.1)
        yield servers
    finally:
        for server in servers:
            server.stop()
            shutil.rmtree(server.workdir, ignore_errors=True)

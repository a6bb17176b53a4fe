"""up / status / down against a real `mlflow server` process on 127.0.0.1.

One server is started for the module (over a stale pid file); the last test stops it, so it
relies on running after the others (pytest keeps file order).
"""

import importlib.util
import json
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlflow_server import ServerConfig, ServerInfo, down, status, up
from search_space.errors import RanknasError


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> ServerConfig:
    return ServerConfig(data_dir=tmp_path_factory.mktemp("mlflow"), port=0)


@pytest.fixture(scope="module")
def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


@pytest.fixture(scope="module")
def server(config: ServerConfig, dead_pid: int) -> Iterator[ServerInfo]:
    _write_pid_file(config, dead_pid)  # left behind by a crashed server
    info = up(config)
    yield info
    down(config)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_health_answers_and_pid_file_is_written(config: ServerConfig, server: ServerInfo) -> None:
    with urllib.request.urlopen(f"{server.uri}/health", timeout=5) as resp:
        assert resp.read().strip() == b"OK"
    assert server.host == "127.0.0.1" and server.uri == f"http://127.0.0.1:{server.port}"
    recorded = json.loads(config.pid_path.read_text())
    assert {"pid", "host", "port", "uri", "started_at"} <= set(recorded)
    assert recorded["pid"] == server.pid
    assert status(config) == server
    assert (config.data_dir / "mlflow.db").exists() and config.log_path.exists()


def test_status_and_down_of_another_port_say_where_the_server_is(
    config: ServerConfig, server: ServerInfo
) -> None:
    other = ServerConfig(data_dir=config.data_dir, port=server.port + 1)
    with pytest.raises(RanknasError, match=f"runs on port {server.port}, not {server.port + 1}"):
        status(other)
    with pytest.raises(RanknasError, match=f"give --port {server.port}"):
        down(other)
    assert status(config) is not None  # still running


def test_status_without_a_port_finds_the_data_dir_s_server_on_its_own(
    config: ServerConfig, server: ServerInfo, capsys: pytest.CaptureFixture
) -> None:
    """`mlflow status --data-dir D` of a server started with --port 5077 was refused: "runs
    on port 5077, not 5000: give --port 5077", though D says which port."""
    from nas.cli import main

    assert main(["mlflow", "status", "--data-dir", str(config.data_dir)]) == 0
    assert f"MLflow server at {server.uri}" in capsys.readouterr().out


def test_status_and_down_of_another_data_dir_say_a_server_answers_on_the_port(
    config: ServerConfig, server: ServerInfo, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`mlflow down --port P` without the --data-dir that started it said "was not
    running", and the server ran on."""
    from nas.cli import main

    elsewhere = ["--port", str(server.port), "--data-dir", str(tmp_path / "other")]
    assert main(["mlflow", "status", *elsewhere]) == 1
    assert main(["mlflow", "down", *elsewhere]) == 1  # not stopped: not a success
    shown = capsys.readouterr().out
    said = (f"the server answering at {server.uri} was started with another data dir: pass "
            f"--data-dir {config.data_dir}")  # fmt: skip
    assert shown.count(said) == 2
    assert status(config) is not None  # still running


def test_up_twice_returns_the_running_server(config: ServerConfig, server: ServerInfo) -> None:
    started = time.monotonic()
    assert up(config) == server
    assert time.monotonic() - started < 5


def test_up_with_other_settings_on_a_running_data_dir_is_refused(
    config: ServerConfig, server: ServerInfo
) -> None:
    other = ServerConfig(data_dir=config.data_dir, port=server.port + 1)
    with pytest.raises(RanknasError, match=str(server.port)):
        up(other)
    with pytest.raises(RanknasError, match="without auth"):
        up(ServerConfig(data_dir=config.data_dir, port=0, auth=True))


def test_port_taken_by_another_program(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(RanknasError, match=f"Port {port} .* already in use"):
            up(ServerConfig(data_dir=tmp_path, port=port))
    assert not (tmp_path / "server.pid").exists()


def test_port_taken_by_another_data_dir_s_server_says_so(
    server: ServerInfo, tmp_path: Path
) -> None:
    """`make demo` in a second clone said "in use by another program" of the first clone's
    own server."""
    with pytest.raises(RanknasError, match="an MLflow server of another data dir") as raised:
        up(ServerConfig(data_dir=tmp_path, port=server.port))
    assert "run `ranknas mlflow down` in that folder" in str(raised.value)


def test_unsupported_backend_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RanknasError, match="not supported"):
        up(ServerConfig(data_dir=tmp_path, port=0, backend_store_uri="mysql://x/y"))


def test_up_replaces_a_stale_pid_file(
    config: ServerConfig, server: ServerInfo, dead_pid: int
) -> None:
    assert server.pid != dead_pid
    assert json.loads(config.pid_path.read_text())["pid"] == server.pid


@pytest.mark.skipif(
    importlib.util.find_spec("psycopg") is not None or importlib.util.find_spec("psycopg2") is None,
    reason="only psycopg2 installed needs the driver chosen explicitly",
)
def test_plain_postgresql_uri_uses_the_installed_psycopg2(tmp_path: Path) -> None:
    config = ServerConfig(data_dir=tmp_path, backend_store_uri="postgresql://u@127.0.0.1/db")
    assert config.backend_store_uri == "postgresql+psycopg2://u@127.0.0.1/db"


def test_stale_pid_file_of_a_dead_process(tmp_path: Path, dead_pid: int) -> None:
    config = ServerConfig(data_dir=tmp_path, port=0)
    _write_pid_file(config, dead_pid)
    assert status(config) is None
    assert down(config) is False
    assert not config.pid_path.exists()


def test_stale_pid_file_whose_pid_was_reused(tmp_path: Path) -> None:
    config = ServerConfig(data_dir=tmp_path, port=0)
    other = subprocess.Popen(["sleep", "30"])
    try:
        _write_pid_file(config, other.pid)
        assert status(config) is None
        assert down(config) is False
        assert other.poll() is None, "down() must not signal a process that is not the server"
        assert not config.pid_path.exists()
    finally:
        other.kill()
        other.wait()


def test_down_stops_the_process_and_removes_the_pid_file(config: ServerConfig) -> None:
    info = status(config)
    assert info is not None
    assert down(config) is True
    assert not config.pid_path.exists()
    assert not _alive(info.pid)
    assert status(config) is None
    assert down(config) is False


def _write_pid_file(config: ServerConfig, pid: int) -> None:
    config.data_dir.mkdir(parents=True, exist_ok=True)
    record = {"pid": pid, "host": "127.0.0.1", "port": 1, "uri": "http://127.0.0.1:1"}
    config.pid_path.write_text(json.dumps({**record, "started_at": "2026-01-01T00:00:00"}))


def test_a_network_bind_without_auth_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RanknasError, match=r"add --auth .* or --insecure"):
        up(ServerConfig(data_dir=tmp_path, host="0.0.0.0", port=0))

"""Start, check and stop a local `mlflow server` process.

The server runs detached in its own session (so it outlives the command that started
it), writes its output to `<data_dir>/server.log` and is recorded in `<data_dir>/server.pid`
(JSON). `up` is idempotent, `down` stops the whole process group.

Defaults keep it light and private: bound to 127.0.0.1, one uvicorn worker, SQLite backend,
artifacts proxied through the server (clients upload over HTTP, so they need no access to
the artifact directory), MLflow's background job runner switched off.

Basic auth (`ServerConfig.auth`): MLflow's `basic-auth` app. Its users live in
`<data_dir>/basic_auth.db` (configured through `<data_dir>/basic_auth.ini`, which this module
writes and points `MLFLOW_AUTH_CONFIG_PATH` at). MLflow 3.17 ships no default admin password:
on the first start the admin user (`admin` unless configured) is created with the password
from `ServerConfig.admin_password` or the `MLFLOW_AUTH_ADMIN_PASSWORD` environment variable
(at least 12 characters); later starts ignore it. The app also needs a fixed CSRF secret,
`MLFLOW_FLASK_SERVER_SECRET_KEY`; unless set in the environment, one is generated once and
kept in `<data_dir>/flask-secret-key`. Clients authenticate with `MLFLOW_TRACKING_USERNAME` /
`MLFLOW_TRACKING_PASSWORD` (or `StudyLogger(username=..., password=...)`). `/health` stays
open without credentials. Good credentials are cached for 60 s per worker (each check costs
a PBKDF2 hash), so a changed password may work for up to a minute. The app needs the
`Flask-WTF` package (`pip install 'mlflow[auth]'`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import http.client
import importlib.util
import ipaddress
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from search_space.errors import RanknasError

_MIN_ADMIN_PASSWORD = 12  # MLflow's password policy
_SUPPORTED_BACKENDS = ("sqlite:///", "postgresql://", "postgresql+")


@dataclass
class ServerConfig:
    """Where and how to run the tracking server; paths are made absolute on creation."""

    data_dir: Path = Path("ranknas-data/mlflow")
    host: str = "127.0.0.1"
    port: int = 5000  # 0: pick a free port
    backend_store_uri: str | None = None  # default: sqlite:///<data_dir>/mlflow.db
    artifacts_destination: str | None = None  # default: <data_dir>/artifacts
    auth: bool = False
    insecure: bool = False  # allow a non-loopback host without auth
    admin_username: str = "admin"
    admin_password: str | None = field(default=None, repr=False)  # first start with auth only
    workers: int = 1
    startup_timeout_s: float = 60.0
    stop_timeout_s: float = 15.0

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).expanduser().resolve()
        if self.backend_store_uri is None:
            self.backend_store_uri = f"sqlite:///{self.data_dir / 'mlflow.db'}"
        self.backend_store_uri = _with_postgres_driver(self.backend_store_uri)
        if self.artifacts_destination is None:
            self.artifacts_destination = str(self.data_dir / "artifacts")

    @property
    def pid_path(self) -> Path:
        return self.data_dir / "server.pid"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"


@dataclass
class ServerInfo:
    """A running server as recorded in its pid file."""

    pid: int
    host: str
    port: int
    uri: str  # what clients use as tracking URI
    started_at: str  # ISO 8601, UTC
    auth: bool = False


def up(config: ServerConfig) -> ServerInfo:
    """Start the server, or return the one this data dir already runs (idempotent)."""
    with _data_dir_lock(config.data_dir):
        running = _running_server(config)
        if running is not None:
            return running
        _check_config(config)
        port = config.port or _free_port(config.host)
        check_port_free(config.host, port)
        return _start(config, port)


def status(config: ServerConfig) -> ServerInfo | None:
    """The recorded server if its process is alive and `/health` answers, else None."""
    info = _read_pid_file(config.pid_path)
    if info is None or not _is_server_process(info.pid) or not _healthy(info.uri):
        return None
    _check_port(config, info)
    return info


def down(config: ServerConfig) -> bool:
    """Stop the recorded server (SIGTERM, then SIGKILL); True if a process was stopped.

    A stale pid file (process gone, or the pid reused by another program) is just removed.
    """
    if not config.pid_path.exists():
        return False
    with _data_dir_lock(config.data_dir):
        info = _read_pid_file(config.pid_path)
        stopped = info is not None and _is_server_process(info.pid)
        if stopped:
            _check_port(config, info)
            _stop_group(info.pid, config.stop_timeout_s)
        config.pid_path.unlink(missing_ok=True)
    return stopped


def answering_elsewhere(config: ServerConfig) -> tuple[str, Path | None] | None:
    """The URI of an MLflow server that answers on `config`'s host and port although its
    data dir runs none (one started with another `--data-dir`), with that data dir where
    a process of this machine shows it; else None."""
    if not config.port:
        return None
    uri = f"http://{_client_host(config.host)}:{config.port}"
    return (uri, _data_dir_serving(config.port)) if _healthy(uri, timeout_s=1.0) else None


def _data_dir_serving(port: int) -> Path | None:
    """The data dir of the `mlflow server` process of this machine on `port`, read off its
    command line (`--artifacts-destination DATA_DIR/artifacts`, as `_server_command` writes)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
            if "server" in args and _flag(args, "--port") == str(port):
                destination = Path(_flag(args, "--artifacts-destination") or ".")
                return destination.parent if destination.name == "artifacts" else None
    return None


def _flag(args: list[str], name: str) -> str | None:
    """The value after `name` in a command line, if any."""
    return args[args.index(name) + 1] if name in args[:-1] else None


def _check_port(config: ServerConfig, info: ServerInfo) -> None:
    """`status`/`down` for a port: the data dir's server must be the one on that port."""
    if config.port and info.port != config.port:
        raise RanknasError(
            f"the MLflow server of {config.data_dir} runs on port {info.port}, not "
            f"{config.port}: give --port {info.port} (or the data dir of the other server)"
        )


@contextlib.contextmanager
def _data_dir_lock(data_dir: Path) -> Iterator[None]:
    """Serialize `up` and `down` on one data dir (two `up` at once would start two servers)."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file by that name, or no permission
        raise RanknasError(f"--data-dir {data_dir}: cannot make it the server's directory "
                           f"({exc.strerror}); give a directory") from None  # fmt: skip
    with (data_dir / "server.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# --- starting -------------------------------------------------------------------------


def _running_server(config: ServerConfig) -> ServerInfo | None:
    """The healthy server recorded for this data dir; None if there is none (stale record)."""
    info = _read_pid_file(config.pid_path)
    if info is None:
        return None
    if not _is_server_process(info.pid):
        config.pid_path.unlink(missing_ok=True)
        return None
    if not _wait_healthy(info.uri, config.startup_timeout_s):
        raise RanknasError(
            f"The MLflow server recorded in {config.pid_path} (pid {info.pid}) is running but "
            f"{_health_url(info.uri)} does not answer. Look at {config.log_path}, then stop it "
            "with `ranknas mlflow down` and start it again."
        )
    wanted = (config.port or info.port, config.auth)
    if (info.port, info.auth) != wanted:
        raise RanknasError(
            f"An MLflow server for {config.data_dir} already runs on port {info.port} "
            f"{'with' if info.auth else 'without'} auth, not as asked (port {wanted[0]}, "
            f"auth {'on' if config.auth else 'off'}). Use it, or stop it first with "
            "`ranknas mlflow down`."
        )
    return info


def _check_config(config: ServerConfig) -> None:
    if not config.backend_store_uri.startswith(_SUPPORTED_BACKENDS):
        raise RanknasError(
            f"Backend store URI {config.backend_store_uri!r} is not supported: use "
            "sqlite:///<absolute path> or postgresql://user:password@host:port/db."
        )
    if config.workers not in (1, 2):
        raise RanknasError(f"workers must be 1 or 2, got {config.workers}.")
    if not config.auth and not config.insecure and not _is_loopback(config.host):
        raise RanknasError(
            f"--host {config.host} would let anyone on the network read and write every run: "
            "add --auth (MLflow's basic-auth app), or --insecure if the network is trusted."
        )
    if config.auth:
        _check_auth_config(config)
    _check_backend_store(config.backend_store_uri)


def _check_backend_store(uri: str) -> None:
    """A database server's backend store answers and is not a study storage, said in one
    line before the server starts: MLflow retried a missing database for a minute, and
    created its tables beside Optuna's in a study's database before failing on them."""
    if uri.startswith("sqlite:"):
        return
    from sqlalchemy import create_engine, inspect
    from sqlalchemy.exc import SQLAlchemyError

    from nas.storage import redact

    engine = None
    try:
        engine = create_engine(uri)
        with engine.connect() as connection:
            tables = set(inspect(connection).get_table_names())
    except (SQLAlchemyError, ImportError, ValueError) as exc:  # a driver missing: ImportError
        said = str(getattr(exc, "orig", None) or exc).split("\n(Background on this error")[0]
        raise RanknasError(
            f"--backend-store-uri {redact(uri)}: cannot open it ({' '.join(said.split())}); "
            "check the URI, and create the database first (`createdb mlflow`)"
        ) from None
    finally:
        if engine is not None:
            engine.dispose()
    if "studies" in tables:  # Optuna's schema (MLflow's own may be beside it already)
        raise RanknasError(
            f"--backend-store-uri {redact(uri)}: holds Optuna's tables (studies, trials): a "
            "study storage; give MLflow a database of its own (`createdb mlflow`)"
        )


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _check_auth_config(config: ServerConfig) -> None:
    if importlib.util.find_spec("flask_wtf") is None:
        raise RanknasError(
            "MLflow's basic-auth app needs the Flask-WTF package: run "
            "`pip install 'mlflow[auth]'`, or start the server without auth."
        )
    users = config.data_dir / "basic_auth.db"
    if users.exists() and users.stat().st_size:
        return  # the admin user exists already; MLflow ignores the bootstrap password
    password = _admin_password(config)
    if not password or len(password) < _MIN_ADMIN_PASSWORD:
        raise RanknasError(
            "The first start of the MLflow server with auth creates the admin user "
            f"'{config.admin_username}' and needs its password (at least {_MIN_ADMIN_PASSWORD} "
            "characters): set MLFLOW_AUTH_ADMIN_PASSWORD in the environment (in Python, "
            "`ServerConfig.admin_password`); its users are kept in basic_auth.db in the "
            "server's --data-dir, whatever --backend-store-uri says"
        )


def _with_postgres_driver(uri: str) -> str:
    """SQLAlchemy 2.1 reads `postgresql://` as psycopg 3; fall back to psycopg2 if that is
    what is installed (the project's dev extra installs psycopg2-binary)."""
    if not uri.startswith("postgresql://") or importlib.util.find_spec("psycopg") is not None:
        return uri
    if importlib.util.find_spec("psycopg2") is None:
        raise RanknasError(
            "A PostgreSQL backend store needs a driver: run `pip install psycopg2-binary` "
            "(or `pip install 'psycopg[binary]'`)."
        )
    return "postgresql+psycopg2://" + uri.removeprefix("postgresql://")


def _admin_password(config: ServerConfig) -> str | None:
    return config.admin_password or os.environ.get("MLFLOW_AUTH_ADMIN_PASSWORD")


def _free_port(host: str) -> int:
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def check_port_free(host: str, port: int, zero_picks: bool = True) -> None:
    """Raise if something listens on host:port (a socket in TIME_WAIT does not count);
    `zero_picks`: the caller takes port 0 as "pick a free one", and the error says so."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE and _healthy(f"http://{_client_host(host)}:{port}", 1):
                raise RanknasError(  # `make demo` in a second clone met the first's server
                    f"Port {port} on {host} is taken by an MLflow server of another data dir "
                    "(another folder's `ranknas mlflow up`?): run `ranknas mlflow down` in that "
                    "folder, or choose another port"
                    + (" (0 picks a free one)." if zero_picks else ".")
                ) from exc
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                raise RanknasError(
                    f"Port {port} on {host} is already in use by another program (or not "
                    "allowed): stop that program or choose another port"
                    + (" (0 picks a free one)." if zero_picks else ".")
                ) from exc
            raise RanknasError(f"Cannot bind {host}:{port}: {exc}. Check the host.") from exc


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _start(config: ServerConfig, port: int) -> ServerInfo:
    config.data_dir.mkdir(parents=True, exist_ok=True)
    if config.backend_store_uri.startswith("sqlite:///"):
        Path(config.backend_store_uri.removeprefix("sqlite:///")).parent.mkdir(
            parents=True, exist_ok=True
        )
    log_offset = config.log_path.stat().st_size if config.log_path.exists() else 0
    with config.log_path.open("ab") as log:
        proc = subprocess.Popen(
            _server_command(config, port),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_server_env(config),
            cwd=config.data_dir,
            start_new_session=True,
        )
    info = ServerInfo(
        pid=proc.pid,
        host=config.host,
        port=port,
        uri=f"http://{_client_host(config.host)}:{port}",
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        auth=config.auth,
    )
    _write_pid_file(config.pid_path, info)
    _await_startup(config, proc, info, log_offset)
    return info


def _server_command(config: ServerConfig, port: int) -> list[str]:
    command = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", config.backend_store_uri,
        "--serve-artifacts",
        "--artifacts-destination", config.artifacts_destination,
        "--host", config.host,
        "--port", str(port),
        "--workers", str(config.workers),
    ]  # fmt: skip
    if config.auth:
        command += ["--app-name", "basic-auth"]
    return command


def _server_env(config: ServerConfig) -> dict[str, str]:
    env = dict(os.environ)
    # The job runner (GenAI evaluation jobs) starts about eight extra processes; not needed.
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    if config.auth:
        env["MLFLOW_AUTH_CONFIG_PATH"] = str(_write_auth_ini(config))
        _private_file(config.data_dir / "basic_auth.db")  # MLflow fills it; others may not read
        env.setdefault("MLFLOW_FLASK_SERVER_SECRET_KEY", _flask_secret(config.data_dir))
        if config.admin_password:
            env["MLFLOW_AUTH_ADMIN_PASSWORD"] = config.admin_password
    return env


def _write_auth_ini(config: ServerConfig) -> Path:
    path = config.data_dir / "basic_auth.ini"
    path.write_text(
        "[mlflow]\n"
        "default_permission = READ\n"
        f"database_uri = sqlite:///{config.data_dir / 'basic_auth.db'}\n"
        f"admin_username = {config.admin_username}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        # Checking a password costs a PBKDF2 hash (tenths of a second on a small machine) on
        # every request; cache good credentials for a minute (per worker).
        "auth_cache_ttl_seconds = 60\n"
    )
    return path


def _private_file(path: Path) -> None:
    """Create `path` if missing, readable and writable by its owner only."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    path.chmod(0o600)


def _flask_secret(data_dir: Path) -> str:
    path = data_dir / "flask-secret-key"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return path.read_text().strip()


def _client_host(host: str) -> str:
    if host in ("0.0.0.0", "", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _await_startup(
    config: ServerConfig, proc: subprocess.Popen, info: ServerInfo, log_offset: int
) -> None:
    """Wait until /health answers; on early exit or timeout, clean up and raise."""
    deadline = time.monotonic() + config.startup_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _fail_start(config, proc, f"exited with code {proc.returncode}", log_offset)
        if _healthy(info.uri):
            return
        time.sleep(0.25)
    why = f"did not answer {_health_url(info.uri)} within {config.startup_timeout_s:.0f} s"
    _fail_start(config, proc, why, log_offset)


def _fail_start(config: ServerConfig, proc: subprocess.Popen, why: str, log_offset: int) -> None:
    if proc.poll() is None:
        _stop_group(proc.pid, config.stop_timeout_s)
    proc.wait()
    config.pid_path.unlink(missing_ok=True)
    tail = _log_tail(config.log_path, log_offset)
    raise RanknasError(
        f"The MLflow server {why}. Last lines of {config.log_path}:\n{tail}\n"
        "Fix the cause above and run `ranknas mlflow up` again."
    )


def _log_tail(path: Path, offset: int, lines: int = 15) -> str:
    with path.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:]) or "(empty)"


# --- health and processes ----------------------------------------------------------------


def check_reachable(uri: str, timeout_s: float = 10) -> None:
    """Raise a `RanknasError` saying how to start it unless the HTTP server at `uri`
    answers (a file or sqlite URI is not checked)."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(_health_url(uri), timeout=timeout_s):
            pass
    except (OSError, http.client.HTTPException) as exc:
        raise RanknasError(
            f"cannot reach the MLflow server at {uri} ({exc}): {start_hint(uri)}, or pass the "
            "right tracking URI"
        ) from None


def start_hint(uri: str) -> str:
    """How to start the server `uri` names, where this machine runs it: `ranknas mlflow up`
    with its port (a plain `mlflow up` starts port 5000)."""
    parts = urllib.parse.urlsplit(uri)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        return f"start the server at {parts.hostname}"
    port = parts.port or 5000
    flag = "" if port == 5000 else f" --port {port}"
    return (
        f"start it with `ranknas mlflow up{flag}` (and the --data-dir, or the "
        "--backend-store-uri, it keeps its runs in)"
    )


def _health_url(uri: str) -> str:
    return uri.rstrip("/") + "/health"


def _healthy(uri: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(_health_url(uri), timeout=timeout_s) as resp:
            return resp.status == 200 and resp.read().strip() == b"OK"
    except (OSError, http.client.HTTPException):
        return False


def _wait_healthy(uri: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not _healthy(uri):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)
    return True


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) from /proc, None if the process does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0], int(fields[2])


def _reap(pid: int) -> None:
    """Collect the exit status if `pid` is our own child (so it does not linger as a zombie)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _is_server_process(pid: int) -> bool:
    """Whether `pid` is a live process that looks like an mlflow server (not a reused pid)."""
    _reap(pid)
    if not Path("/proc").is_dir():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    stat = _proc_stat(pid)
    if stat is None or stat[0] == "Z":
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"mlflow" in cmdline


def _group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is left in the process group."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    if not Path("/proc").is_dir():
        return True
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _proc_stat(int(entry.name))
            if stat is not None and stat[1] == pgid and stat[0] != "Z":
                return True
    return False


def _stop_group(pgid: int, timeout_s: float) -> None:
    """SIGTERM the process group, then SIGKILL what is left after `timeout_s`."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            _reap(pgid)
            if not _group_alive(pgid):
                return
            time.sleep(0.1)


# --- pid file ---------------------------------------------------------------------------------


def _write_pid_file(path: Path, info: ServerInfo) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(info), indent=2) + "\n")
    tmp.replace(path)


def _read_pid_file(path: Path) -> ServerInfo | None:
    try:
        data = json.loads(path.read_text())
        return ServerInfo(**data)
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as exc:
        raise RanknasError(
            f"The pid file {path} is unreadable ({exc}). Stop the server by hand if it runs, "
            "then delete the file."
        ) from exc

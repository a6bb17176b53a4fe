"""The basic-auth option against a real `mlflow server --app-name basic-auth`."""

import importlib.util
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from mlflow import MlflowClient

from mlflow_server import ServerConfig, ServerInfo, StudyLogger, down, up
from nas.commands import flush
from search_space.errors import RanknasError

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("flask_wtf") is None,
    reason="MLflow's basic-auth app needs Flask-WTF (pip install 'mlflow[auth]')",
)

ADMIN_PASSWORD = "not-a-default-password"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    config = ServerConfig(
        data_dir=tmp_path_factory.mktemp("mlflow-auth"),
        port=0,
        auth=True,
        admin_password=ADMIN_PASSWORD,
    )
    info = up(config)
    DATA_DIRS.append(config.data_dir)
    yield info
    down(config)


DATA_DIRS: list[Path] = []


def test_the_user_database_is_private(server: ServerInfo) -> None:
    assert (DATA_DIRS[0] / "basic_auth.db").stat().st_mode & 0o777 == 0o600


def _status(uri: str, auth: str | None = None) -> int:
    request = urllib.request.Request(f"{uri}/api/2.0/mlflow/experiments/search?max_results=1")
    if auth is not None:
        request.add_header("Authorization", auth)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_unauthenticated_requests_are_refused(server: ServerInfo) -> None:
    assert server.auth
    assert _status(server.uri) == 401
    assert _status(server.uri, "Basic YWRtaW46d3JvbmctcGFzc3dvcmQ=") == 401  # admin:wrong-password
    with urllib.request.urlopen(f"{server.uri}/health", timeout=5) as resp:
        assert resp.status == 200  # health stays open for `status`


def test_admin_credentials_work(server: ServerInfo, tmp_path: Path) -> None:
    logger = StudyLogger(server.uri, tmp_path / "outbox", username="admin", password=ADMIN_PASSWORD)
    logger.start_study("auth-study")
    logger.log_trial(0, metrics={"ne": 0.8}, artifacts={"architecture.json": "{}"})
    assert logger.flush(timeout_s=30) == 0 and logger.failures() == []


def test_a_logger_without_credentials_keeps_its_records(
    server: ServerInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    outbox = tmp_path / "outbox"
    logger = StudyLogger(server.uri, outbox)
    logger.start_study("auth-study-2")
    started = time.monotonic()
    assert logger.flush(timeout_s=30) == 1 and logger.failures() == []
    assert time.monotonic() - started < 10, "refused credentials are not retried until time is up"
    assert "401" in logger.last_error or "nauthenticated" in logger.last_error
    assert logger.credentials_refused  # so the end of a study does not retry for 30 s
    flush(logger, SimpleNamespace(study_dir=tmp_path))
    assert "MLflow refused the credentials (HTTP 401/403)" in capsys.readouterr().err
    with_credentials = StudyLogger(server.uri, outbox, username="admin", password=ADMIN_PASSWORD)
    assert with_credentials.flush(timeout_s=10) == 0
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
    assert MlflowClient(server.uri).get_experiment_by_name("auth-study-2") is not None


def test_first_start_without_admin_password_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_AUTH_ADMIN_PASSWORD", raising=False)
    with pytest.raises(RanknasError, match="MLFLOW_AUTH_ADMIN_PASSWORD"):
        up(ServerConfig(data_dir=tmp_path, port=0, auth=True))
    with pytest.raises(RanknasError, match="at least 12"):
        up(ServerConfig(data_dir=tmp_path, port=0, auth=True, admin_password="short"))

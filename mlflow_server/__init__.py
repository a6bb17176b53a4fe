"""ranknas: mlflow_server.

Runs a local MLflow tracking server (`server`: `up`, `status`, `down`) and logs studies to
it (`tracking.StudyLogger`: a study is a parent run, each trial a nested run, buffered in a
durable outbox while the server is unreachable). Knows nothing of models.
"""

from typing import Any

from mlflow_server.server import ServerConfig, ServerInfo, down, status, up

__all__ = ["ServerConfig", "ServerInfo", "StudyLogger", "down", "status", "up"]


def __getattr__(name: str) -> Any:
    # imported on first use: MLflow's client takes seconds to import, and checking or
    # starting a server (`mlflow_server.server`) needs none of it
    if name == "StudyLogger":
        from mlflow_server.tracking import StudyLogger

        return StudyLogger
    raise AttributeError(f"module 'mlflow_server' has no attribute {name!r}")

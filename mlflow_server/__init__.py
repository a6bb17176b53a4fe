"""ranknas: mlflow_server.

Runs a local MLflow tracking server (`server`: `up`, `status`, `down`) and logs studies to
it (`tracking.StudyLogger`: a study is a parent run, each trial a nested run, buffered in a
durable outbox while the server is unreachable). Knows nothing of models.
"""

from mlflow_server.server import ServerConfig, ServerInfo, down, status, up
from mlflow_server.tracking import StudyLogger

__all__ = ["ServerConfig", "ServerInfo", "StudyLogger", "down", "status", "up"]

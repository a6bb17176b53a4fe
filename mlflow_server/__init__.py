"""ranknas: mlflow_server."""

"""Where studies and MLflow records go unless a config says otherwise (no heavy imports:
the CLI parser shows them)."""

DEFAULT_STORAGE = "sqlite:///ranknas-data/studies.db"
DEFAULT_TRACKING_URI = "http://127.0.0.1:5000"

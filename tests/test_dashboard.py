"""`ranknas dashboard` serves optuna-dashboard on a study's storage, with its metric names."""

import json
import socket
import subprocess
import sys
import time
import urllib.request

from nas.config import parse_config
from nas.runner import run_study
from study_helpers import tiny_config, write_config


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_dashboard_serves_the_study(tmp_path):
    config = tiny_config(tmp_path, "shown", budget={"trials": 2})
    run_study(parse_config(config), progress=lambda line: None)
    port = _free_port()
    command = [sys.executable, "-m", "nas.cli", "dashboard", str(write_config(tmp_path, config)),
               "--port", str(port)]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        studies = None
        deadline = time.monotonic() + 60
        while studies is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies") as response:
                    studies = json.load(response)["study_summaries"]
            except OSError:
                time.sleep(0.5)
        assert studies is not None, "the dashboard did not answer"
        (study,) = [s for s in studies if s["study_name"] == "shown"]
        url = f"http://127.0.0.1:{port}/api/studies/{study['study_id']}"
        with urllib.request.urlopen(url) as response:
            detail = json.load(response)
        assert detail["objective_names"] == ["ne"] and len(detail["trials"]) == 2
    finally:
        server.kill()
        server.wait(timeout=30)

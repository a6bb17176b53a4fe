"""`ranknas dashboard` serves optuna-dashboard on a study's storage, with its metric names and
the note that names the study's best trial."""

import json
import socket
import subprocess
import sys
import time
import urllib.request

from nas.commands import summarize_study
from nas.config import parse_config
from nas.leaderboard import describe_best, rows, study_best
from nas.runner import run_study
from study_helpers import tiny_config, write_config


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_dashboard_serves_the_study(tmp_path):
    config = tiny_config(tmp_path, "shown", budget={"trials": 2})
    study = run_study(parse_config(config), progress=lambda line: None)
    summarize_study(None, study, rows(study))  # without MLflow too
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
        (summary,) = [s for s in studies if s["study_name"] == "shown"]
        url = f"http://127.0.0.1:{port}/api/studies/{summary['study_id']}"
        with urllib.request.urlopen(url) as response:
            detail = json.load(response)
        assert detail["objective_names"] == ["ne"] and len(detail["trials"]) == 2
        # the study page opens on the note that names the study's one best trial
        assert f"**Best: {describe_best(study_best(study))}**" in detail["note"]["body"]
    finally:
        server.kill()
        server.wait(timeout=30)


def test_a_mistyped_storage_or_a_busy_port_is_one_error(tmp_path, capsys):
    """A missing SQLite file was created and served empty (studies looked lost); a busy port
    ended in a traceback after the dashboard said it was serving (a user trial)."""
    from nas.cli import main

    missing = tmp_path / "nodir" / "studies.db"
    assert main(["dashboard", f"sqlite:///{missing}", "--port", str(_free_port())]) == 2
    assert f"the storage {missing} does not exist" in capsys.readouterr().err
    assert not missing.parent.exists()
    config = tiny_config(tmp_path, "busy", budget={"trials": 1})
    run_study(parse_config(config), progress=lambda line: None)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["dashboard", str(write_config(tmp_path, config)), "--port", str(port)]) == 2
    out, err = capsys.readouterr()
    assert f"error: Port {port} on 127.0.0.1 is already in use" in err and "Traceback" not in err
    assert "optuna-dashboard for" not in out  # not said to serve

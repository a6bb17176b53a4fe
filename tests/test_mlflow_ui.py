"""The MLflow UI as a person sees it (headless Chromium): after `ranknas search`, the runs
table names every trial with its architecture and shows positive durations, and the views
a user opens can be captured. Needs `make browser` (Debian's chromium and Playwright)."""

import re
import subprocess
import sys

import pytest

from mlflow_server.ui_check import look, parse_duration
from study_helpers import tiny_config, write_config


def test_durations_read_as_the_ui_prints_them():
    assert parse_duration("0.6s") == pytest.approx(0.6)
    assert parse_duration("1.5min") == pytest.approx(90.0)
    assert parse_duration("-20ms") == pytest.approx(-0.02)
    assert parse_duration("") is None


@pytest.mark.slow
def test_the_runs_table_shows_architectures_and_positive_durations(tmp_path, server):
    config = tiny_config(tmp_path, "ui", mlflow={"tracking_uri": server.uri})
    command = [sys.executable, "-m", "nas.cli", "search", str(write_config(tmp_path, config))]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    view = look(server.uri, "ui", tmp_path / "shots")
    assert view.names[0] == "ui"  # the study's parent run, nested runs expanded under it
    trials = view.names[1:]
    assert len(trials) == 3
    assert all(re.fullmatch(r"trial-\d \S+ [\d.]+ MFLOPs", name) for name in trials), trials
    assert all(seconds is not None and seconds > 0 for seconds in view.durations_s), view
    # The study's view (the address `search` printed): its runs by validation NE, with the
    # metric column a person would otherwise have to pick; not the parent (it has no NE).
    assert f"compare them in MLflow: {server.uri}/#/experiments/" in result.stdout
    assert "ui" not in [name for name, _ in view.ranked]
    ranked = [float(ne) for _, ne in view.ranked]
    assert len(ranked) == 3 and ranked == sorted(ranked)
    assert set(view.screenshots) == {"runs", "view", "trial", "architecture", "compare"}
    assert all(path.stat().st_size > 20_000 for path in view.screenshots.values())

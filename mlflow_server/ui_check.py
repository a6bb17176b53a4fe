"""What a person sees in the MLflow UI: a headless-Chromium look at an experiment's runs.

    python -m mlflow_server.ui_check --experiment quickstart --out docs/

Opens the experiment's runs table with the nested runs expanded, the study's view (the
address `ranknas search` prints: its runs by validation NE, with the metric columns and,
once re-evaluated, the seed means beside them), one run's page and its architecture picture, and
the compare view of the nested runs; reads the run names and durations as the table shows
them and takes a screenshot of each view. Playwright drives Debian's `chromium` (`make
browser` installs both).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mlflow_server.tracking import (
    KIND_TAG,
    NAME_COLUMN,
    REPEAT_TAG,
    STUDY_TAG,
    VIEW_RANK,
    study_view_url,
)
from nas.trial_record import DIAGRAM_FILE
from search_space.errors import RanknasError

CHROMIUM = "/usr/bin/chromium"
VIEWPORT = {"width": 1600, "height": 900}
NE_COLUMN = "metrics.`val_ne`"
_UNITS = {"ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


@dataclass
class UiView:
    """The runs table as shown: one entry per row, top to bottom."""

    names: list[str] = field(default_factory=list)
    durations_s: list[float | None] = field(default_factory=list)  # None: shown blank
    # The study's view (`tracking.study_view`): run names and validation NE, top to bottom
    # (sorted by it, or by the seed means once re-evaluated).
    ranked: list[tuple[str, str]] = field(default_factory=list)
    screenshots: dict[str, Path] = field(default_factory=dict)


def parse_duration(text: str) -> float | None:
    """Seconds of a duration as the UI prints it ("0.6s", "1.2min", "2.5h"); None if blank."""
    found = re.fullmatch(r"\s*(-?[\d.]+)\s*(ms|s|min|h|d)\s*", text)
    return float(found.group(1)) * _UNITS[found.group(2)] if found else None


def look(tracking_uri: str, experiment: str, out_dir: Path, chromium: str = CHROMIUM) -> UiView:
    """Read the runs table of `experiment` and screenshot it, the study's view, the
    best-named nested run's page, its architecture picture and the compare view into
    `out_dir` (mlflow-runs.png, -view.png, -trial.png, -architecture.png, -compare.png)."""
    from mlflow import MlflowClient
    from playwright.sync_api import sync_playwright

    if not Path(chromium).exists():
        raise RanknasError(f"{chromium} is missing: run `make browser` (Debian's chromium)")
    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise RanknasError(f"MLflow at {tracking_uri} has no experiment {experiment!r}")
    runs = client.search_runs([found.experiment_id], max_results=200)
    nested = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    out_dir.mkdir(parents=True, exist_ok=True)
    view = UiView()
    base = f"{tracking_uri.rstrip('/')}/#/experiments/{found.experiment_id}"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(f"{base}/runs")
        page.wait_for_selector("text=matching runs", timeout=60_000)
        _close_assistant(page)
        if nested:
            _expand_parents(page, parents=len(runs) - len(nested))
        names = _column(page, NAME_COLUMN)
        durations = _column(page, "duration")
        view.names = [names[i].split("\n")[-1] for i in sorted(names)]
        view.durations_s = [parse_duration(durations.get(i, "")) for i in sorted(names)]
        view.screenshots["runs"] = _shot(page, out_dir / "mlflow-runs.png")
        study = next((r.data.tags[STUDY_TAG] for r in runs if r.data.tags.get(KIND_TAG) == "study"),
                     None)  # fmt: skip
        if study is not None:
            page.goto(study_view_url(tracking_uri, found.experiment_id, study))
            page.wait_for_selector(f"[role='gridcell'][col-id='{NE_COLUMN}']", timeout=60_000)
            names, ne = _column(page, NAME_COLUMN), _column(page, NE_COLUMN)
            view.ranked = [(names[i].split("\n")[-1], ne.get(i, "")) for i in sorted(names)]
            view.screenshots["view"] = _shot(page, out_dir / "mlflow-view.png")
        trials = [r for r in nested if r.data.tags.get(KIND_TAG) == "trial"] or nested
        if nested:  # a trial's pages: the runs of tuned baselines' recipes have no picture
            best = min(trials, key=_shown_first)
            page.goto(f"{base}/runs/{best.info.run_id}")
            page.wait_for_selector(f"text={best.info.run_name}", timeout=60_000)
            view.screenshots["trial"] = _shot(page, out_dir / "mlflow-trial.png")
            page.goto(f"{base}/runs/{best.info.run_id}/artifacts/{DIAGRAM_FILE}")
            page.wait_for_selector(f"img[alt='{DIAGRAM_FILE}']", timeout=60_000)
            _close_assistant(page, switch=False)
            view.screenshots["architecture"] = _shot(page, out_dir / "mlflow-architecture.png")
            ids = ",".join(f'"{r.info.run_id}"' for r in trials[:10])
            page.goto(f'{tracking_uri.rstrip("/")}/#/compare-runs?runs=[{ids}]'
                      f'&experiments=["{found.experiment_id}"]')  # fmt: skip
            page.wait_for_selector("text=Parameters", timeout=60_000)
            view.screenshots["compare"] = _shot(page, out_dir / "mlflow-compare.png")
        browser.close()
    return view


def _close_assistant(page, switch: bool = True) -> None:
    """The assistant side panel opens by default and hides half the table; the side bar
    starts in the GenAI workflow (`switch`: to the model training one)."""
    close = page.locator("button[aria-label*='lose']")
    if close.count():
        close.first.click()
    if not switch:
        return
    training = page.get_by_text("Model training", exact=True)
    if training.count():
        training.first.click()
        page.wait_for_selector("text=matching runs", timeout=60_000)


def _shown_first(run) -> tuple[bool, float, float]:
    """The run whose page is shown: the first by rank, else validation NE, of a run that
    trained (a reused trial points to the one that did), as the study's view lists them."""
    metrics = run.data.metrics
    return (REPEAT_TAG in run.data.tags, metrics.get(VIEW_RANK, float("inf")),
            metrics.get("val_ne", float("inf")))  # fmt: skip


def _expand_parents(page, parents: int) -> None:
    """Parents collapse their nested runs by default: click each parent's expander once the
    table has drawn them, then wait until nested rows are shown."""
    expander = "button[data-component-id*='runnamecellrenderer']"
    page.wait_for_selector(expander, timeout=60_000)
    expand = page.locator(expander)
    for i in range(expand.count()):
        expand.nth(i).click()
    page.wait_for_function(
        f"document.querySelectorAll('[role=row][row-index]').length > {parents}",
        timeout=30_000,
    )


def _column(page, column_id: str) -> dict[int, str]:
    """Row index -> the text of one column's cell (pinned and scrolled columns alike)."""
    cells = page.locator(f"[role='gridcell'][col-id='{column_id}']")
    texts = {}
    for i in range(cells.count()):
        cell = cells.nth(i)
        row = cell.evaluate("e => e.closest('[role=row]').getAttribute('row-index')")
        texts[int(row)] = cell.inner_text()
    return texts


def _shot(page, path: Path) -> Path:
    page.wait_for_timeout(1_500)  # charts and lazy columns settle
    page.screenshot(path=str(path))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracking-uri", default="http://127.0.0.1:5000")
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--out", type=Path, default=Path("docs"))
    parser.add_argument("--chromium", default=CHROMIUM)
    args = parser.parse_args(argv)
    try:
        view = look(args.tracking_uri, args.experiment, args.out, args.chromium)
    except RanknasError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, seconds in zip(view.names, view.durations_s, strict=True):
        shown = "running" if seconds is None else f"{seconds:.1f} s"
        print(f"{name:<60} {shown}")
    for name, ne in view.ranked:
        print(f"{name:<60} val NE {ne or '-'}")
    for path in view.screenshots.values():
        print(f"screenshot: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

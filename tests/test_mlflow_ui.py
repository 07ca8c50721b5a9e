"""The MLflow UI, in a real headless browser: the experiment, the training run and the champion model show up.

The `champion` fixture (conftest.py) serves a finished training run and its registered model through
`mlflow server`. Screenshots of every page land in test-artifacts/mlflow-ui/ (also when a check fails).

MLflow 3's UI, as checked with 3.17: `#/experiments/<id>` opens on the "GenAI" side by default (a trace
dashboard, no runs listed); the runs table is the experiment's "Training runs" tab, `#/experiments/<id>/runs`.
A run page opens on its "Overview" tab, whose "Metrics (N)" table lists every metric with its latest value.
"""

from __future__ import annotations

import contextlib
import pathlib
import re

import pytest
from browser import start_chromium, visible_text, wait_for_text

pytestmark = pytest.mark.slow

SHOTS = pathlib.Path(__file__).resolve().parents[1] / "test-artifacts" / "mlflow-ui"
# Generous: on a busy 2-core machine the first page (a ~10 MB JS bundle) alone can take 30-40 s to render.
PAGE_TIMEOUT_S = 90


def _visit(driver, url: str, shot: str, *texts: str) -> str:
    """Open url, wait until every text is visible, screenshot it (pass or fail); the visible text."""
    driver.get(url)
    try:
        for text in texts:
            wait_for_text(driver, text, PAGE_TIMEOUT_S)
    except BaseException:
        with contextlib.suppress(Exception):  # never hide the real failure behind a screenshot error
            driver.save_screenshot(str(SHOTS / f"{shot}.png"))
        raise
    driver.save_screenshot(str(SHOTS / f"{shot}.png"))
    return visible_text(driver)


def _scroll_to(driver, text: str) -> None:
    """Scroll the innermost element showing text into view (for the screenshot; the checks read all the text)."""
    driver.execute_script(
        """const els = [...document.querySelectorAll('body *')].filter(e => e.innerText?.includes(arguments[0]));
        const leaf = els.find(e => ![...e.children].some(c => c.innerText?.includes(arguments[0])));
        if (leaf) leaf.scrollIntoView({block: 'center'});""",
        text,
    )


def _version_rows(driver) -> list[str]:
    """The visible text of each row of the page's tables (the registered model's versions table)."""
    return driver.execute_script("return [...document.querySelectorAll('[role=row], tr')].map(r => r.innerText);")


def test_mlflow_ui_shows_experiment_run_and_champion(champion):
    SHOTS.mkdir(parents=True, exist_ok=True)
    uri = champion.uri.rstrip("/")
    experiment = f"{uri}/#/experiments/{champion.experiment_id}"

    driver = start_chromium()
    try:
        # (a) The experiment: its page, then its runs table (the "Training runs" tab) with our run.
        _visit(driver, experiment, "1-experiment", champion.experiment)
        _visit(driver, f"{experiment}/runs", "2-experiment-runs", champion.experiment, champion.run_name)

        # (b) The run: its Overview tab lists the metrics, val_bleu among them.
        run_page = f"{experiment}/runs/{champion.run_id}"
        text = _visit(driver, run_page, "3-run", champion.run_name, "val_bleu")
        _scroll_to(driver, "val_bleu")  # the metrics table is below the fold
        driver.save_screenshot(str(SHOTS / "3-run-metrics.png"))
        assert re.search(r"Metrics \(\d+\)", text), f"no metrics table on the run page:\n{text[:2000]}"

        # (c) The registered model: its name, and the version that carries the `champion` alias.
        version = re.compile(rf"\bVersion\s+{re.escape(champion.version)}\b")
        alias = re.compile(r"@\s*champion\b")  # the alias tag reads "@\xa0champion"
        text = _visit(driver, f"{uri}/#/models/{champion.model_name}", "4-model", champion.model_name, "champion")
        assert version.search(text), f"version {champion.version} not listed:\n{text[:2000]}"
        rows = _version_rows(driver)
        assert any(version.search(row) and alias.search(row) for row in rows), (
            f"no version row shows both 'Version {champion.version}' and '@ champion'; rows: {rows}"
        )
    finally:
        driver.quit()

"""docs/images/: screenshots of the MLflow UI after a demo, taken in headless Chromium (`make docs-images`).

    python tools/docs_images.py                  # a fresh `nmt demo --quick` in a temporary directory
    python tools/docs_images.py --workdir DIR    # the MLflow store of a demo already run there (nmt demo --workdir DIR)

It serves the demo's store with `mlflow ui` on 127.0.0.1, as the demo's last lines tell a user to,
and saves one picture per view: the sweep's runs, the trials compared, the best trial's learning
curves and an attention map, the sweep's val-BLEU-per-setting plot, the registered model. Needs
Chromium and chromedriver (`make browser`).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "images"
sys.path.insert(0, str(ROOT / "tests"))  # the headless-browser helpers the UI test uses
PAGE_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(store: str, log: Path) -> tuple[subprocess.Popen, str]:
    """`mlflow ui` on a free local port; returns the process and its URL once it answers."""
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store,
                                "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                               stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True, cwd=log.parent,
                               env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=5)
            return process, url
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                sys.exit(f"mlflow ui did not start; its log: {log}")
            time.sleep(1)


def _close_assistant(driver) -> None:
    """Close MLflow's assistant side panel, which would cover a third of every picture."""
    driver.execute_script("document.querySelector('button[aria-label=Close]')?.click()")


def _expand_parent_runs(driver) -> None:
    """Unfold the sweep's parent run in the runs table, so its trials show under it."""
    driver.execute_script("document.querySelectorAll('button[data-component-id*=runnamecellrenderer]')"
                          ".forEach(b => b.click())")


def _runs_columns(experiment: str, columns: list[str]):
    """A set-up for the runs table: these columns (e.g. "tags.`stopped_early`"), narrow so that all fit, then the
    page loaded again.

    The column picker is a menu of checkboxes per column; the experiment page keeps the choice in
    localStorage under its own key, and reads it as it loads.
    """
    key = f'MLflowLocalStorage-1.1-ExperimentPage-["{experiment}"]-ReactComponentState'

    def setup(driver) -> None:
        driver.execute_script("const state = JSON.parse(localStorage.getItem(arguments[0]) || '{}');"
                              "state.selectedColumns = arguments[1];"
                              "state.columnWidths = Object.fromEntries(arguments[1].map(c => [c, 105]));"
                              "localStorage.setItem(arguments[0], JSON.stringify(state)); location.reload();",
                              key, columns)
        time.sleep(2)

    return setup


def _pick(driver, label: str, *names: str) -> None:
    """Set the multi-select after `label` (e.g. "Parameters:" of the compare view) to names."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    find = ("const label = [...document.querySelectorAll('*')].find(e => e.innerText?.trim() === arguments[0]);"
            "return [...document.querySelectorAll('.du-bois-light-select')]"
            ".find(s => label.compareDocumentPosition(s) & Node.DOCUMENT_POSITION_FOLLOWING)")
    while remove := driver.execute_script(find, label).find_elements(
            By.CSS_SELECTOR, ".du-bois-light-select-selection-item-remove"):
        remove[0].click()
    field = driver.execute_script(find, label).find_element(By.CSS_SELECTOR, "input")
    for name in names:
        field.click()
        field.send_keys(name)
        time.sleep(1)  # the option list filters as one types; click the exact one
        driver.execute_script("[...document.querySelectorAll('.du-bois-light-select-item-option')]"
                              ".find(o => o.innerText.trim() === arguments[0])?.click()", name)
    field.send_keys(Keys.ESCAPE)


def _shoot(driver, url: str, name: str, *texts: str, scroll_to: str | None = None, before=None,
           setup=None) -> None:
    """Open url (then call setup), wait for every text, tidy the page (and call before), save docs/images/<name>.png."""
    from browser import wait_for_text

    driver.get("about:blank")  # a new page load: the app ignores a hash change within one run's artifacts
    driver.get(url)
    if setup:
        wait_for_text(driver, texts[0], PAGE_TIMEOUT_S)
        setup(driver)
    for text in texts:
        wait_for_text(driver, text, PAGE_TIMEOUT_S)
    time.sleep(2)
    _close_assistant(driver)
    if before:
        before(driver)
    if scroll_to:
        driver.execute_script(
            """const els = [...document.querySelectorAll('body *')].filter(e => e.innerText?.includes(arguments[0]));
            const leaf = els.find(e => ![...e.children].some(c => c.innerText?.includes(arguments[0])));
            if (leaf) leaf.scrollIntoView({block: 'start'});""", scroll_to)
    time.sleep(3)  # charts draw after their data arrives
    tmp = OUT / f".{name}.tmp.png"  # selenium wants the extension
    driver.save_screenshot(str(tmp))
    os.replace(tmp, OUT / f"{name}.png")
    print(f"docs/images/{name}.png  <- {url}")


def take(store: str, workdir: Path) -> None:
    """Every screenshot of the demo in store."""
    from browser import start_chromium
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    champion = client.get_model_version_by_alias("transformer-nmt-demo-en-de", "champion")
    best = client.get_run(champion.run_id)
    experiment = best.info.experiment_id
    sweep = client.get_run(best.data.tags["mlflow.parentRunId"])
    trials = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{sweep.info.run_id}'")
    plots = [a.path for a in client.list_artifacts(sweep.info.run_id) if a.path.startswith("val_bleu_vs_")]
    attention = [a.path for a in client.list_artifacts(best.info.run_id, "attention")]
    OUT.mkdir(parents=True, exist_ok=True)
    process, url = _serve(store, workdir / "mlflow-ui.log")
    driver = start_chromium()
    try:
        base = f"{url}/#/experiments/{experiment}"
        swept = [key.removeprefix("param.") for key in best.data.tags if key.startswith("param.")]
        # What a sweep's table is read for: the swept values, each trial's best BLEU, which ASHA stopped.
        columns = [*(f"params.`{key}`" for key in swept), "metrics.`best_val_bleu`", "tags.`stopped_early`"]
        _shoot(driver, f"{base}/runs", "sweep-runs", sweep.info.run_name, before=_expand_parent_runs,
               setup=_runs_columns(experiment, columns))
        ids = urllib.parse.quote(json.dumps([t.info.run_id for t in trials]))

        def heads_layers_warmup_against_bleu(driver):
            _pick(driver, "Parameters:", *swept)
            _pick(driver, "Metrics:", "best_val_bleu")  # the trial's best, not its last (averaged) value

        _shoot(driver, f"{url}/#/compare-runs?runs={ids}&experiments={urllib.parse.quote(json.dumps([experiment]))}",
               "compare-trials", "Parallel Coordinates Plot", scroll_to="Parallel Coordinates Plot",
               before=heads_layers_warmup_against_bleu)
        run = f"{base}/runs/{best.info.run_id}"
        # The run's own learning_curves.png (loss and val BLEU side by side) rather than MLflow's grid of
        # every metric, where the val_bleu chart falls below the fold.
        _shoot(driver, f"{run}/artifacts/learning_curves.png", "learning-curves", "learning_curves.png")
        if attention:
            _shoot(driver, f"{run}/artifacts/{attention[0]}", "attention-map", attention[0].rsplit("/", 1)[-1])
        if plots:
            _shoot(driver, f"{base}/runs/{sweep.info.run_id}/artifacts/{plots[0]}", "sweep-val-bleu", plots[0])
        name = "transformer-nmt-demo-en-de"
        _shoot(driver, f"{url}/#/models/{name}", "registered-model", name, "champion")
    finally:
        driver.quit()
        process.terminate()
        process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", help="a directory `nmt demo --workdir` has run in (default: a fresh quick demo)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.workdir or tmp).resolve()
        if not args.workdir:
            subprocess.run([sys.executable, "-m", "pipeline", "demo", "--quick", "--workdir", str(workdir)],
                           check=True, cwd=ROOT)
        take(f"sqlite:///{workdir / 'mlflow.db'}", workdir)


if __name__ == "__main__":
    main()

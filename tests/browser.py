"""Headless Chromium through Selenium, for tests that look at a web UI (e.g. MLflow's).

Uses Debian's packages (`make browser` installs them): /usr/bin/chromium and /usr/bin/chromedriver.
Without them the test skips, except in CI (CI=true), where it fails.
"""

from __future__ import annotations

import os
import pathlib
import time

import pytest

CHROMIUM = pathlib.Path("/usr/bin/chromium")
CHROMEDRIVER = pathlib.Path("/usr/bin/chromedriver")
FLAGS = ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000")


def _require_browser() -> None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if not missing:
        return
    reason = f"headless browser not installed ({', '.join(missing)} missing); run `make browser`"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true, so this is a failure, not a skip)")
    pytest.skip(reason)


def start_chromium(page_load_timeout_s: float = 60):
    """A headless Chromium WebDriver; the caller must quit() it (in a finally)."""
    _require_browser()
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:  # the `dev` extra has it
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"selenium not installed ({exc}); pip install -e '.[dev]'")

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(page_load_timeout_s)
    driver.set_script_timeout(page_load_timeout_s)
    return driver


def visible_text(driver) -> str:
    """The page's visible text (document.body.innerText); '' before the body exists."""
    return driver.execute_script("return document.body ? document.body.innerText : '';") or ""


def wait_for_text(driver, text: str, timeout_s: float = 60, poll_s: float = 0.5) -> str:
    """Poll until `text` is visible on the page; return the visible text. AssertionError on timeout."""
    deadline = time.monotonic() + timeout_s
    seen = ""
    while True:
        seen = visible_text(driver)
        if text in seen:
            return seen
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"{text!r} not visible at {driver.current_url} after {timeout_s:g} s; "
                f"visible text (first 2000 chars):\n{seen[:2000]}"
            )
        time.sleep(poll_s)

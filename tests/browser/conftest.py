"""The web console in a real browser: Debian's ``chromium`` driven headless through
``chromium-driver`` (chromedriver) with Selenium, against real clusters.

``make env`` (scripts/bootstrap.sh) installs chromium and chromium-driver where they are
missing; without them (or without selenium) every test here skips and says so. Each test
saves screenshots of the pages it visits under ``tests/browser/screenshots/`` (not
committed) for a person to look at.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The real-cluster helpers live beside the cluster tests, imported there as top-level modules.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "cluster"))


def _chromium() -> tuple[str, str]:
    """(browser binary, chromedriver) or a skip naming what is missing."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("selenium is not installed: `make env` installs the test dependencies")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        missing = " and ".join(
            name
            for name, found in (("chromium", browser), ("chromium-driver", driver))
            if found is None
        )
        pytest.skip(
            f"{missing} not found: the console's browser tests need Debian's chromium and "
            "chromium-driver (`make env` installs them; or apt-get install chromium "
            "chromium-driver)"
        )
    return browser, driver


@pytest.fixture(scope="module")
def chrome() -> Iterator[Any]:
    """One headless Chromium per module (it starts in well under a second)."""
    browser, driver_path = _chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in CI containers
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    try:
        yield driver
    finally:
        driver.quit()

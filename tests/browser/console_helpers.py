"""The console's browser tests' helper: one headless Chromium on one node's console, with
waits that poll under a deadline and screenshots under ``tests/browser/screenshots/``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

SCREENSHOTS = Path(__file__).resolve().parent / "screenshots"
WAIT = 60.0  # seconds a page gets to show what a test waits for (2 busy cores)


class Console:
    """One headless Chromium on one node's console (``base``: http://127.0.0.1:PORT)."""

    def __init__(self, driver: Any, base: str) -> None:
        self.driver = driver
        self.base = base

    def open(self, page: str = "") -> None:
        self.driver.get(f"{self.base}/ui/" + (f"#/{page}" if page else ""))

    def find(self, css: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def wait(self, cond: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
        """Polls ``cond`` until it returns something true (its value); fails naming ``what``
        and the page's visible text."""
        from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
        from selenium.webdriver.support.ui import WebDriverWait

        def check(_: Any) -> Any:
            try:
                return cond()
            except (StaleElementReferenceException, LookupError):
                return None  # the page redrew under the check: look again

        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.2).until(check)
        except WebDriverException:
            text = self.driver.find_element("tag name", "body").text[:2000]
            raise AssertionError(
                f"the console did not show {what} in {timeout:g} s:\n{text}"
            ) from None

    def login(self, user: str, password: str) -> None:
        self.open()
        self.wait(lambda: self.find("#login-user").is_displayed(), "the login form")
        self.find("#login-user").clear()
        self.find("#login-user").send_keys(user)
        self.find("#login-password").clear()
        self.find("#login-password").send_keys(password)
        self.find("#login-submit").click()

    def shot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def errors(self) -> list[str]:
        """The browser console's errors (a failed script, a refused request)."""
        return [e["message"] for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]

"""Debian's headless Chromium driven by selenium, for the tests that look at a page."""

import os
import shutil
import time

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run")


def headless_chromium(profile, *flags, console=True):
    """A selenium driver of CHROMIUM with FLAGS and then ``flags``, its user profile in the
    folder ``profile``; console: keep every console entry for ``driver.get_log("browser")``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    os.environ["SE_OFFLINE"] = "true"       # selenium-manager must never download anything
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (*FLAGS, *flags, f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    if console:
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=DRIVER), options=opts)


def severe(driver):
    """The console's SEVERE entries: uncaught exceptions and console.error calls."""
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def open_snippet(driver, folder, snippet, ready, timeout=10.0):
    """Put the HTML ``snippet`` in a page in ``folder``, open it, and wait until the element
    the CSS selector ``ready`` picks is marked data-ready by its script. Returns it."""
    page = folder / "snippet.html"
    page.write_text(f"<!DOCTYPE html><html><body>{snippet}</body></html>", encoding="utf-8")
    driver.get(page.as_uri())
    end = time.monotonic() + timeout
    while not driver.execute_script(
            "return document.querySelector(arguments[0]).dataset.ready", ready):
        assert time.monotonic() < end, f"{ready} never became ready"
        time.sleep(0.05)
    return driver.find_element("css selector", ready)

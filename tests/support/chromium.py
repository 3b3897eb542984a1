"""Debian's headless Chromium driven by selenium, for the tests that look at a page."""

import os
import shutil

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

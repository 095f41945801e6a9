"""The /ui trace viewer in a real browser: Debian's chromium + chromedriver, headless, driven by Selenium."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from ebmrag.store.patients import SQLiteStore
from tests.serve.conftest import Live, demo_engine, running
from tests.serve.test_service import RECORD

pytestmark = pytest.mark.model
# docs/ui.png is refreshed with: EBMRAG_UI_SCREENSHOT=docs/ui.png pytest tests/serve/test_ui.py
SCREENSHOT = os.environ.get("EBMRAG_UI_SCREENSHOT", "")


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert binary and driver, "install Debian's chromium and chromium-driver (make browser)"
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1600"):
        options.add_argument(flag)
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    chrome.implicitly_wait(15)  # a lookup right after a click waits for the next page instead of reading the old
    try:
        yield chrome
    finally:
        chrome.quit()


def test_sign_in_open_a_patient_ask_and_follow_a_citation(tmp_path: Path, resources: Any, context_packer: Any,
                                                          demo_voter: Any, browser: webdriver.Chrome) -> None:
    """One store is enough here: the viewer reads through the same store calls as the JSON routes."""
    with running(SQLiteStore(tmp_path / "s.sqlite"), *demo_engine(resources, context_packer, demo_voter)) as live:
        walk_through(live, browser)


def walk_through(live: Live, browser: webdriver.Chrome) -> None:
    key = live.key("t", "service")
    hostile = {"id": "xss", "text": "<script>document.title='owned'</script>Bed rest.", "section": "Notes"}
    with live.client(key) as http:
        http.put("/v1/patients/p1", json=dict(RECORD, fragments=[*RECORD["fragments"], hostile]))
    browser.get(live.url + "/ui")
    browser.find_element(By.NAME, "key").send_keys(key)
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    browser.find_element(By.NAME, "pid").send_keys("p1")
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    rows = browser.find_elements(By.CSS_SELECTOR, "tr[id^='f-']")
    assert len(rows) == 4 and "T1" in rows[0].text and browser.title != "owned"
    assert "<script>" in browser.find_element(By.ID, "f-xss").text, "record markup is shown as text, never run"
    browser.find_element(By.NAME, "question").send_keys("Which antibiotic is safe for his wound infection?")
    browser.find_element(By.XPATH, "//button[text()='Ask']").click()
    answer = browser.find_element(By.ID, "answer")
    assert "anaphylaxis to penicillin" in answer.text.lower()
    assert browser.find_elements(By.CSS_SELECTOR, "#packed tr[id^='line-']")
    assert "reason" in browser.find_element(By.ID, "dropped").text
    link = answer.find_element(By.CSS_SELECTOR, "a[href^='#line-']")
    assert browser.find_element(By.ID, link.get_attribute("href").split("#")[1])  # the cited line is on the page
    if SCREENSHOT:
        assert browser.save_screenshot(SCREENSHOT)
    browser.delete_all_cookies()
    browser.get(live.url + "/ui/patients/p1")
    assert "the API key is not valid" in browser.page_source and "Creatinine" not in browser.page_source

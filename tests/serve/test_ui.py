"""The /ui trace viewer in a real browser: Debian's chromium + chromedriver, headless, driven by Selenium."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from ebmrag.serve.ui import CSP, NOT_VALID
from ebmrag.store.access import create_key
from ebmrag.store.patients import PatientStore, SQLiteStore
from ebmrag.store.sessions import SESSIONS_PER_KEY, UiSessions
from tests.serve.conftest import Live, demo_engine, running
from tests.serve.test_service import RECORD, problem

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
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # CSP violations are reported here
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
    browser.find_element(By.XPATH, "//button[text()='Sign in']").click()
    browser.find_element(By.NAME, "pid").send_keys("p1")  # waits for the signed-in page
    cookies = {c["name"]: c for c in browser.get_cookies()}
    assert key not in str(cookies) and cookies["ebmrag_session"]["httpOnly"], "the browser holds a session, not the key"
    browser.find_element(By.XPATH, "//button[text()='Open']").click()
    rows = browser.find_elements(By.CSS_SELECTOR, "tr[id^='f-']")
    assert len(rows) == 4 and "T1" in rows[0].text and browser.title != "owned"
    tier_colour = browser.find_element(By.CSS_SELECTOR, ".tier").value_of_css_property("background-color")
    assert tier_colour == "rgba(179, 38, 30, 1)", "the inline styles still apply under the page's CSP"
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
    blocked = [m["message"] for m in browser.get_log("browser") if "Content Security Policy" in m["message"]]
    assert not blocked, "the pages need nothing their CSP forbids"
    browser.find_element(By.XPATH, "//button[text()='Sign out']").click()
    assert browser.find_element(By.NAME, "key") and "ebmrag_session" not in {c["name"] for c in browser.get_cookies()}
    browser.get(live.url + "/ui/patients/p1")
    assert browser.find_element(By.NAME, "key") and "Creatinine" not in browser.page_source


# ---------------------------------------------------------------- the session, CSRF and headers (issue 32, item 8)
SESSION = "ebmrag_session"


def form_token(page: str) -> str:
    """The form's synchroniser token ("" when it has none)."""
    found = re.search(r'name=csrf value="([^"]+)"', page)
    return found.group(1) if found else ""


def sign_in(http: httpx.Client, key: str, **headers: str) -> httpx.Response:
    """What a browser does: load the form (it sets the pre-session cookie), post it back with its token."""
    token = form_token(http.get("/ui").text)
    return http.post("/ui/login", data={"key": key, "csrf": token}, headers=headers)


def browser_like(live: Live, token: str = "") -> httpx.Client:
    """A client with nothing but (optionally) one session cookie: a copied, replayed cookie."""
    return httpx.Client(base_url=live.url, timeout=60, headers={"Cookie": f"{SESSION}={token}"} if token else {})


def signed_in_page(response: httpx.Response) -> bool:
    return response.status_code == 200 and "Sign out" in response.text and 'name=key' not in response.text


def sign_in_page(response: httpx.Response) -> bool:
    return 'name=key' in response.text and "Sign out" not in response.text


def session_rows(store: PatientStore) -> list[tuple[Any, ...]]:
    with store.transaction() as cur:
        return list(store._execute(cur, "SELECT token_digest, key_id, created, expires, last_seen "
                                        "FROM ui_sessions").fetchall())


def with_patient(live: Live) -> str:
    key = live.key("t", "service")
    with live.client(key) as feed:
        feed.put("/v1/patients/p1", json=RECORD)
    return key


def test_the_cookie_is_a_session_token_not_the_key_and_changes_at_each_sign_in(serve: Callable[..., Live]) -> None:
    live = serve()
    key = with_patient(live)
    tokens = []
    for _ in range(2):
        with browser_like(live) as http:
            answer = sign_in(http, key)
            assert answer.status_code == 303 and answer.headers["location"] == "/ui"
            set_cookies = answer.headers.get_list("set-cookie")
            assert key not in " ".join(set_cookies) and key.split("_", 2)[2] not in " ".join(set_cookies)
            session = next(c for c in set_cookies if c.startswith(SESSION + "="))
            for attribute in ("HttpOnly", "SameSite=strict", "Path=/ui", "Max-Age=28800"):
                assert attribute.lower() in session.lower(), (attribute, session)
            assert "secure" not in session.lower(), "plain http on 127.0.0.1: not Secure unless configured"
            tokens.append(answer.cookies[SESSION])
            assert len(tokens[-1]) >= 43 and signed_in_page(http.get("/ui"))
            assert "Creatinine" in http.get("/ui/patients/p1").text
    assert tokens[0] != tokens[1]
    rows = session_rows(live.store)
    assert {r[0] for r in rows} == {hashlib.sha256(t.encode()).hexdigest() for t in tokens}, "only digests are kept"
    assert not any(t in str(rows) for t in tokens) and key.split("_", 2)[2] not in str(rows)
    with browser_like(serve(ui_secure_cookie=True)) as http:  # TLS ends at a proxy: Secure all the same
        assert "secure" in http.get("/ui").headers["set-cookie"].lower()


def test_a_session_ends_at_its_absolute_and_idle_limits(serve: Callable[..., Live]) -> None:
    short_lived, idle_briefly = serve(ui_session_hours=1 / 3600), serve(ui_idle_minutes=1 / 60)
    key = with_patient(short_lived)
    for live in (short_lived, idle_briefly):
        with browser_like(live) as http:
            token = sign_in(http, key).cookies[SESSION]
        time.sleep(1.3)
        with browser_like(live, token) as replayed:  # the cookie replayed as-is: the server must refuse it
            assert sign_in_page(replayed.get("/ui"))
            stale = replayed.get("/ui/patients/p1")
            assert stale.status_code == 401 and sign_in_page(stale) and "Creatinine" not in stale.text
        assert hashlib.sha256(token.encode()).hexdigest() not in {r[0] for r in session_rows(live.store)}


def test_use_keeps_a_session_alive_until_its_absolute_limit(store: PatientStore) -> None:
    """The store's side, at chosen moments: idle time counts from the last use, the absolute limit never moves."""
    sessions, start = UiSessions(store), datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
    idle, lifetime = timedelta(minutes=30), timedelta(hours=8)
    token = sessions.start("k1", lifetime, start)
    found = sessions.find(token)
    assert found is not None and found.key_id == "k1" and found.expires == start + lifetime
    assert found.alive(start + timedelta(minutes=29), idle) and not found.alive(start + timedelta(minutes=31), idle)
    for minutes in range(20, 8 * 60, 20):
        sessions.touch(token, start + timedelta(minutes=minutes))
    found = sessions.find(token)
    assert found is not None and found.alive(start + lifetime - timedelta(minutes=1), idle)
    assert not found.alive(start + lifetime, idle)
    assert sessions.end_expired(idle, start + timedelta(minutes=10)) == 0
    assert sessions.end_expired(idle, start + lifetime) == 1 and sessions.find(token) is None
    tokens = [sessions.start("k2", lifetime, start + timedelta(seconds=n)) for n in range(SESSIONS_PER_KEY + 5)]
    assert [sessions.find(t) is not None for t in tokens] == [False] * 5 + [True] * SESSIONS_PER_KEY, \
        "signing in in a loop ends the key's oldest sessions"


def test_signing_out_ends_the_session_on_the_server(serve: Callable[..., Live]) -> None:
    live = serve()
    key = with_patient(live)
    with browser_like(live) as http:
        token = sign_in(http, key).cookies[SESSION]
        csrf = form_token(http.get("/ui").text)
        forged = http.post("/ui/logout", data={"csrf": "x" * len(csrf)})
        assert forged.status_code == 403 and signed_in_page(http.get("/ui")), "a forged sign-out ends nothing"
        out = http.post("/ui/logout", data={"csrf": csrf})
        assert out.status_code == 303
        cleared = next(c for c in out.headers.get_list("set-cookie") if c.startswith(SESSION + "="))
        assert "max-age=0" in cleared.lower() and "path=/ui" in cleared.lower()
    assert session_rows(live.store) == []
    with browser_like(live, token) as replayed:
        assert sign_in_page(replayed.get("/ui"))
        assert replayed.get("/ui/patients/p1").status_code == 401
    actions = [r[5] for r in live.store.audit_rows()]
    assert "ui_sign_in" in actions and "ui_sign_out" in actions


def test_revoking_or_expiring_the_key_ends_its_sessions(serve: Callable[..., Live]) -> None:
    live = serve()
    key = with_patient(live)
    reader = live.key("t", "clinician")
    with browser_like(live) as http:
        sign_in(http, reader)
        assert "Creatinine" in http.get("/ui/patients/p1").text
        live.store.revoke(reader.split("_")[1])
        refused = http.get("/ui/patients/p1")
        assert refused.status_code == 401 and sign_in_page(refused) and "Creatinine" not in refused.text
        assert sign_in_page(http.get("/ui"))
    assert [r[1] for r in session_rows(live.store)] == [], "the dead session is removed"
    with browser_like(live) as http:
        assert sign_in(http, key).status_code == 303, "other keys are untouched"
    brief = create_key(live.store, "t", "clinician", expires=datetime.now(UTC) + timedelta(seconds=2))[0]
    with browser_like(live) as http:
        sign_in(http, brief)
        assert "Creatinine" in http.get("/ui/patients/p1").text
        time.sleep(2.2)
        assert http.get("/ui/patients/p1").status_code == 401, "a key that expires takes its sessions with it"


CROSS_SITE = {"another site's Origin": {"Origin": "http://evil.example"}, "a null Origin": {"Origin": "null"},
              "another port's Origin": {"Origin": "http://127.0.0.1:1"},
              "cross-site fetch metadata": {"Sec-Fetch-Site": "cross-site"},
              "same-site fetch metadata": {"Sec-Fetch-Site": "same-site"}}
TOKEN_FORGERIES = ("no token", "a wrong token", "another form's token")


def forged(forgery: str, token: str, others: str) -> tuple[dict[str, str], dict[str, str]]:
    """(form fields, headers) of a forgery: the right token sent from another site, or a missing or bad token."""
    if forgery in CROSS_SITE:
        return {"csrf": token}, CROSS_SITE[forgery]
    return ({} if forgery == "no token" else {"csrf": "A" * 43 if forgery == "a wrong token" else others}), {}


def refusals(live: Live) -> list[tuple[str, str, str]]:
    return [(r[2], r[4], r[5]) for r in live.store.audit_rows() if r[5].startswith("refused")]


@pytest.mark.parametrize("forgery", [*CROSS_SITE, *TOKEN_FORGERIES])
def test_a_forged_or_cross_site_sign_in_is_refused(serve: Callable[..., Live], forgery: str) -> None:
    """Login CSRF: another site must not sign a victim's browser in under the attacker's key."""
    live = serve()
    key = with_patient(live)
    with browser_like(live) as other:
        others = form_token(other.get("/ui").text)
    with browser_like(live) as http:
        token = form_token(http.get("/ui").text)
        fields, headers = forged(forgery, token, others)
        login = http.post("/ui/login", data={"key": key, **fields}, headers=headers)
        assert login.status_code == 403 and SESSION not in login.cookies and key not in login.text
        assert not session_rows(live.store), "a forged sign-in starts no session"
        assert len(token) >= 43 and token != others, "each sign-in form has its own token, bound to its cookie"
    assert refusals(live) == [("-", "", "refused 403 /ui/login")]


@pytest.mark.parametrize("forgery", [*CROSS_SITE, *TOKEN_FORGERIES])
def test_a_forged_or_cross_site_ask_is_refused(serve: Callable[..., Live], forgery: str) -> None:
    live = serve()
    key = with_patient(live)
    with browser_like(live) as other:
        sign_in(other, key)
        others = form_token(other.get("/ui/patients/p1").text)
    with browser_like(live) as http:
        assert sign_in(http, key, Origin=live.url, **{"Sec-Fetch-Site": "same-origin"}).status_code == 303
        token = form_token(http.get("/ui/patients/p1").text)
        fields, headers = forged(forgery, token, others)
        asked = http.post("/ui/patients/p1/ask", data={"question": "Allergies?", **fields}, headers=headers)
        assert asked.status_code == 403 and "Allergies?" not in asked.text and "Sign out" not in asked.text
        assert len(token) >= 43 and token != others, "each session has its own form token"
    assert refusals(live) == [(key.split("_")[1], "p1", "refused 403 /ui/patients/{pid}/ask")]
    assert not any(r[5] == "ui_ask" for r in live.store.audit_rows()), "nothing was asked"


def test_a_same_site_ask_with_its_token_is_answered(serve: Callable[..., Live]) -> None:
    live = serve()
    key = with_patient(live)
    with browser_like(live) as http:
        sign_in(http, key)
        token = form_token(http.get("/ui/patients/p1").text)
        asked = http.post("/ui/patients/p1/ask", data={"question": "Which antibiotic is safe?", "csrf": token},
                          headers={"Origin": live.url, "Sec-Fetch-Site": "same-origin"})
        assert asked.status_code == 200 and 'id=answer' in asked.text


def test_security_headers_on_every_response(serve: Callable[..., Live]) -> None:
    live = serve()
    key = with_patient(live)
    with browser_like(live) as http:
        ui_answers = [http.get("/ui"), sign_in(http, key), http.get("/ui/patients/p1"), http.get("/ui/patients/nobody"),
                      http.get("/ui/open?pid=p1")]
        for answer in ui_answers:
            assert answer.headers["x-frame-options"] == "DENY", answer.url
            assert answer.headers["content-security-policy"] == CSP
            assert answer.headers["cache-control"] == "no-store"
            assert answer.headers["referrer-policy"] == "same-origin", "a real Origin on the page's own posts"
        assert ui_answers[3].status_code == 404
        app_answers = [http.get("/healthz"), http.get("/v1/patients/p1/fragments"), http.get("/openapi.json")]
        problem(app_answers[1], 401, "unauthorized")  # answered by the guard, outside the application
        for answer in ui_answers + app_answers:
            assert answer.headers["x-content-type-options"] == "nosniff", answer.url
        assert all(answer.headers["referrer-policy"] == "no-referrer" for answer in app_answers)
    assert "default-src 'none'" in CSP and "frame-ancestors 'none'" in CSP and "script-src" not in CSP


def test_a_failed_sign_in_says_only_not_valid_and_counts_toward_the_bad_key_throttle(
        serve: Callable[..., Live]) -> None:
    live = serve()
    key = with_patient(live)
    revoked = live.key("t", "clinician")
    live.store.revoke(revoked.split("_")[1])
    pages = []
    with browser_like(live) as http:
        for wrong in (revoked, key[:-4] + "abcd", "ebm_000000000000_" + "x" * 43, "not a key"):
            answer = sign_in(http, wrong)
            assert answer.status_code == 401 and SESSION not in answer.cookies
            pages.append(answer.text.replace(form_token(answer.text), ""))
        assert len(set(pages)) == 1 and NOT_VALID in pages[0] and "revoked" not in pages[0]
        statuses = [sign_in(http, "ebm_guess").status_code for _ in range(20)]
        assert statuses[-1] == 429 and statuses.count(401) < 20, statuses
        assert sign_in(http, key).status_code == 303, "a good key signs in from the throttled address"
    with live.client("ebm_guess") as api:
        assert api.get("/v1/patients/p1/fragments").status_code == 429, "one count for /ui and /v1"
    refused = [(r[2], r[5]) for r in live.store.audit_rows() if r[5].startswith("refused")]
    assert ("-", "refused 401 /ui/login") in refused and ("-", "refused 429 /ui/login") in refused

"""The web chat page at / in a real headless Chromium (Debian's package), driven by Playwright:
streamed replies, stop, edit-and-resend, conversations (new, switch, delete) kept across reloads."""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import pytest

from helpers.serve_helpers import CHAT_MODEL, chat_ids, generate_text, require_serving

require_serving()
sync_api = pytest.importorskip("playwright.sync_api", reason="the page tests drive Chromium with Playwright: "
                                                            "pip install playwright")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("Debian's chromium is not installed (apt-get install chromium); the page tests need a real browser",
                allow_module_level=True)

REPLY = 24
TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def browser():
    # Chromium's singleton socket lives in TMPDIR and AF_UNIX paths stop at 107 bytes: nox's TMPDIR (deep in the
    # checkout) can be too long for it, so the browser gets a short one of its own.
    with tempfile.TemporaryDirectory(prefix="chromium-", dir="/tmp") as temp_dir, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, env={**os.environ, "TMPDIR": temp_dir})
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def page(browser, chat_server):
    """One page for the module's tests, which run in order as one user's session."""
    context = browser.new_context(viewport={"width": 1200, "height": 760})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(chat_server.base_url + "/")
    page.wait_for_function(f"document.getElementById('model').textContent.includes('{CHAT_MODEL}')")
    set_setting(page, "temperature", "0")
    set_setting(page, "max_tokens", str(REPLY))
    yield page
    context.close()


def set_setting(page, name: str, value: str) -> None:
    page.fill(f"#{name}", value)
    page.dispatch_event(f"#{name}", "change")


def send(page, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")


def wait_idle(page) -> None:
    page.wait_for_function("document.body.dataset.state === 'idle'")


def messages(page) -> list[tuple[str, str]]:
    return [tuple(m) for m in page.eval_on_selector_all(
        "#messages .msg", "els => els.map(e => [e.classList.contains('user') ? 'user' : 'assistant', "
                          "e.querySelector('.text').textContent])")]


def expected_reply(chat_reference, tokenizer, history) -> str:
    return generate_text(chat_reference, tokenizer, chat_ids(tokenizer, history), REPLY)


def test_send_a_message_and_get_the_reply(page, chat_reference, tokenizer):
    send(page, "Hello from the browser")
    wait_idle(page)
    history = [{"role": "user", "content": "Hello from the browser"}]
    assert messages(page) == [("user", "Hello from the browser"),
                              ("assistant", expected_reply(chat_reference, tokenizer, history))]


def test_stop_a_streaming_reply(page, chat_server):
    cancelled_key = f'llaisys_requests_finished_total{{model="{CHAT_MODEL}",reason="cancelled"}}'
    cancelled = chat_server.metrics()[cancelled_key]
    set_setting(page, "max_tokens", "3000")
    send(page, "Now a long answer, please")
    # streamed: part of the reply is on screen while the request is still running
    page.wait_for_function("document.body.dataset.state === 'streaming' && "
                           "document.querySelector('#messages .msg:last-child .text').textContent.length > 0")
    page.click("#stop")
    wait_idle(page)
    set_setting(page, "max_tokens", str(REPLY))
    last = page.locator("#messages .msg.assistant").last
    assert last.locator(".note").text_content() == "(stopped)"
    assert 0 < len(last.locator(".text").text_content()) < 3000
    deadline = time.monotonic() + 20
    while chat_server.metrics()[cancelled_key] != cancelled + 1:  # the server dropped the request
        assert time.monotonic() < deadline, "stopping in the page did not cancel the request on the server"
        time.sleep(0.05)


def test_edit_an_earlier_message_regenerates_from_there(page, chat_reference, tokenizer):
    assert len(messages(page)) == 4  # hello, its reply, the long request, its stopped reply
    page.locator("#messages .msg.user .edit-btn").first.click()
    page.fill(".edit-area", "Hello again, edited")
    page.click(".edit-send")
    wait_idle(page)
    history = [{"role": "user", "content": "Hello again, edited"}]
    assert messages(page) == [("user", "Hello again, edited"),
                              ("assistant", expected_reply(chat_reference, tokenizer, history))]


def test_switch_conversations_and_reload(page, chat_reference, tokenizer):
    first = messages(page)
    page.click("#new-chat")
    assert messages(page) == []
    send(page, "A second conversation")
    wait_idle(page)
    second = messages(page)
    history = [{"role": "user", "content": "A second conversation"}]
    assert second[1] == ("assistant", expected_reply(chat_reference, tokenizer, history))
    items = page.locator(".conv-item")
    assert items.count() == 2
    assert items.nth(0).locator(".conv-title").text_content() == "A second conversation"  # newest first
    items.nth(1).click()
    assert messages(page) == first
    page.reload()
    page.wait_for_selector(".conv-item")
    assert page.locator(".conv-item").count() == 2
    assert messages(page) == first  # the current conversation is remembered too
    page.locator(".conv-item").nth(0).click()
    assert messages(page) == second


def test_delete_a_conversation(page):
    assert page.locator(".conv-item").count() == 2
    page.locator(".conv-item").nth(0).locator(".conv-delete").click()
    assert page.locator(".conv-item").count() == 1
    page.reload()
    page.wait_for_selector(".conv-item")
    assert page.locator(".conv-item").count() == 1
    assert page.locator(".conv-item .conv-title").text_content() == "Hello from the browser"  # titled by its start


def test_a_long_reply_scrolls_in_its_pane_under_a_default_cap(browser, chat_server):
    """A fresh page caps replies at 512 tokens (editable); a reply longer than the window scrolls in the message
    pane while the input box and the Stop button stay inside the window (the pane used to grow the page)."""
    context = browser.new_context(viewport={"width": 1000, "height": 360})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(chat_server.base_url + "/")
    page.wait_for_function(f"document.getElementById('model').textContent.includes('{CHAT_MODEL}')")
    assert page.input_value("#max_tokens") == "512"
    set_setting(page, "temperature", "0")
    set_setting(page, "max_tokens", "3000")
    send(page, "Now a long answer, please")
    page.wait_for_function("document.body.dataset.state === 'idle' || "
                           "document.querySelector('#messages .msg:last-child .text').textContent.length > 1500")
    assert page.evaluate("document.body.dataset.state") == "streaming", "the reply ended before it was long"
    height = 360
    for selector in ("#input", "#stop"):
        box = page.locator(selector).bounding_box()
        assert box is not None and 0 <= box["y"] and box["y"] + box["height"] <= height, (selector, box)
    pane = page.evaluate("(() => { const m = document.getElementById('messages'); "
                         "return [m.scrollHeight, m.clientHeight, m.scrollTop]; })()")
    assert pane[0] > pane[1] and pane[2] > 0, f"the pane does not scroll: {pane}"  # followed the reply down
    assert page.evaluate("document.documentElement.scrollHeight") <= height  # the page itself does not grow
    page.click("#stop")
    wait_idle(page)
    context.close()

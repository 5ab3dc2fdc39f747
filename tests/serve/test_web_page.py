"""The web chat page at / in a real headless Chromium (Debian's package), driven by Playwright:
streamed replies, stop, edit-and-resend, conversations (new, switch, delete) kept across reloads, and a reasoning
model's thinking folded above its answer (served by a scripted reasoning model, helpers/reasoning_model.py)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

import pytest

from helpers.serve_helpers import CHAT_MODEL, chat_ids, generate_text, require_serving

require_serving()

from helpers.chat_server import ChatServer, serve_device  # noqa: E402
from helpers.reasoning_model import ANSWER, R1_TEMPLATE, THOUGHT, make_reasoning_model  # noqa: E402

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
    assert page.locator("#messages details").count() == 0  # a model that does not reason: no thinking block


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


# -- a reasoning model: its thinking folded above its answer -----------------------------------------------------

@pytest.fixture(scope="module")
def reasoning_server(tmp_path_factory, pytestconfig):
    """The scripted R1-style reasoning model, served: every reply thinks THOUGHT, then answers ANSWER."""
    import llaisys_models
    from llaisys_models.serve.engine import Engine
    from llaisys_models.serve.server import Server
    from llaisys_models.text.tokenizer import load_tokenizer

    path = make_reasoning_model(tmp_path_factory.mktemp("reasoning_model") / "r1", R1_TEMPLATE)
    model = llaisys_models.load(path, device=serve_device(pytestconfig))
    engine = Engine(model, load_tokenizer(path), max_running=2, kv_memory=4 << 20)
    with ChatServer(Server(engine, load_tokenizer(path), CHAT_MODEL)) as server:
        assert server.server.reasoning is not None, "the scripted model's thinking is not parsed"
        yield server


# Every text the reply's thinking and answer showed while it streamed, in order: the mutations of the last
# message's .reasoning and .text elements (each textContent set adds a new Text node), and the summary the
# thinking block had when it appeared.
WATCH = """() => {
  window.shown = [];
  new MutationObserver((records) => {
    for (const r of records) for (const node of r.addedNodes) {
      if (node.nodeType === Node.TEXT_NODE && r.target.classList
          && (r.target.classList.contains("reasoning") || r.target.classList.contains("text")))
        window.shown.push([r.target.className, node.data]);
      else if (node.nodeType === Node.ELEMENT_NODE && node.matches("details.thinking"))
        window.shown.push(["details", node.querySelector("summary").textContent]);
    }
  }).observe(document.getElementById("messages"), {childList: true, subtree: true});
}"""


def thinking_of(message) -> tuple[str, str, bool]:
    """(summary, thinking, open) of a message's thinking block."""
    details = message.locator("details.thinking")
    assert details.count() == 1
    return (details.locator("summary").text_content(), details.locator(".reasoning").text_content(),
            details.evaluate("d => d.open"))


def test_a_reasoning_model_s_thinking_streams_into_a_folded_block(browser, reasoning_server):
    context = browser.new_context(viewport={"width": 1200, "height": 760})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(reasoning_server.base_url + "/")
    page.wait_for_function(f"document.getElementById('model').textContent.includes('{CHAT_MODEL}')")
    set_setting(page, "temperature", "0")
    page.evaluate(WATCH)
    send(page, "2+40?")
    wait_idle(page)
    assert messages(page) == [("user", "2+40?"), ("assistant", ANSWER)]  # the answer alone in .text
    reply = page.locator("#messages .msg.assistant").last
    assert thinking_of(reply) == ("Thinking", THOUGHT, False)  # folded
    assert reply.evaluate("m => m.firstElementChild.matches('details.thinking')")  # above the answer
    # streamed: the block appeared while the reply was thinking, and filled in before the answer began
    shown = [tuple(s) for s in page.evaluate("window.shown")]
    live = shown[:shown.index(("text", ANSWER))]
    assert live[0] == ("details", "Thinking…"), shown
    thoughts = [text for kind, text in live if kind == "reasoning"]
    answers = [text for kind, text in live if kind == "text" and text]
    assert thoughts and thoughts[-1] == THOUGHT and all(THOUGHT.startswith(t) for t in thoughts), shown
    assert thoughts == sorted(set(thoughts), key=len) and len(thoughts) > 1, "the thinking did not stream"
    first_answer = next(i for i, (kind, text) in enumerate(live) if kind == "text" and text)
    assert all(kind != "reasoning" for kind, _ in live[first_answer:]) and ANSWER.startswith(answers[0])
    reply.locator("summary").click()  # unfolds
    assert reply.locator(".reasoning").is_visible()

    # the thinking is kept with the conversation, and never sent back to the model
    with page.expect_request("**/v1/chat/completions") as request:
        send(page, "and 1+1?")
    wait_idle(page)
    sent = json.loads(request.value.post_data)["messages"]
    assert sent == [{"role": "user", "content": "2+40?"}, {"role": "assistant", "content": ANSWER},
                    {"role": "user", "content": "and 1+1?"}]
    page.reload()
    page.wait_for_selector("#messages .msg.assistant")
    replies = page.locator("#messages .msg.assistant")
    assert replies.count() == 2
    for i in range(2):
        assert thinking_of(replies.nth(i)) == ("Thinking", THOUGHT, False)
        assert replies.nth(i).locator(".text").text_content() == ANSWER
    context.close()

#!/usr/bin/env python
"""Take docs/screenshots/web-chat.png: the web chat page on the demo model, in Debian's headless chromium.

    python tools/web_chat_screenshot.py [--out docs/screenshots/web-chat.png]

Needs the serve extra, playwright (the Python package only) and `apt-get install chromium`.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = ["999+1=", "1234+5678=", "12+34="]  # one conversation each; the last one stays on screen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots" / "web-chat.png")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("chromium is not installed: apt-get install chromium", file=sys.stderr)
        return 1
    from playwright.sync_api import sync_playwright

    import llaisys_models
    from llaisys_models.serve.background import BackgroundServer
    from llaisys_models.serve.engine import Engine
    from llaisys_models.serve.server import Server
    from llaisys_models.text.tokenizer import load_tokenizer

    path = llaisys_models.DEMO_MODEL_DIR
    engine = Engine(llaisys_models.load(path), load_tokenizer(path))
    with BackgroundServer(Server(engine, load_tokenizer(path), "llaisys-demo")) as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True)
        page = browser.new_page(viewport={"width": 1100, "height": 560})
        page.goto(server.base_url + "/")
        page.wait_for_function("document.getElementById('model').textContent.includes('llaisys-demo')")
        page.fill("#temperature", "0")
        page.dispatch_event("#temperature", "change")
        for i, problem in enumerate(PROBLEMS):
            if i:
                page.click("#new-chat")
            page.fill("#input", problem)
            page.press("#input", "Enter")
            page.wait_for_function("document.body.dataset.state === 'idle'")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(args.out))
        browser.close()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

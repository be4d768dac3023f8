"""Headless Chromium over the built site: every page loads, math is typeset, no failed request."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading

import pytest

from .test_site import MATH_PAGES, all_pages

pytestmark = [pytest.mark.book, pytest.mark.browser]

#: Console messages, failed requests and page errors that are accepted, each with its reason.
#: Empty: the duplicate ``THEBE_JS_URL`` declaration, the missing favicon and the "invalid theme
#: mode" error of Jupyter Book 1 pages are fixed in book/_ext/sitefixes.py and _config.yml.
KNOWN_NOISE: dict[str, str] = {}


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    exe = _chromium()
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium)")
        pytest.skip("no chromium on this machine: `apt-get install chromium` to run browser tests")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=exe, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic"],
        )
        yield b
        b.close()


@pytest.fixture(scope="module")
def server(html_dir):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(html_dir))
    handler.log_message = lambda *a, **k: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("page", all_pages())
def test_page_renders_math_and_loads_everything(browser, server, page):
    tab = browser.new_page(viewport={"width": 1280, "height": 1600})
    failed, errors = [], []
    tab.on("requestfailed", lambda r: failed.append(f"{r.url} {r.failure}"))
    tab.on("response", lambda r: failed.append(f"{r.url} {r.status}") if r.status >= 400 else None)
    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.on("console", lambda m: errors.append(f"console {m.type}: {m.text}")
           if m.type in ("error", "warning") else None)
    tab.goto(f"{server}/{page}.html", wait_until="networkidle")
    if page in MATH_PAGES:
        # attached, not visible: the first formula may sit in a folded solution or code cell
        tab.wait_for_selector("mjx-container", state="attached", timeout=20_000)
        tab.evaluate("() => MathJax.startup.promise")  # resolves once the whole page is typeset
        assert tab.locator("mjx-container").count() > 3
        assert tab.evaluate("() => window.MathJax.version") == "3.2.2"
        assert tab.locator("mjx-merror").count() == 0, "MathJax reported a TeX error"
    images = tab.evaluate(
        "() => Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)"
    )
    assert not images, f"images that did not load: {images}"
    real_failures = [f for f in failed if not any(n in f for n in KNOWN_NOISE)]
    real_errors = [e for e in errors if not any(n in e for n in KNOWN_NOISE)]
    assert not real_failures, real_failures
    assert not real_errors, real_errors
    tab.close()


#: Measures every display equation after opening every folded block (solutions, hidden code):
#: the width of the typeset formula plus its equation number against the width of its box.
_DISPLAY_MATH_JS = """() => {
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  const out = [];
  document.querySelectorAll('mjx-container[display="true"]').forEach(c => {
    const math = c.querySelector('mjx-math');
    if (!math) return;
    const box = c.parentElement;
    const eqno = box.querySelector(':scope > .eqno');
    const need = math.getBoundingClientRect().width + (eqno ? eqno.getBoundingClientRect().width : 0);
    const have = box.clientWidth;
    if (have > 0 && need > have + 1) {
      const id = (box.id || (box.closest('[id]') || {}).id || '?');
      out.push(`${id}: ${need.toFixed(0)} px in ${have} px`);
    }
  });
  return out;
}"""


def _open_page(browser, server, page, width):
    tab = browser.new_page(viewport={"width": width, "height": 1000})
    tab.goto(f"{server}/{page}.html", wait_until="networkidle")
    if page in MATH_PAGES:
        tab.wait_for_selector("mjx-container", state="attached", timeout=20_000)
        tab.evaluate("() => MathJax.startup.promise")
    return tab


@pytest.mark.parametrize("page", sorted(MATH_PAGES))
def test_display_equations_fit_their_column_on_a_desktop(browser, server, page):
    """At 1400 px every display equation (with its number) fits the text column."""
    tab = _open_page(browser, server, page, 1400)
    too_wide = tab.evaluate(_DISPLAY_MATH_JS)
    tab.close()
    assert not too_wide, f"{page}: display equations wider than the column: {too_wide}"


@pytest.mark.parametrize("page", all_pages())
def test_no_page_scrolls_sideways_on_a_phone(browser, server, page):
    """At 420 px the page is never wider than the screen (wide formulas and tables scroll in their
    own box, see book/_static/attnbook.css)."""
    tab = _open_page(browser, server, page, 420)
    tab.evaluate("() => document.querySelectorAll('details').forEach(d => { d.open = true; })")
    widest = tab.evaluate("""() => {
      const vw = document.documentElement.clientWidth;
      const out = [];
      if (document.documentElement.scrollWidth > vw + 1) {
        document.querySelectorAll('main *').forEach(el => {
          const r = el.getBoundingClientRect();
          if (r.right > vw + 1 && el.children.length === 0)
            out.push(`${el.tagName.toLowerCase()}.${el.className} right=${r.right.toFixed(0)}`);
        });
        out.unshift(`page ${document.documentElement.scrollWidth} px in ${vw} px`);
      }
      return out.slice(0, 8);
    }""")
    tab.close()
    assert not widest, f"{page} scrolls sideways at 420 px: {widest}"

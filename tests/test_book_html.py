"""Checks on the BUILT book (`python make.py book` first): links, offline assets, search, math.

Static checks parse `_build/html` with BeautifulSoup (marker `book`); the browser check opens
every page in Debian's Chromium through Playwright with all non-loopback traffic blocked
(markers `book` and `browser`) and asserts that MathJax typeset every formula.
Set ATTNBOOK_HTML_DIR to check a build elsewhere; set ATTNBOOK_SCREENSHOTS=DIR to save
a full-page screenshot of every page the browser test visits.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import threading
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
HTML = Path(os.environ.get("ATTNBOOK_HTML_DIR", ROOT / "_build" / "html")).resolve()
CHROMIUM = Path("/usr/bin/chromium")
MATHJAX_ENTRY = "_static/mathjax/tex-chtml.js"

pytestmark = [
    pytest.mark.book,
    pytest.mark.skipif(
        not (HTML / "index.html").is_file(),
        reason=f"no built book at {HTML}/index.html: run `python make.py book` first",
    ),
]

bs4 = pytest.importorskip("bs4", reason="beautifulsoup4 is needed to parse the built HTML")


def _pages() -> list[Path]:
    """Every HTML page of the book (not the _sources copies or theme assets)."""
    return sorted(p for p in HTML.rglob("*.html") if not {"_sources", "_static", "_images"} & set(p.parts))


def _content_pages() -> list[Path]:
    """The pages a reader reads: the landing page, chapters and appendices."""
    return [HTML / "index.html"] + sorted((HTML / "chapters").glob("*.html")) + sorted((HTML / "appendix").glob("*.html"))


@functools.lru_cache(maxsize=None)
def _soup(path: Path):
    return bs4.BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


@functools.lru_cache(maxsize=None)
def _ids(path: Path) -> frozenset[str]:
    soup = _soup(path)
    return frozenset(t["id"] for t in soup.find_all(id=True)) | frozenset(
        t["name"] for t in soup.find_all(attrs={"name": True}) if t.name == "a")


def _is_external(ref: str) -> bool:
    parts = urlsplit(ref)
    return bool(parts.scheme or parts.netloc) or ref.startswith(("mailto:", "javascript:", "data:"))


def _math_nodes(soup) -> list:
    return soup.select("span.math, div.math")


def test_book_has_the_expected_pages():
    assert (HTML / "chapters").is_dir() and list((HTML / "chapters").glob("*.html")), "no chapter pages were built"
    for name in ("notation", "errata", "references"):
        assert (HTML / "appendix" / f"{name}.html").is_file(), f"appendix/{name}.html missing"


def test_internal_links_anchors_and_images_resolve():
    problems = []
    for page in _pages():
        soup = _soup(page)
        for tag, attr in (("a", "href"), ("img", "src"), ("link", "href"), ("script", "src")):
            for el in soup.find_all(tag, attrs={attr: True}):
                ref = el[attr]
                if _is_external(ref):
                    continue
                parts = urlsplit(ref)
                target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
                if target.is_dir():
                    target = target / "index.html"
                rel = page.relative_to(HTML).as_posix()
                if not target.is_file():
                    problems.append(f"{rel}: <{tag} {attr}={ref!r}> -> missing file")
                elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in _ids(target):
                    problems.append(f"{rel}: <{tag} {attr}={ref!r}> -> no id {parts.fragment!r} in the target")
    assert not problems, "broken internal references:\n" + "\n".join(problems[:50])


def test_no_page_loads_scripts_or_styles_from_the_network():
    external = []
    for page in _pages():
        soup = _soup(page)
        refs = [s["src"] for s in soup.find_all("script", src=True)]
        refs += [link["href"] for link in soup.find_all("link", href=True) if "stylesheet" in (link.get("rel") or [])]
        external += [f"{page.relative_to(HTML)}: {r}" for r in refs if _is_external(r)]
    assert not external, "the book must work offline; external assets:\n" + "\n".join(external[:30])


def test_mathjax_is_served_locally_on_pages_with_math():
    entry = HTML / MATHJAX_ENTRY
    assert entry.is_file(), f"{MATHJAX_ENTRY} missing from the build (tools/book_assets.py installs it)"
    fonts = list((HTML / "_static" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))
    assert len(fonts) >= 20, "MathJax CHTML fonts were not copied"
    pages_with_math = 0
    for page in _content_pages():
        soup = _soup(page)
        srcs = [urlsplit(s["src"]).path for s in soup.find_all("script", src=True)]
        mathjax = [s for s in srcs if "mathjax" in s.lower()]
        if not _math_nodes(soup):
            continue
        pages_with_math += 1
        assert len(mathjax) == 1 and mathjax[0].endswith(MATHJAX_ENTRY), (
            f"{page.relative_to(HTML)} has math but loads MathJax as {mathjax}; "
            f"expected exactly one local {MATHJAX_ENTRY}")
        assert (page.parent / mathjax[0]).resolve() == entry.resolve()
    assert pages_with_math >= 2, "expected math on the landing page and the chapters"


def test_search_index_contains_chinese_terms():
    text = (HTML / "searchindex.js").read_text(encoding="utf-8")
    match = re.fullmatch(r"\s*Search\.setIndex\((.*)\)\s*;?\s*", text, re.S)
    assert match, "unexpected searchindex.js format"
    terms = json.loads(match.group(1))["terms"]
    for word in ("注意力", "掩码", "矩阵"):
        assert word in terms, f"{word!r} not in the search index: was jieba importable during the build?"


def _prose_text(soup) -> list[str]:
    """Text of the prose blocks of a page, without code, outputs and typeset math."""
    article = soup.select_one("article.bd-article") or soup
    blocks = []
    for el in article.find_all(["p", "li", "td", "th", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6"]):
        if el.find_parent(["pre", "code"]) or el.find_parent(class_=["cell_output", "output", "highlight"]):
            continue
        clone = bs4.BeautifulSoup(str(el), "html.parser")
        for skip in clone.select("code, pre, .math, script, .cell_output"):
            skip.decompose()
        blocks.append(clone.get_text(" ", strip=True))
    return blocks


@pytest.mark.parametrize("page", _content_pages() if (HTML / "index.html").is_file() else [],
                         ids=lambda p: p.relative_to(HTML).as_posix())
def test_no_raw_dollar_signs_in_prose(page):
    raw = [t[:100] for t in _prose_text(_soup(page)) if re.search(r"(?<!\\)\$", t)]
    assert not raw, f"{page.relative_to(HTML)}: unparsed $...$ (missing dollarmath or a stray $):\n" + "\n".join(raw)


def test_chapter_04_shows_its_static_widget_figure():
    page = HTML / "chapters" / "04_attention_qkv.html"
    assert page.is_file(), "chapters/04_attention_qkv.html was not built"
    soup = _soup(page)
    explore_cells = [c for c in soup.select("div.cell") if "explore(" in c.get_text()]
    assert explore_cells, "no cell calling explore( is visible on the chapter 04 page (use hide-input, not remove-input)"
    images = [img for c in explore_cells for img in c.select(".cell_output img")]
    assert images, "the explore(...) cell has no static figure (<img>) in its output; was ATTNBOOK_STATIC=1 set?"
    for img in images:
        assert (page.parent / unquote(urlsplit(img["src"]).path)).is_file(), img["src"]


# ------------------------------------------------------------------------------------- browser

PROBE = """async () => {
  const timeout = new Promise(resolve => setTimeout(() => resolve('timeout'), 20000));
  let startup = 'no-mathjax';
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    startup = await Promise.race([MathJax.startup.promise.then(() => 'ok'), timeout]);
  }
  const maths = [...document.querySelectorAll('span.math, div.math')];
  const unrendered = maths.filter(e => !e.querySelector('mjx-container')).map(e => e.textContent.slice(0, 80));
  const errors = [...document.querySelectorAll('mjx-merror, [data-mjx-error]')]
      .map(e => (e.getAttribute('data-mjx-error') || e.textContent).slice(0, 80));
  const images = [...document.images].filter(i => i.src.startsWith(location.origin));
  const broken = images.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src);
  return {startup, nMath: maths.length, unrendered, errors, nImages: images.length, broken};
}"""

# Math wider than the text column (CHAPTER.md point 13). A display equation must fit its block at
# desktop width (split it over aligned lines otherwise); inline math must not run past the right
# edge of its paragraph at phone width (make it display math otherwise). 2 px of slack for rounding.
OVERFLOW_PROBE = """() => {
  const text = e => e.textContent.replace(/\\s+/g, ' ').slice(0, 60);
  const wide = [...document.querySelectorAll('div.math')].filter(block => {
    const m = block.querySelector('mjx-math');
    return m && m.getBoundingClientRect().width > block.clientWidth + 2;
  }).map(text);
  const inline = [...document.querySelectorAll('p span.math, li span.math')].filter(span => {
    const box = span.closest('p, li').getBoundingClientRect();
    const r = span.getBoundingClientRect();
    return r.width > 0 && r.right > box.right + 2;
  }).map(text);
  return {wide, inline};
}"""

CHROMIUM_ARGS = [
    "--no-sandbox", "--headless", "--disable-gpu", "--disable-dev-shm-usage",
    "--disable-background-networking", "--disable-component-update", "--disable-default-apps",
    "--disable-extensions", "--disable-sync", "--no-first-run", "--metrics-recording-only",
]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def book_url():
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    server.server_close()


@pytest.mark.browser
def test_pages_render_in_chromium(book_url):
    if not CHROMIUM.is_file():
        pytest.skip(f"{CHROMIUM} not found: `apt-get install chromium` (Debian) to run the browser test")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    shots = os.environ.get("ATTNBOOK_SCREENSHOTS")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
    failures, visited = [], 0

    def route(r):
        host = urlsplit(r.request.url).hostname
        return r.continue_() if host == "127.0.0.1" else r.abort()     # no network beyond loopback

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page_errors: list[str] = []
            page.on("pageerror", lambda exc: page_errors.append(str(exc)))
            page.route("**/*", route)
            for path in _content_pages():
                rel = path.relative_to(HTML).as_posix()
                page_errors.clear()
                page.goto(book_url + rel, wait_until="load")
                result = page.evaluate(PROBE)
                visited += 1
                if shots:
                    page.screenshot(path=str(Path(shots) / (rel.replace("/", "__") + ".png")), full_page=True)
                if result["nMath"] and result["startup"] != "ok":
                    failures.append(f"{rel}: MathJax startup {result['startup']}")
                if result["unrendered"]:
                    failures.append(f"{rel}: {len(result['unrendered'])} math nodes not typeset, e.g. {result['unrendered'][:3]}")
                if result["errors"]:
                    failures.append(f"{rel}: TeX errors {result['errors'][:5]}")
                if result["broken"]:
                    failures.append(f"{rel}: images not decoded {result['broken'][:5]}")
                if page_errors:
                    failures.append(f"{rel}: JavaScript errors {page_errors[:5]}")
                wide = page.evaluate(OVERFLOW_PROBE)["wide"]
                if wide:
                    failures.append(f"{rel}: {len(wide)} display equations wider than the text column at "
                                    f"1280 px (split them over aligned lines): {wide[:3]}")
            phone = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2)
            phone.route("**/*", route)
            for path in _content_pages():
                rel = path.relative_to(HTML).as_posix()
                phone.goto(book_url + rel, wait_until="load")
                phone.evaluate(PROBE)  # waits for MathJax
                inline = phone.evaluate(OVERFLOW_PROBE)["inline"]
                if inline:
                    failures.append(f"{rel}: {len(inline)} inline formulas run past their paragraph at 390 px "
                                    f"(make them display math): {inline[:3]}")
        finally:
            browser.close()
    assert visited >= 2
    assert not failures, "\n".join(failures)

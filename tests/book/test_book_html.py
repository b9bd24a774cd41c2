"""Checks on the BUILT book (`python make.py book` first): links, offline assets, search, math.

Static checks parse `_build/html` with BeautifulSoup (marker `book`); the browser checks open
every page in Debian's Chromium through Playwright with all non-loopback traffic blocked
(markers `book` and `browser`): at 1280 px MathJax typeset every formula and display equations
fit the column; at 390 px (a phone) nothing is wider than the screen unless it sits in a box
that scrolls sideways, every table column keeps room for ~6 characters, and inline formulas stay
inside their paragraph; the search page shows snippets without raw LaTeX.
Every page visited is saved as a full-page screenshot in _build/screenshots/{desktop,phone}/
(ATTNBOOK_SCREENSHOTS=DIR saves them elsewhere). Set ATTNBOOK_HTML_DIR to check a build elsewhere.
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

ROOT = Path(__file__).resolve().parents[2]
HTML = Path(os.environ.get("ATTNBOOK_HTML_DIR", ROOT / "_build" / "html")).resolve()
CHROMIUM = Path("/usr/bin/chromium")
MATHJAX_ENTRY = "_static/mathjax/tex-chtml.js"
SCREENSHOTS = Path(os.environ.get("ATTNBOOK_SCREENSHOTS", HTML.parent / "screenshots"))
PHONE = {"width": 390, "height": 844}
MIN_COLUMN_CHARS = 5.5          # a table column's content box holds at least ~6 Chinese characters

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
    for name in ("notation", "errata", "glossary", "references"):
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


def test_no_page_loads_scripts_styles_or_images_from_the_network():
    external = []
    for page in _pages():
        soup = _soup(page)
        refs = [s["src"] for s in soup.find_all("script", src=True)]
        refs += [img["src"] for img in soup.find_all("img", src=True)]      # e.g. the Colab badge
        refs += [link["href"] for link in soup.find_all("link", href=True)
                 if {"stylesheet", "icon"} & set(link.get("rel") or [])]
        external += [f"{page.relative_to(HTML)}: {r}" for r in refs if _is_external(r) and not r.startswith("data:")]
    assert not external, "the book must work offline; external assets:\n" + "\n".join(external[:30])


def test_favicon():
    icons = [link["href"] for link in _soup(HTML / "index.html").find_all("link", href=True)
             if "icon" in (link.get("rel") or [])]
    assert icons, "no <link rel=icon> (html.favicon in _config.yml)"
    assert all((HTML / unquote(urlsplit(i).path)).is_file() for i in icons), icons


def _chapter_pages() -> list[Path]:
    return sorted((HTML / "chapters").glob("*.html"))


def test_chapter_pages_launch_the_colab_edition():
    for page in _chapter_pages():
        links = [a["href"] for a in _soup(page).find_all("a", href=True)
                 if a["href"].startswith("https://colab.research.google.com/")]
        assert links, f"{page.name}: no Colab launch button"
        for href in links:
            assert href.endswith(f"/colab/{page.stem}.ipynb"), f"{page.name}: {href} does not open the Colab edition"
        assert (ROOT / "colab" / f"{page.stem}.ipynb").is_file(), f"colab/{page.stem}.ipynb missing: run make.py colab"


def test_chapter_pages_show_when_they_were_verified():
    for page in _chapter_pages():
        line = _soup(page).select_one("p.attnbook-last-verified")
        assert line is not None, f"{page.name}: no 'last verified' line (tools/book_pages.py)"
        text = line.get_text()
        assert re.search(r"最后验证：\d{4}-\d\d-\d\d", text) and "attnbook " in text and "torch " in text, text
        assert re.search(r"运行 \d+ 秒", text), text


def test_equations_are_numbered_per_chapter():
    for page in _chapter_pages():
        number = int(page.name[:2])
        numbers = [e.get_text(strip=True).rstrip("#").strip() for e in _soup(page).select("span.eqno")]
        numbers = [re.sub(r"[^\d.()]", "", n) for n in numbers]
        assert numbers == [f"({number}.{k})" for k in range(1, len(numbers) + 1)], (page.name, numbers[:5])


def test_one_search_entry_per_page():
    # the header's search button only: the sidebar's search field (the theme's default) is removed
    # in _config.yml, so a reader at 1280 px no longer sees two search boxes
    for page in _content_pages():
        buttons = _soup(page).select("button.search-button__button")
        assert len(buttons) == 1, f"{page.relative_to(HTML)}: {len(buttons)} search entry points"


def test_interface_strings_are_chinese():
    english = ("Show code cell", "Hide code cell", "Click to show", "Click to hide", "Search this book")
    for page in _content_pages():
        html = page.read_text(encoding="utf-8")
        found = [s for s in english if s in html]
        assert not found, f"{page.relative_to(HTML)} still shows {found}"


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


@pytest.mark.parametrize("page", _chapter_pages() if (HTML / "index.html").is_file() else [],
                         ids=lambda p: p.name)
def test_static_widget_figure_links_to_its_full_size_image(page):
    soup = _soup(page)
    explore_cells = [c for c in soup.select("div.cell") if "explore(" in c.get_text()]
    assert explore_cells, f"no cell calling explore( is visible on {page.name} (use hide-input, not remove-input)"
    images = [img for c in explore_cells for img in c.select(".cell_output img")]
    assert images, f"{page.name}: the explore(...) cell has no static figure (<img>); was ATTNBOOK_STATIC=1 set?"
    for img in soup.select(".cell_output img"):
        assert (page.parent / unquote(urlsplit(img["src"]).path)).is_file(), img["src"]
        link = img.find_parent("a", href=True)
        assert link is not None, f"{page.name}: output figure {img['src']} is not a link to its full-size image"
        assert urlsplit(link["href"]).path == urlsplit(img["src"]).path, (link["href"], img["src"])


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
    // a formula in a table cell is its own sideways-scrolling box (custom.css): it cannot push
    // the page wider, so it is not an overflow
    if (['auto', 'scroll'].includes(getComputedStyle(span).overflowX)) return false;
    const box = span.closest('p, li').getBoundingClientRect();
    // the typeset formula, not span.math: that span clips (overflow: hidden) what sticks out --
    // unless the span scrolls sideways itself (formulas in table cells, _static/custom.css)
    const scrolls = ['auto', 'scroll'].includes(getComputedStyle(span).overflowX);
    const r = (scrolls ? span : (span.querySelector('mjx-container') || span)).getBoundingClientRect();
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


# Phone width: what is wider than the screen and not inside a box that scrolls sideways; table
# columns too narrow for ~6 characters; the page itself scrolling sideways.
PHONE_PROBE = """(minChars) => {
  const vw = document.documentElement.clientWidth;
  const scrolls = el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
  const describe = el => {
    const cls = typeof el.className === 'string' ? el.className.trim().split(/\\s+/).slice(0, 2).join('.') : '';
    return el.tagName.toLowerCase() + (cls ? '.' + cls : '') + ' "' +
      (el.textContent || '').replace(/\\s+/g, ' ').trim().slice(0, 50) + '"';
  };
  const article = document.querySelector('article.bd-article') || document.body;
  const wide = [];
  for (const el of article.querySelectorAll('*')) {
    if (el.closest('mjx-assistive-mml')) continue;     // MathJax's clipped copy for screen readers
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    if (r.right <= vw + 1 && r.left >= -1) continue;
    // contained: some ancestor scrolls sideways and itself fits the screen (scroll boxes nest:
    // a formula's own box inside a table cell inside the table's scrolling container)
    let p = el.parentElement, contained = false;
    while (p && p !== document.documentElement) {
      if (scrolls(p)) {
        const pr = p.getBoundingClientRect();
        if (pr.right <= vw + 1 && pr.left >= -1) { contained = true; break; }
      }
      p = p.parentElement;
    }
    if (!contained) wide.push(describe(el) + ` (${Math.round(r.left)}..${Math.round(r.right)} px)`);
  }
  const narrow = [];
  article.querySelectorAll('table').forEach((table, t) => {
    const seen = new Set();
    for (const row of table.rows) {
      [...row.cells].forEach((cell, c) => {
        if (cell.colSpan > 1 || seen.has(c)) return;
        const cs = getComputedStyle(cell);
        const fs = parseFloat(cs.fontSize);
        const content = cell.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
        if (content < minChars * fs) {
          seen.add(c);
          narrow.push(`table ${t + 1} column ${c + 1}: ${Math.round(content)} px < ${minChars} x ${fs} px (` +
                      describe(cell) + ')');
        }
      });
    }
  });
  const pageWidth = document.documentElement.scrollWidth;
  return {vw, pageWidth, wide: wide.slice(0, 8), nWide: wide.length, narrow: narrow.slice(0, 8)};
}"""

SEARCH_PROBE = """async () => {
  const deadline = Date.now() + 30000;
  while (Date.now() < deadline) {
    const items = document.querySelectorAll('#search-results li');
    const status = document.querySelector('#search-results p.search-summary');
    if (items.length && status && !/Searching|正在搜索|搜索中/.test(status.textContent)) break;
    await new Promise(r => setTimeout(r, 250));
  }
  await new Promise(r => setTimeout(r, 1500));   // snippets are filled in asynchronously
  const snippets = [...document.querySelectorAll('#search-results li p.context')].map(p => p.textContent);
  return {n: document.querySelectorAll('#search-results li').length, snippets};
}"""


def _chromium(sync_api, p):
    return p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)


def _offline(page):
    def route(r):
        host = urlsplit(r.request.url).hostname
        return r.continue_() if host == "127.0.0.1" else r.abort()     # no network beyond loopback
    page.route("**/*", route)


def _need_browser():
    if not CHROMIUM.is_file():
        pytest.skip(f"{CHROMIUM} not found: `apt-get install chromium` (Debian) to run the browser test")
    return pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


def _shot(page, kind: str, rel: str) -> None:
    folder = SCREENSHOTS / kind
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / (rel.replace("/", "__").removesuffix(".html") + ".png")), full_page=True)


# Tables that must be read whole on a desktop (the errata): none scrolls sideways at 1280 px.
WIDE_TABLE_PROBE = r"""() => [...document.querySelectorAll('table.errata-table')].map(t => {
  let box = t.parentElement;
  while (box && box !== document.body && !/(auto|scroll)/.test(getComputedStyle(box).overflowX)) box = box.parentElement;
  const w = box && box !== document.body ? box : t;
  return {hidden: w.scrollWidth - w.clientWidth, id: t.id || t.className};
}).filter(r => r.hidden > 1)"""


@pytest.mark.browser
def test_pages_render_in_chromium(book_url):
    sync_api = _need_browser()
    failures, visited = [], 0
    with sync_api.sync_playwright() as p:
        browser = _chromium(sync_api, p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page_errors: list[str] = []
            page.on("pageerror", lambda exc: page_errors.append(str(exc)))
            _offline(page)
            for path in _content_pages():
                rel = path.relative_to(HTML).as_posix()
                page_errors.clear()
                page.goto(book_url + rel, wait_until="load")
                result = page.evaluate(PROBE)
                visited += 1
                _shot(page, "desktop", rel)
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
                hidden = page.evaluate(WIDE_TABLE_PROBE)
                if hidden:
                    failures.append(f"{rel}: errata tables scroll sideways at 1280 px (columns hidden): {hidden[:3]}")
                wide = page.evaluate(OVERFLOW_PROBE)["wide"]
                if wide:
                    failures.append(f"{rel}: {len(wide)} display equations wider than the text column at "
                                    f"1280 px (split them over aligned lines): {wide[:3]}")
        finally:
            browser.close()
    assert visited >= 2
    assert not failures, "\n".join(failures)


@pytest.mark.browser
def test_pages_fit_a_phone_screen(book_url):
    """390 px: nothing wider than the screen outside a sideways-scrolling box, table columns of
    at least ~6 characters, inline formulas inside their paragraph; screenshots of every page."""
    sync_api = _need_browser()
    failures, visited = [], 0
    with sync_api.sync_playwright() as p:
        browser = _chromium(sync_api, p)
        try:
            phone = browser.new_page(viewport=PHONE, device_scale_factor=2, is_mobile=True, has_touch=True)
            _offline(phone)
            for path in _content_pages():
                rel = path.relative_to(HTML).as_posix()
                phone.goto(book_url + rel, wait_until="load")
                phone.evaluate(PROBE)  # waits for MathJax
                visited += 1
                inline = phone.evaluate(OVERFLOW_PROBE)["inline"]
                if inline:
                    failures.append(f"{rel}: {len(inline)} inline formulas run past their paragraph at 390 px "
                                    f"(make them display math): {inline[:3]}")
                fit = phone.evaluate(PHONE_PROBE, MIN_COLUMN_CHARS)
                if fit["pageWidth"] > fit["vw"] + 1:
                    failures.append(f"{rel}: the page is {fit['pageWidth']} px wide at {fit['vw']} px (scrolls sideways)")
                if fit["nWide"]:
                    failures.append(f"{rel}: {fit['nWide']} elements wider than the screen outside a scrolling box: "
                                    f"{fit['wide'][:4]}")
                if fit["narrow"]:
                    failures.append(f"{rel}: table columns narrower than ~6 characters: {fit['narrow'][:4]}")
                _shot(phone, "phone", rel)
        finally:
            browser.close()
    assert visited >= 2
    assert not failures, "\n".join(failures)


@pytest.mark.browser
def test_search_snippets_have_no_raw_latex(book_url):
    sync_api = _need_browser()
    with sync_api.sync_playwright() as p:
        browser = _chromium(sync_api, p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            _offline(page)
            page.goto(book_url + "search.html?q=" + "注意力", wait_until="load")
            result = page.evaluate(SEARCH_PROBE)
            _shot(page, "desktop", "search.html")
        finally:
            browser.close()
    assert result["n"] > 0, "searching 注意力 found nothing"
    assert result["snippets"], "no result snippets were shown"
    raw = [s[:120] for s in result["snippets"] if re.search(r"\\[()\[\]]|\\[A-Za-z]{2,}|\$", s)]
    assert not raw, "search snippets show raw LaTeX:\n" + "\n".join(raw[:5])


def test_errata_page_shows_every_row_of_its_source():
    from _tools import load_tool

    data = load_tool("errata").load()
    soup = _soup(HTML / "appendix" / "errata.html")
    tables = soup.select("table")
    assert len(tables) == len(data["chapters"]) + 1
    for table, chapter in zip(tables, data["chapters"]):
        body_rows = [tr for tr in table.select("tr") if tr.find("td")]
        assert len(body_rows) == len(chapter["rows"]), chapter["chapter"]
        for tr, row in zip(body_rows, chapter["rows"]):
            hrefs = [a.get("href", "") for a in tr.find_all("a")]
            assert any(h.endswith(f"#{row['box']}") for h in hrefs), (row["box"], hrefs)
    assert len([tr for tr in tables[-1].select("tr") if tr.find("td")]) == len(data["confirmed"])


def test_glossary_terms_are_linked_from_the_chapters():
    soup = _soup(HTML / "appendix" / "glossary.html")
    entries, names = [], []                      # one entry: the ids of its <dt>s (key + aliases)
    for el in soup.select("dl.glossary > dt, dl.glossary > dd"):
        if el.name == "dt":
            names.append(el.get("id"))
        elif names:
            entries.append(set(filter(None, names)))
            names = []
    assert len(entries) >= 40
    linked = set()
    for page in sorted((HTML / "chapters").glob("*.html")):
        for a in _soup(page).select("a.reference"):
            href = a.get("href", "")
            if "glossary.html#" in href:
                linked.add(unquote(href.split("#", 1)[1]))
    missing = [sorted(ids) for ids in entries if not ids & linked]
    assert not missing, f"glossary entries no chapter links to: {missing[:10]}"


_CJK = r"[\u2e80-\u9fff\u3000-\u303f\uff00-\uffef]"


def test_no_line_breaks_between_chinese_characters():
    """A source line break between two Chinese characters would show as a space in Chromium and
    Safari; tools/book_pages.py removes them (formulas and code are left alone)."""
    found = []
    for page in _content_pages():
        soup = bs4.BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
        article = soup.select_one("article") or soup
        for el in article.select("span.math, div.math, pre, code, script, style"):
            el.replace_with("x")
        for block in article.find_all(["p", "li", "td", "th", "dd", "dt", "figcaption"]):
            for m in re.finditer(rf"{_CJK}[ \t]*\n\s*{_CJK}", block.get_text()):
                found.append(f"{page.relative_to(HTML)}: {m.group(0)!r}")
    assert not found, f"{len(found)} line breaks between Chinese characters, e.g. {found[:5]}"


# ------------------------------------------------------------------ code width (CHAPTER.md 14)

# Every code block the reader sees in a chapter: the cells' code (inputs), what they print
# (outputs), and library source shown with show_source (a Markdown code fence inside an output,
# captioned "`attnbook/x.py`, lines a–b"). Folded cells (hide-input, dropdowns) are opened first:
# a reader who clicks them sees the same blocks. For each block: how many pixels of it are hidden
# to the right (scrollWidth - clientWidth), and how many monospace characters its column shows.
CODE_WIDTH_PROBE = r"""() => {
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  document.querySelectorAll('.toggle-hidden').forEach(e => e.classList.remove('toggle-hidden'));
  const article = document.querySelector('article.bd-article') || document.body;
  const caption = pre => {
    // show_source: the fence's container is preceded, inside the output, by its caption paragraph
    let box = pre;
    while (box.parentElement && !box.parentElement.matches('.cell_output, .output')) box = box.parentElement;
    for (let p = box.previousElementSibling; p; p = p.previousElementSibling) {
      const m = p.textContent.match(/([\w./-]+\.py)\S*,\s*lines\s+(\d+)\s*[\u2013-]\s*(\d+)/);
      if (m) return {file: m[1], first: parseInt(m[2])};
      if (p.querySelector('pre')) break;
    }
    return null;
  };
  const charWidth = pre => {
    const probe = document.createElement('span');
    probe.textContent = 'x'.repeat(100);
    probe.style.whiteSpace = 'pre';
    (pre.querySelector('code') || pre).appendChild(probe);
    const w = probe.getBoundingClientRect().width / 100;
    probe.remove();
    return w;
  };
  const seen = new Set(), blocks = [], count = {input: 0, output: 0, source: 0};
  const selector = 'div.cell_input pre, div.cell_output pre, .output pre';
  for (const pre of article.querySelectorAll(selector)) {
    if (seen.has(pre)) continue;
    seen.add(pre);
    const src = pre.closest('div.cell_input') ? null : caption(pre);
    const kind = pre.closest('div.cell_input') ? 'input' : (src ? 'source' : 'output');
    const index = count[kind]++;
    if (pre.clientWidth === 0) continue;                        // not displayed
    const cs = getComputedStyle(pre);
    const content = pre.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
    const cw = charWidth(pre);
    const chars = Math.floor(content / cw + 0.01);
    const lines = pre.textContent.replace(/\n$/, '').split('\n');
    const long = lines.map((l, i) => [i, l.length]).filter(([i, n]) => n > chars)
                      .map(([i, n]) => src ? `${src.file}:${src.first + i} (${n})` : `line ${i + 1} (${n})`);
    blocks.push({kind, index, chars, fontPx: parseFloat(cs.fontSize),
                 overflow: pre.scrollWidth - pre.clientWidth,
                 first: (lines.find(l => l.trim()) || '').trim().slice(0, 70), long: long.slice(0, 12)});
  }
  return blocks;
}"""

DESKTOPS = (1280, 1920)
MIN_CODE_FONT_PX = 13            # code may be a little smaller than the prose, never below this


def _measure_code(book_url, widths=DESKTOPS) -> dict[int, dict[str, list[dict]]]:
    """{viewport width: {page: [block, ...]}} for every chapter and appendix page."""
    sync_api = _need_browser()
    found: dict[int, dict[str, list[dict]]] = {width: {} for width in widths}
    with sync_api.sync_playwright() as p:
        browser = _chromium(sync_api, p)
        try:
            page = browser.new_page(viewport={"width": widths[0], "height": 900})
            _offline(page)
            for path in _content_pages():
                rel = path.relative_to(HTML).as_posix()
                page.set_viewport_size({"width": widths[0], "height": 900})
                page.goto(book_url + rel, wait_until="load")
                page.evaluate(PROBE)                            # waits for MathJax (layout settles)
                for width in widths:                            # one load, measured at each width
                    page.set_viewport_size({"width": width, "height": 900})
                    page.wait_for_timeout(100)
                    found[width][rel] = page.evaluate(CODE_WIDTH_PROBE)
        finally:
            browser.close()
    return found


@pytest.fixture(scope="module")
def code_blocks(book_url):
    return _measure_code(book_url)


def _overflowing(code_blocks, kinds) -> list[str]:
    rows = []
    for width, pages in code_blocks.items():
        for rel, blocks in pages.items():
            for b in blocks:
                if b["kind"] in kinds and b["overflow"] > 0:
                    rows.append(f"{width} px {rel} {b['kind']} #{b['index']}: {b['overflow']} px hidden, "
                                f"{b['chars']} characters visible, longer lines {b['long'][:4]}: {b['first']!r}")
    return rows


@pytest.mark.browser
def test_code_cells_and_outputs_do_not_scroll_sideways_on_a_desktop(code_blocks):
    """CHAPTER.md point 14: at 1280 and 1920 px no code cell and no printed output scrolls sideways
    (at 390 px code may scroll inside its own box: test_pages_fit_a_phone_screen)."""
    n = {w: sum(len(b) for b in pages.values()) for w, pages in code_blocks.items()}
    assert all(v > 300 for v in n.values()), f"expected the book's ~600 code blocks, measured {n}"
    rows = _overflowing(code_blocks, {"input", "output"})
    assert not rows, (f"{len(rows)} code blocks scroll sideways (move trailing comments above the line, "
                      "wrap the call, shorten the printed line):\n" + "\n".join(rows))


@pytest.mark.browser
def test_code_column_shows_the_line_length_rule_at_1280_px(code_blocks):
    """The line-length rule of the notebook test (tools/colab.py MAX_LINE) is what the column shows."""
    from _tools import load_tool

    limit = load_tool("colab").MAX_LINE
    inputs = [b for pages in code_blocks.values() for bs in pages.values() for b in bs if b["kind"] == "input"]
    at_1280 = [b for bs in code_blocks[1280].values() for b in bs if b["kind"] == "input"]
    assert at_1280, "no code cell measured at 1280 px"
    shown = min(b["chars"] for b in at_1280)
    assert shown >= limit, f"code cells show {shown} characters at 1280 px, the line-length rule allows {limit}"
    small = sorted({b["fontPx"] for b in inputs if b["fontPx"] < MIN_CODE_FONT_PX})
    assert not small, f"code font {small} px is below {MIN_CODE_FONT_PX} px"


@pytest.mark.browser
def test_library_source_shown_in_chapters_does_not_scroll_sideways(code_blocks):
    """show_source prints lib/ verbatim: a line too long for the column is shortened in lib/."""
    rows = _overflowing(code_blocks, {"source"})
    assert not rows, f"{len(rows)} shown library listings scroll sideways (shorten these lines in lib/):\n" + "\n".join(rows)

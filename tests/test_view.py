"""kloop view: one self-contained HTML page per run or suite, read offline; checked in a real headless browser
(Debian's chromium driven by Playwright) where one is installed."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import evaluated
from agent.cli import app
from test_export import GPU, kernel
from tools.records.store import attempt_columns, open_db

HOSTILE = '<script>alert(1)</script><img src="https://example.com/x.png">'


def make_run(store, timed: bool = True) -> str:
    """#1 a correct kernel, #2 from #1 (faster), #3 from #2 failing with a reason that is HTML, #4 from #2 (the
    same source as #2)."""
    run_id = store.create_run(target_name="vector_add", policy="offline", gpu_name=GPU["name"] if timed else None,
                              settings={"strategy": "evolve", "target_sol": 0.9})

    def add(source, verdict, median=None, parent=None, **extra):
        result = evaluated.result(verdict, median if timed else None, eager_us=30.0 if timed else None,
                                  gpu=GPU if timed else None, nbytes=3 << 22, **extra)
        return store.add_attempt(run_id, source=source, parent_attempt_id=parent, **attempt_columns(result),
                                 **({"parent_reason": f"evolve: the island's best elite, attempt #{parent}",
                                     "island": 1} if parent else {}))

    first = add(kernel(256), "correct", 25.0)
    second = add(kernel(1024), "correct", 15.0, parent=first)
    add(kernel(1024).replace(") + tl.load(y_ptr", ") - tl.load(y_ptr"), "incorrect", parent=second, reasons=[f"incorrect: {HOSTILE}"])
    add(kernel(1024), "correct", 15.5, parent=second)
    store.update_run(run_id, status="finished", best_attempt_id=second, notes="reached 4 attempts")
    return run_id


def view(*args):
    return CliRunner().invoke(app, ["view", *map(str, args)])


@pytest.fixture
def run_page(tmp_path):
    db = tmp_path / "k.db"
    store = open_db(db)
    run_id = make_run(store)
    store.close()
    out = tmp_path / "pages" / "run.html"
    done = view(run_id, "--db", db, "--out", out)
    assert done.exit_code == 0, done.output
    assert done.output.startswith(f"wrote {out} (")
    return out, run_id


def test_a_run_page_carries_everything_and_loads_nothing(run_page):
    out, run_id = run_page
    page = out.read_text()
    assert page.count('<img class="plot"') == 2 and page.count('src="data:image/png;base64,') == 2
    assert not re.search(r'(src|href)="(?!data:|#)', page), "every src/href is inline or in-page"
    assert "<script" not in page and HOSTILE not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count('<div class="attempt" id="a') == 4
    assert '<td><a href="#a1">#1</a></td>' in page                     # #2's parent in the table
    assert "evolve: the island&#39;s best elite, attempt #2 (island 1)" in page
    assert "diff against its parent, attempt 2 (2 lines changed)" in page
    assert "same source as its parent, attempt 2" in page              # #4: nothing to diff
    assert 'class="best"' in page and "Best: <a href=\"#a2\">attempt 2</a>" in page
    assert '<span class="k">def</span>' in page                         # Pygments' Python tokens


def test_a_cpu_run_says_why_nothing_is_ranked(tmp_path):
    db = tmp_path / "k.db"
    store = open_db(db)
    run_id = make_run(store, timed=False)
    store.close()
    assert view(run_id, "--db", db, "--out", tmp_path / "cpu.html").exit_code == 0
    page = (tmp_path / "cpu.html").read_text()
    assert "No attempt was timed" in page and "untimed attempts are not ranked" in page
    assert page.count('<img class="plot"') == 1                         # the verdicts; no roofline without timing


def test_bad_input_is_one_line(tmp_path):
    db = tmp_path / "k.db"
    open_db(db).close()
    for args, message in (([], "give a RUN_ID or --suite"), (["nope"], f"no run nope in {db}"),
                          (["--suite"], "holds no suite")):
        done = view(*args, "--db", db)
        assert done.exit_code == 2 and message in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


def make_suite(db: Path) -> list[str]:
    from agent.suite import PROBLEMS_TABLE, ensure_tables

    store = open_db(db)
    ensure_tables(store)
    run_ids = [make_run(store), make_run(store)]
    for n, run_id in enumerate(run_ids + [None]):
        store.db[PROBLEMS_TABLE].insert({"settings_key": "k", "settings": "{}", "problem": f"level1/{n + 1}_op.py",
                                         "path": f"{n + 1}_op.py", "level": 1, "target_sha256": str(n),
                                         "strategy": "evolve", "policy": "offline",
                                         "status": "finished" if run_id else None, "run_id": run_id})
    store.close()
    return run_ids


def test_a_suite_page_links_each_problem_to_its_run(tmp_path):
    db = tmp_path / "k.db"
    first, second = make_suite(db)
    done = view("--suite", "--db", db)
    assert done.exit_code == 0, done.output
    page = (tmp_path / "suite.html").read_text()
    assert f'<a href="#r{first}-run">{first}</a>' in page and f'<section id="r{second}-run">' in page
    assert page.count("<tr>\n<td>level1/") == 3 and "not reached" in page
    assert f'<div class="attempt" id="r{second}-a3">' in page and f'<a href="#r{second}-a1">#1</a>' in page


# -- in a browser ----------------------------------------------------------------------------------------------------
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def browser():
    if CHROMIUM is None:
        pytest.skip("no Chromium installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="no Playwright installed (pip install playwright)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


def open_page(browser, path: Path):
    """The page, with every console error, page error and request that left the file collected."""
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    seen = {"errors": [], "requests": []}
    page.on("console", lambda m: seen["errors"].append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: seen["errors"].append(str(e)))
    page.on("request", lambda r: seen["requests"].append(r.url)
            if not r.url.startswith(("file:", "data:")) else None)
    page.goto(path.as_uri())
    return page, seen


def test_the_run_page_in_a_browser(browser, run_page, tmp_path):
    out, _ = run_page
    page, seen = open_page(browser, out)
    assert page.title().startswith("kloop run ")
    plots = page.locator("img.plot")
    assert plots.count() == 2
    assert all(page.evaluate("(img) => img.complete && img.naturalWidth > 300", plots.nth(i).element_handle())
               for i in range(2))
    page.screenshot(path=tmp_path / "top.png")
    # a parent link moves to the parent's section
    page.locator("#a3 dd a").click()
    assert page.url.endswith("#a2") and page.evaluate("document.querySelector(':target').id") == "a2"
    # the diff opens on a click and shows the change
    diff = page.locator("#a3 details.diff")
    assert not diff.locator("pre").is_visible()
    diff.locator("summary").click()
    assert diff.locator("pre").is_visible()
    shown = diff.locator("pre").inner_text()
    assert ") + tl.load(y_ptr" in shown and ") - tl.load(y_ptr" in shown
    assert "+++ attempt 3" in shown and "--- attempt 2" in shown
    page.locator("#a3 details.source summary").click()
    assert "@triton.jit" in page.locator("#a3 details.source pre").inner_text()
    page.screenshot(path=tmp_path / "diff.png", full_page=False)
    assert seen == {"errors": [], "requests": []}


def test_the_suite_page_in_a_browser(browser, tmp_path):
    db = tmp_path / "k.db"
    _, second = make_suite(db)
    assert view("--suite", "--db", db).exit_code == 0
    page, seen = open_page(browser, tmp_path / "suite.html")
    page.screenshot(path=tmp_path / "suite.png")
    page.locator(f'#problems a[href="#r{second}-run"]').click()
    assert page.url.endswith(f"#r{second}-run")
    assert page.evaluate(f"document.getElementById('r{second}-run').getBoundingClientRect().top") < 5
    assert seen == {"errors": [], "requests": []}

"""One HTML page shell (issue 31 item 5): every report Partita writes - the plan/estimate
report, ``partita profile --report``, ``partita analyze --report`` - is a document built by
:func:`partita.report.html_page.html_page`, and no other module writes a document of its own."""
from __future__ import annotations

from pathlib import Path

import pytest

from partita.errors import PartitaError
from partita.report.html_page import html_page, write_page

SRC = Path(__file__).resolve().parents[1] / "src" / "partita"
SHELL = SRC / "report" / "html_page.py"


def test_only_the_shell_writes_an_html_document():
    writers = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                     if "<!DOCTYPE" in p.read_text() or "<html" in p.read_text())
    assert writers == [str(SHELL.relative_to(SRC))]


def test_the_shell_escapes_the_title_once_in_title_and_heading():
    page = html_page("a <b> & c", "<p>body</p>", heading="h1")
    assert page.startswith("<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>a &lt;b&gt; &amp; c</title>")
    assert "<h1>a &lt;b&gt; &amp; c</h1>\n<p>body</p>\n</body></html>\n" in page


def test_a_page_that_cannot_be_written_is_one_line(tmp_path):
    with pytest.raises(PartitaError, match=r"^cannot write --report "):
        write_page(tmp_path / "missing" / "r.html", "x")
    with pytest.raises(PartitaError, match="cannot write"):
        write_page(tmp_path / ("n" * 300 + ".html"), "x")  # a name longer than the file system allows

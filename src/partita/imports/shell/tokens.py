"""Bash's words and operators: quotes, ``$(...)`` / ``${...}`` / ``$((...))`` kept whole, here-documents
(bash(1), "QUOTING" and "Here Documents")."""
from __future__ import annotations

import re

from .base import _NAME, ShellError


def _scan_balanced(text: str, i: int, open_: str, close: str) -> int:
    """Index after the ``close`` matching the ``open_`` at ``text[i]`` (quotes respected)."""
    depth, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "'" and open_ != "{":
            j = text.find("'", i + 1)
            i = (j if j >= 0 else n) + 1
            continue
        if c == '"':
            i = _scan_dquote(text, i)
            continue
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ShellError(f"unbalanced {open_}{close}")


def _scan_dquote(text: str, i: int) -> int:
    """Index after the double-quoted string starting at ``text[i]``."""
    i += 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
        elif c == '"':
            return i + 1
        elif text.startswith("$(", i):
            i = _scan_balanced(text, i + 1, "(", ")")
        elif text.startswith("${", i):
            i = _scan_balanced(text, i + 1, "{", "}")
        else:
            i += 1
    raise ShellError("unterminated double quote")


#: A here-document's word: this mark, "Q" (quoted delimiter: no expansion) or "U", then the body.
HEREDOC = "\x00heredoc:"


def _heredoc_start(text: str, i: int) -> tuple[tuple[str, bool, bool], int]:
    """((delimiter, strip leading tabs, quoted), index after the delimiter) of ``<<[-]WORD`` at ``i``."""
    j = i + 2
    strip = text[j:j + 1] == "-"
    j += strip
    while j < len(text) and text[j] in " \t":
        j += 1
    m = re.match(r"""(?:'[^']*'|"[^"]*"|[^\s;&|<>()])+""", text[j:])
    raw = m.group(0) if m else ""
    return (re.sub(r"""['"\\]""", "", raw), strip, raw != re.sub(r"""['"\\]""", "", raw)), j + len(raw)


def _heredoc_body(text: str, i: int, delimiter: str, strip: bool) -> tuple[str, int]:
    """(the body, the index after its delimiter line) of a here-document starting at ``i``."""
    lines = []
    while i < len(text):
        end = text.find("\n", i)
        end = len(text) if end < 0 else end
        line = text[i:end]
        i = end + 1
        if (line.lstrip("\t") if strip else line) == delimiter:
            return "".join(lines), i
        lines.append((line.lstrip("\t") if strip else line) + "\n")
    return "".join(lines), len(text)


_OPS = ("&&", "||", ";;", "|&", ";", "|", "&", "(", ")", "\n")


def _part_end(text: str, i: int) -> int:
    """Index after the word part at ``text[i]``: a quoted string, ``$(...)``, ``${...}``, a backquote
    command, an escaped character, or one plain character."""
    c, n = text[i], len(text)
    if c == "\\":
        return i + 2
    if c == "'":
        j = text.find("'", i + 1)
        if j < 0:
            raise ShellError("unterminated single quote")
        return j + 1
    if c == '"':
        return _scan_dquote(text, i)
    if c == "`":
        return (text.find("`", i + 1) + 1) or n
    if c == "$" and i + 1 < n and text[i + 1] in "({":
        return _scan_balanced(text, i + 1, text[i + 1], ")" if text[i + 1] == "(" else "}")
    return i + 1


def tokenize(text: str) -> list[tuple[str, str, int]]:
    """``(kind, text, line)`` tokens: ``word`` (quotes kept for expansion) or ``op``; comments and
    ``\\``-newlines dropped, an array ``NAME=( ... )`` kept as one word."""
    tokens: list[tuple[str, str, int]] = []
    pending: list[tuple[int, str, bool, bool]] = []  # here-documents whose body starts at the next line
    i, n, word, line = 0, len(text), "", 1
    def flush() -> None:
        nonlocal word
        if word:
            tokens.append(("word", word, line))
            word = ""
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] == "\n":
            i, line = i + 2, line + 1
            continue
        if c == "#" and not word:
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c in " \t\r":
            flush()
            i += 1
            continue
        if c == "(" and re.fullmatch(rf"{_NAME}(\[[^\]]*\])?\+?=", word):
            j = _scan_balanced(text, i, "(", ")")
            word += text[i:j]
            line += text.count("\n", i, j)
            i = j
            continue
        if c == "(" and text.startswith("((", i) and not word:
            j = _scan_balanced(text, i, "(", ")")
            tokens.append(("word", text[i:j], line))
            i = j
            continue
        if text.startswith("<<", i) and not text.startswith("<<<", i):  # a here-document: body after the line
            flush()
            heredoc, i = _heredoc_start(text, i)
            pending.append((len(tokens), *heredoc))
            tokens.append(("word", HEREDOC, line))
            continue
        if c in "<>" or text.startswith("&>", i):  # a redirection stays in the word: 2>&1, &>log, >>log
            j = i + 1 + (text[i + 1:i + 2] in "<>")
            m = re.match(r"&(\d+|-)?", text[j:])
            j += m.end() if m and c != "&" else 0
            word += text[i:j]
            i = j
            continue
        op = next((o for o in _OPS if text.startswith(o, i)), None)
        if op:
            flush()
            tokens.append(("op", op, line))
            line += op == "\n"
            i += len(op)
            for index, delimiter, strip, quoted in pending if op == "\n" else ():
                body, i = _heredoc_body(text, i, delimiter, strip)
                tokens[index] = ("word", HEREDOC + ("Q" if quoted else "U") + body, tokens[index][2])
                line += body.count("\n") + 1
            pending = [] if op == "\n" else pending
            continue
        j = _part_end(text, i)
        line += text.count("\n", i, j)
        word += text[i:j]
        i = j
    flush()
    return tokens

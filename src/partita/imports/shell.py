"""Launch scripts read the way bash runs them (issue 32 item 1), without running them.

:func:`read_script` evaluates the part of bash that launch scripts use to build a command line
(survey in docs/export.md "Import"): assignments and ``export``, arrays with ``+=`` and re-declared
with their own contents, ``${VAR:-x}`` / ``${VAR:=x}`` / ``${VAR:+x}`` / ``${#VAR}`` / ``%`` ``#``
trims, ``$((...))``, ``\\`` continuations, ``if``/``elif``/``else``, ``case``, ``for``, ``[ ]`` and
``[[ ]]`` tests, ``&&`` / ``||`` / ``!``, ``while`` / ``break``, shell functions, positional arguments
and ``shift`` / ``set --``, ``source`` of files that exist, ``$(...)`` that only prints, and the job
scripts of ``sbatch <<EOF`` / ``bash -c`` / ``srun ... bash -c`` (``#SBATCH`` flags given to ``srun``).
Commands are never executed: every command the script would run is recorded with its expanded argv
(:attr:`ShellRun.commands`), so the launcher and the training entry point are found as bash would
call them. What cannot be known without running the script (a variable with no value, another
command's output) is recorded in :attr:`ShellRun.unknown` with the flag of ours that supplies it;
what a condition had to assume (an unset variable read as empty, a file of the cluster's taken as
present, a loop stopped) in :attr:`ShellRun.assumed`. :func:`partita.imports.shell_run.run_script` is the other
mechanism (the script run under bash with shims), only with the user's consent.

Bash's own semantics are the reference (bash(1), "EXPANSION" and "Arrays"); the reader is ours.
"""
from __future__ import annotations

import fnmatch
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

#: torchrun / torch.distributed.run / deepspeed launcher flags giving ranks per node and nodes.
_PER_NODE = ("--nproc-per-node", "--nproc_per_node", "--num_gpus", "--num-gpus")
_NODES = ("--nnodes", "--num_nodes", "--num-nodes")
LAUNCHER_FLAGS = _PER_NODE + _NODES + ("--ntasks-per-node", "--nodes", "--ntasks", "-np", "--worker_num")
#: A training entry point of Megatron-LM / MindSpeed-LLM (pretrain_gpt.py, pretrain_mamba.py, posttrain_gpt.py).
ENTRY = re.compile(r"(^|/)(pre|post)train_\w*\.py$")
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ASSIGN_HEAD = re.compile(rf"^({_NAME})(\[[^\]]*\])?(\+?)=")
_MAX_STEPS = 100_000  # statements evaluated before giving up (a loop that never ends)
_MAX_SOURCE_DEPTH = 8
_MAX_LOOP = 100  # rounds of a while/until loop whose condition never changes here


@dataclass
class ShellRun:
    """What reading a script found: the commands it runs (expanded argv, in order), and what
    could not be known, as ``{what: the flag that supplies it}``."""

    commands: list[list[str]] = field(default_factory=list)
    #: what the reader could not know, as the text it left in the argv (``${NAME}``, ``$1``, ``$(cmd)``)
    unknown: dict[str, str] = field(default_factory=dict)
    #: variables a condition read while unset (bash took them as empty): {"$NAME": "--env NAME=..."}
    assumed: dict[str, str] = field(default_factory=dict)


class ShellError(ValueError):
    """A script this reader cannot follow (unbalanced quotes, a loop that does not end)."""


# ---------------------------------------------------------------- tokens


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


# ---------------------------------------------------------------- parse

class _Parser:
    """Tokens -> nested tuples: ``("cmd", words, line)``, ``("andor", [node, op, node, ...])``,
    ``("if", [(cond, body), ...], else_body)``, ``("case", word, [(patterns, body), ...])``,
    ``("for", name, words, body)``, ``("while", cond, body)``, ``("func", name, body)``, ``("group", body)``."""

    def __init__(self, tokens: list[tuple[str, str, int]]):
        self.toks, self.i = tokens, 0

    def peek(self, offset: int = 0) -> tuple[str, str, int] | None:
        j = self.i + offset
        return self.toks[j] if j < len(self.toks) else None

    def at_word(self, *words: str) -> bool:
        t = self.peek()
        return t is not None and t[0] == "word" and t[1] in words

    def expect(self, word: str) -> None:
        if self.at_word(word):
            self.i += 1
        else:
            t = self.peek()
            raise ShellError(f"expected {word!r} at line {t[2] if t else 'end'}")

    def skip_separators(self) -> None:
        while (t := self.peek()) is not None and t[0] == "op" and t[1] in (";", "\n", "&"):
            self.i += 1

    def parse_list(self, *stop: str) -> list:
        """Statements until one of the ``stop`` words starts a command (or the end, or ``)`` / ``;;``)."""
        body = []
        while True:
            self.skip_separators()
            t = self.peek()
            if t is None or (t[0] == "word" and t[1] in stop) or (t[0] == "op" and t[1] in (")", ";;")):
                return body
            body.append(self.parse_andor())

    def parse_andor(self):
        parts = [self.parse_pipeline()]
        while (t := self.peek()) is not None and t[0] == "op" and t[1] in ("&&", "||"):
            self.i += 1
            while self.peek() is not None and self.peek()[1] == "\n":
                self.i += 1
            parts += [t[1], self.parse_pipeline()]
        return parts[0] if len(parts) == 1 else ("andor", parts)

    def parse_pipeline(self):
        negate = self.at_word("!")
        self.i += negate
        cmds = [self.parse_command()]
        while (t := self.peek()) is not None and t[0] == "op" and t[1] in ("|", "|&"):
            self.i += 1
            cmds.append(self.parse_command())
        node = cmds[0] if len(cmds) == 1 else ("group", cmds)
        return ("not", node) if negate else node

    def parse_command(self):
        t = self.peek()
        if t is None:
            raise ShellError("a command is missing at the end")
        if t[0] == "op" and t[1] == "(":
            self.i += 1
            body = self.parse_list()
            self._close(")")
            return ("group", body)
        keyword = {"if": self.parse_if, "case": self.parse_case, "for": self.parse_for, "while": self.parse_while,
                   "until": self.parse_while, "{": self.parse_brace, "function": self.parse_function}
        if t[0] == "word" and t[1] in keyword:
            return keyword[t[1]]()
        nxt, after = self.peek(1), self.peek(2)
        if t[0] == "word" and nxt == ("op", "(", nxt[2] if nxt else 0) and after and after[1] == ")":
            self.i += 3
            return self._function_body(t[1])
        return self.parse_simple()

    def _close(self, op: str) -> None:
        t = self.peek()
        if t is None or t[1] != op:
            raise ShellError(f"expected {op!r} at line {t[2] if t else 'end'}")
        self.i += 1

    def parse_simple(self):
        words, line = [], self.peek()[2]
        in_test = False
        while (t := self.peek()) is not None and (t[0] == "word" or (in_test and t[1] in ("&&", "||", "(", ")"))):
            in_test = (in_test or (not words and t[1] == "[[")) and t[1] != "]]"
            words.append(t[1])
            self.i += 1
        if not words:
            raise ShellError(f"unexpected {t[1]!r} at line {t[2]}" if t else "unexpected end")
        return ("cmd", words, line)

    def parse_if(self):
        branches, else_body = [], []
        self.expect("if")
        while True:
            cond = self.parse_list("then")
            self.expect("then")
            branches.append((cond, self.parse_list("elif", "else", "fi")))
            if self.at_word("elif"):
                self.i += 1
                continue
            if self.at_word("else"):
                self.i += 1
                else_body = self.parse_list("fi")
            self.expect("fi")
            return ("if", branches, else_body)

    def parse_case(self):
        self.expect("case")
        subject = self.peek()[1]
        self.i += 1
        self.expect("in")
        clauses = []
        while True:
            self.skip_separators()
            if self.at_word("esac"):
                self.i += 1
                return ("case", subject, clauses)
            if self.peek() and self.peek()[1] == "(":
                self.i += 1
            patterns = []
            while (t := self.peek()) is not None and t[1] != ")":
                if t[0] == "word":
                    patterns.append(t[1])
                self.i += 1
            self._close(")")
            clauses.append((patterns, self.parse_list("esac")))
            if self.peek() and self.peek()[1] == ";;":
                self.i += 1

    def parse_for(self):
        self.expect("for")
        name = self.peek()[1]
        self.i += 1
        words = []
        if self.at_word("in"):
            self.i += 1
            while (t := self.peek()) is not None and t[0] == "word" and t[1] != "do":
                words.append(t[1])
                self.i += 1
        else:
            words = ['"$@"']
        self.skip_separators()
        self.expect("do")
        body = self.parse_list("done")
        self.expect("done")
        return ("for", name, words, body)

    def parse_while(self):
        kind = self.peek()[1]
        self.i += 1
        cond = self.parse_list("do")
        self.expect("do")
        body = self.parse_list("done")
        self.expect("done")
        return ("while", kind, cond, body)

    def parse_brace(self):
        self.expect("{")
        body = self.parse_list("}")
        self.expect("}")
        return ("group", body)

    def parse_function(self):
        self.expect("function")
        name = self.peek()[1]
        self.i += 1
        if self.peek() and self.peek()[1] == "(":
            self.i += 2
        return self._function_body(name)

    def _function_body(self, name: str):
        self.skip_separators()
        return ("func", name, self.parse_command())


# ---------------------------------------------------------------- expansion

_REDIRECT = re.compile(r"^\d*(>>?|<|&>|>&|<&)(&?(\d+|-))?")


class _Break(Exception):
    """``break`` / ``continue`` inside a loop."""

    def __init__(self, cont: bool):
        super().__init__()
        self.cont = cont


class _Done(Exception):
    """``exit`` / ``return``: stop the script (or the function)."""

    def __init__(self, function_only: bool):
        super().__init__()
        self.function_only = function_only


class _Shell:
    """Evaluates a parsed script; variables are ``str`` or ``list[str]`` (arrays)."""

    def __init__(self, args: list[str], env: dict[str, str], script: Path | None, run: ShellRun):
        self.vars: dict[str, str | list[str]] = dict(env)
        self.args = list(args)
        self.script = script
        self.run = run
        self.functions: dict[str, object] = {}
        self.steps = 0
        self.depth = 0
        self.output: list[str] | None = None  # inside $(...): what echo/dirname/... print
        self.srun_defaults: list[str] = []  # inside an sbatch job: its #SBATCH flags
        self.prefix: list[str] = []  # inside ``srun ... bash -c CMD``: the launcher before each command
        self.cwd: str | None = None  # after a ``cd``
        self.status = 0

    # -- unknowns
    def unknown(self, name: str, why: str | None = None) -> str:
        """Record ``name`` as unknown; its text in the argv (``$NAME``) names it in later errors."""
        marker = f"${name}" if name.isdigit() else f"${{{name}}}"
        self.run.unknown.setdefault(marker, why or ("--args (the script's positional arguments)" if name.isdigit()
                                                    else f"--env {name}=..."))
        return marker

    def get(self, name: str, index: str | None = None, *, strict: bool = True) -> list[str] | None:
        """The value of ``name`` (``index`` "@" for all elements), None when unset."""
        if name.isdigit():
            k = int(name)
            value: str | list[str] | None = (str(self.script or "script") if k == 0 else
                                             self.args[k - 1] if k <= len(self.args) else None)
        elif name in ("@", "*"):
            return list(self.args)
        elif name == "#":
            return [str(len(self.args))]
        elif name == "?":
            return [str(self.status)]
        else:
            value = self.vars.get(name)
        if value is None:
            return None
        if isinstance(value, str):
            value = [value]
        if index in ("@", "*"):
            return list(value)
        k = int(self.arith(index)) if index else 0
        return [value[k]] if -len(value) <= k < len(value) else None

    # -- arithmetic
    def arith(self, expr: str) -> int:
        """``$(( expr ))``: variables (bare or ``$``) substituted, then integer arithmetic as bash's."""
        text = self.expand_string(expr, quoted=True)
        def value(m: re.Match) -> str:
            got = self.get(m.group(0))
            if got is None:
                self.unknown(m.group(0))
                raise ShellError(f"${m.group(0)} has no value")
            return got[0] or "0"
        for _ in range(5):  # a variable holding another name (bash evaluates it recursively)
            new = re.sub(_NAME, value, text)
            if new == text:
                break
            text = new
        return _arith_eval(text)


def _arith_eval(text: str) -> int:
    """Integer arithmetic of bash (``/`` truncates toward zero; ``**``; comparisons give 0/1; ``? :``)."""
    import ast
    text = text.replace("&&", " and ").replace("||", " or ")
    text = re.sub(r"(?<![=!<>])!(?!=)", " not ", text)
    text = re.sub(r"([^?:]+)\?([^:]+):(.+)", r"(\2) if (\1) else (\3)", text)
    text = re.sub(r"\b0+(\d)", r"\1", text)  # 08: decimal here (bash would read octal: no launch script means it)
    try:
        tree = ast.parse(text.strip() or "0", mode="eval")
    except SyntaxError:
        raise ShellError(f"not integer arithmetic: {text.strip()[:60]}") from None
    def ev(node) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand)
            return {ast.USub: -v, ast.UAdd: v, ast.Not: int(not v), ast.Invert: ~v}[type(node.op)]
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and b == 0:
                raise ShellError("division by zero in $((...))")
            ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                   ast.Div: lambda: abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1),
                   ast.Mod: lambda: a - b * int(a / b), ast.Pow: lambda: a ** b if 0 <= b < 64 else 0,
                   ast.LShift: lambda: a << b, ast.RShift: lambda: a >> b, ast.BitAnd: lambda: a & b,
                   ast.BitOr: lambda: a | b, ast.BitXor: lambda: a ^ b}
            return ops[type(node.op)]()
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            a, b = ev(node.left), ev(node.comparators[0])
            cmp = {ast.Lt: a < b, ast.LtE: a <= b, ast.Gt: a > b, ast.GtE: a >= b, ast.Eq: a == b, ast.NotEq: a != b}
            return int(cmp[type(node.ops[0])])
        if isinstance(node, ast.BoolOp):
            vals = [ev(v) for v in node.values]
            return int(all(vals) if isinstance(node.op, ast.And) else any(vals))
        if isinstance(node, ast.IfExp):
            return ev(node.body) if ev(node.test) else ev(node.orelse)
        raise ShellError(f"not integer arithmetic: {text.strip()[:60]}")
    try:
        return ev(tree)
    except (KeyError, TypeError) as e:
        raise ShellError(f"not integer arithmetic: {text.strip()[:60]}") from e


class _Expander(_Shell):
    """Word expansion: parameters, arrays, arithmetic, quotes, field splitting (bash(1) "EXPANSION")."""

    in_test = False

    def expand_string(self, raw: str, quoted: bool = True) -> str:
        """``raw`` expanded to one string (assignments, ``case`` subjects, arithmetic)."""
        return " ".join(self.expand_word(raw, split=False))

    def expand_word(self, raw: str, split: bool = True) -> list[str]:
        """The fields bash makes of one word (no globbing: a pattern stays as written)."""
        out = _Fields(split)
        i, n = 0, len(raw)
        while i < n:
            c = raw[i]
            if c == "\\":
                out.literal(raw[i + 1:i + 2])
                i += 2
            elif c == "'":
                j = raw.find("'", i + 1)
                j = n if j < 0 else j
                out.literal(raw[i + 1:j])
                i = j + 1
            elif c == '"':
                j = _scan_dquote(raw, i)
                self._double_quoted(raw[i + 1:j - 1], out)
                i = j
            elif c in "$`":
                value, i = self.dollar(raw, i)
                out.unquoted(value)
            else:
                out.literal(c)
                i += 1
        return out.done()

    def _double_quoted(self, body: str, out: "_Fields") -> None:
        if re.fullmatch(rf"\$@|\$\{{@\}}|\$\{{{_NAME}\[@\]\}}", body):  # "${A[@]}": one word per element, none if empty
            out.quoted(self.dollar(body, 0)[0])
            return
        out.literal("")
        i = 0
        while i < len(body):
            c = body[i]
            if c == "\\" and body[i + 1:i + 2] == "\n":  # a continuation inside quotes: removed
                i += 2
            elif c == "\\" and body[i + 1:i + 2] in ('$', '`', '"', "\\"):
                out.literal(body[i + 1])
                i += 2
            elif c in "$`":
                value, i = self.dollar(body, i)
                out.quoted(value)
            else:
                out.literal(c)
                i += 1

    def dollar(self, raw: str, i: int) -> tuple[str | list[str], int]:
        """The value of the expansion at ``raw[i]`` (``$...`` or a backquote) and the index after it."""
        if raw[i] == "`" or raw.startswith("$(", i) and not raw.startswith("$((", i):
            j = (raw.find("`", i + 1) + 1 or len(raw)) if raw[i] == "`" else _scan_balanced(raw, i + 1, "(", ")")
            return self._command_output(raw[i:j]), j
        if raw.startswith("$((", i):
            j = _scan_balanced(raw, i + 1, "(", ")")
            try:
                return str(self.arith(raw[i + 3:j - 2])), j
            except ShellError:
                return raw[i:j], j
        if raw.startswith("${", i):
            j = _scan_balanced(raw, i + 1, "{", "}")
            return self.parameter(raw[i + 2:j - 1]), j
        m = re.match(rf"{_NAME}|\d|[@*#?$!]", raw[i + 1:])
        if not m:
            return "$", i + 1
        name = m.group(0)
        value = self.get(name, "@" if name in "@*" else None)
        if value is None:
            return self.missing(name), i + 1 + m.end()
        return (value if name in "@*" else value[0]), i + 1 + m.end()

    def missing(self, name: str) -> str:
        """An unset variable: empty inside a test (as bash sees it, noted), else a named unknown."""
        if self.in_test:
            self.run.assumed.setdefault(f"${name}", f"--env {name}=..." if not name.isdigit() else "--args")
            return ""
        return self.unknown(name)

    def _command_output(self, text: str) -> str:
        """``$(...)``: evaluated when it only prints (``echo``, ``printf``, ``dirname``, ``basename``,
        ``realpath``, ``readlink -f``, ``cd DIR && pwd``, ``expr``); any other command's output is unknown."""
        inner = text[2:-1] if text.startswith("$(") else text[1:-1]
        sub = _Evaluator(self.args, dict(self.vars), self.script, ShellRun())
        sub.output, sub.cwd, sub.steps, sub.depth = [], self.cwd, self.steps, self.depth + 1
        try:
            if sub.depth > _MAX_SOURCE_DEPTH:
                raise ShellError("command substitutions nested too deeply")
            sub.execute(_Parser(tokenize(inner)).parse_list())
        except _Done:
            pass
        except ShellError:
            sub.run.commands.append(["?"])
        self.steps = sub.steps
        if sub.run.commands or sub.run.unknown:
            self.run.unknown.setdefault(text, "--run-script (it runs the command), or --env/--args for the value")
            return text
        return "".join(sub.output).rstrip("\n")

    def parameter(self, body: str) -> str | list[str]:
        """``${...}``: value, ``:-`` ``-`` ``:=`` ``=`` ``:+`` ``+`` ``:?`` defaults, ``#`` length,
        ``%`` ``%%`` ``#`` ``##`` trims, ``/`` ``//`` replacement, ``,,`` ``^^`` case, ``:off:len``."""
        m = re.fullmatch(rf"!({_NAME})\[[@*]\]", body)
        if m:  # ${!A[@]}: the indices of an array
            got = self.get(m.group(1), "@")
            return [str(k) for k in range(len(got or []))]
        if body.startswith("#") and len(body) > 1:
            got = self.get(*_name_index(body[1:]))
            return str(len(got) if body.endswith("]") and got is not None and "[" in body else
                       len(got[0]) if got else 0)
        m = re.match(rf"({_NAME}|\d+|[@*#?])(?:\[([^\]]*)\])?(.*)$", body, re.DOTALL)
        if not m:
            return self.unknown(body[:40], "--run-script (an expansion this reader does not evaluate)")
        name, index, op = m.group(1), m.group(2), m.group(3)
        value = self.get(name, index)
        if name in "@*" and not index:
            value = self.get(name)
        text = None if value is None else value if index in ("@", "*") or name in "@*" else value[0]
        op_m = re.match(r"(:?[-=+?])(.*)$", op, re.DOTALL)
        if op_m:
            kind, word = op_m.groups()
            empty = text is None or (kind.startswith(":") and text in ("", []))
            if kind.endswith("+"):
                return "" if empty else self.expand_string(word)
            if not empty:
                return text
            if kind.endswith("="):
                self.vars[name] = self.expand_string(word)
                return self.vars[name]
            if kind.endswith("?"):
                return self.unknown(name)
            return self.expand_string(word)
        if text is None:
            return self.missing(name)
        if not op:
            return text
        return _apply_operator(self, text, op)


def _name_index(text: str) -> tuple[str, str | None]:
    m = re.match(rf"({_NAME}|\d+)(?:\[([^\]]*)\])?$", text)
    return (m.group(1), m.group(2)) if m else (text, None)


def _glob_regex(pattern: str, greedy: bool) -> str:
    body = fnmatch.translate(pattern)[4:-3]  # strip (?s:...)\Z
    return body if greedy else body.replace(".*", ".*?")


def _apply_operator(sh: "_Expander", value: str | list[str], op: str) -> str | list[str]:
    """``%`` ``%%`` ``#`` ``##`` ``/`` ``//`` ``,,`` ``^^`` ``:off:len`` on a value (each element of an array)."""
    if isinstance(value, list):
        return [str(_apply_operator(sh, v, op)) for v in value]
    if op in (",,", "^^", ",", "^"):
        return value.lower() if op.startswith(",") else value.upper()
    m = re.match(r"(%%|%|##|#|//|/)(.*)$", op, re.DOTALL)
    if m:
        kind, rest = m.groups()
        if kind in ("%", "%%"):
            rx = re.compile(f"(?s:{_glob_regex(sh.expand_string(rest), kind == '%%')})$")
            cut = [k for k in range(len(value) + 1) if rx.fullmatch(value[k:])]
            return value[:cut[0] if kind == "%%" else cut[-1]] if cut else value
        if kind in ("#", "##"):
            rx = re.compile(f"(?s:{_glob_regex(sh.expand_string(rest), True)})")
            cut = [k for k in range(len(value) + 1) if rx.fullmatch(value[:k])]
            return value[cut[-1] if kind == "##" else cut[0]:] if cut else value
        pat, _, rep = rest.partition("/")
        rx = re.compile(_glob_regex(sh.expand_string(pat), True))
        return rx.sub(sh.expand_string(rep).replace("\\", "\\\\"), value, count=0 if kind == "//" else 1)
    m = re.match(r":\s*(-?\d+)(?::\s*(-?\d+))?$", op)
    if m:
        start = int(m.group(1))
        end = None if m.group(2) is None else (start + int(m.group(2)) if int(m.group(2)) >= 0 else int(m.group(2)))
        return value[start:end]
    return sh.unknown(op[:40], "--run-script (an expansion this reader does not evaluate)")


class _Fields:
    """The words one shell word expands to: quoted text joins, unquoted expansions split on blanks."""

    def __init__(self, split: bool):
        self.split, self.fields, self.cur, self.have = split, [], "", False

    def literal(self, text: str) -> None:
        self.cur += text
        self.have = True

    def quoted(self, value: str | list[str]) -> None:
        if isinstance(value, list) and value:
            self.have = True
        if isinstance(value, str) or not self.split:
            self.literal(value if isinstance(value, str) else " ".join(value))
            return
        for k, element in enumerate(value):  # "${A[@]}": one word per element
            if k:
                self.fields.append(self.cur)
                self.cur = ""
            self.literal(element)

    def unquoted(self, value: str | list[str]) -> None:
        text = value if isinstance(value, str) else " ".join(value)
        if not self.split:
            self.cur += text
            return
        for k, piece in enumerate(re.split(r"[ \t\n]+", text)):
            if k:
                if self.cur or self.have:
                    self.fields.append(self.cur)
                self.cur, self.have = "", False
            self.cur += piece

    def done(self) -> list[str]:
        if self.cur or self.have:
            self.fields.append(self.cur)
        return self.fields


# ---------------------------------------------------------------- evaluation

_BUILTIN_QUIET = {"echo", "printf", "set", "unset_", "ulimit", "cd", "pushd", "popd", "trap", "wait", "sleep",
                  "mkdir", "rm", "cp", "mv", "touch", "ln", "chmod", "tee", "cat", "true", ":", "umask", "date",
                  "hostname", "nvidia-smi", "npu-smi", "pip", "pip3", "wget", "curl", "git", "ray", "kill",
                  "pkill", "ps", "rsync", "scp", "ssh", "tar", "unzip", "sed", "awk", "grep", "env"}
_DECLARE = {"export", "local", "declare", "typeset", "readonly"}
_JOB_RUNNERS = ("sbatch", "bash", "sh")


def _shell_command(argv: list[str], first: int = 1) -> tuple[list[str], str] | None:
    """(the words before ``bash``/``sh``, the TEXT) of ``... bash [-x ...] -c TEXT`` in ``argv``."""
    for k in range(first, len(argv)):
        if argv[k].rsplit("/", 1)[-1] in ("bash", "sh"):
            rest = argv[k + 1:]
            c = next((j for j, a in enumerate(rest) if a == "-c" or (a.startswith("-") and a.endswith("c")
                                                                       and not a.startswith("--"))), None)
            if c is None or c + 1 >= len(rest) or not all(a.startswith("-") for a in rest[:c]):
                return None
            return argv[:k], rest[c + 1]
    return None


def _missing_flags(defaults: list[str], argv: list[str]) -> list[str]:
    """The ``--flag=value`` defaults (``#SBATCH`` lines, ``sbatch`` flags) that ``argv`` does not set itself."""
    out, k = [], 0
    while k < len(defaults):
        flag, value = defaults[k], None
        if "=" not in flag and k + 1 < len(defaults) and not defaults[k + 1].startswith("-"):
            value, k = defaults[k + 1], k + 1
        k += 1
        name = flag.partition("=")[0]
        if not any(a == name or a.startswith(name + "=") for a in argv):
            out.append(flag if value is None else f"{name}={value}")
    return out


_PRINTERS = {"echo", "printf", "dirname", "basename", "realpath", "readlink", "pwd", "expr"}


class _Evaluator(_Expander):
    """Runs the parsed script's control flow; simple commands are recorded, never executed."""

    def execute(self, nodes: list) -> None:
        for node in nodes:
            self.node(node)

    def node(self, node) -> None:
        self.steps += 1
        if self.steps > _MAX_STEPS:
            raise ShellError(f"more than {_MAX_STEPS:,} statements evaluated (a loop that does not end?)")
        kind = node[0]
        if kind == "cmd":
            self.status = self.command(node[1], node[2])
        elif kind == "andor":
            self.node(node[1][0])
            for op, part in zip(node[1][1::2], node[1][2::2]):
                if (op == "&&") == (self.status == 0):
                    self.node(part)
        elif kind == "not":
            self.node(node[1])
            self.status = int(self.status == 0)
        elif kind == "group":
            self.execute(node[1])
        elif kind == "if":
            self.if_(node[1], node[2])
        elif kind == "case":
            self.case(node[1], node[2])
        elif kind == "for":
            for value in [v for w in node[2] for v in self.expand_word(w)]:
                self.vars[node[1]] = value
                if not self.loop_body(node[3]):
                    break
        elif kind == "while":
            self.while_(node[1], node[2], node[3])
        elif kind == "func":
            self.functions[node[1]] = node[2]

    def if_(self, branches: list, else_body: list) -> None:
        for cond, body in branches:
            self.execute(cond)
            if self.status == 0:
                self.execute(body)
                return
        self.execute(else_body)

    def case(self, subject: str, clauses: list) -> None:
        self.in_test = True  # an unset subject is empty, as in a test (noted in ShellRun.assumed)
        try:
            value = self.expand_string(subject)
        finally:
            self.in_test = False
        for patterns, body in clauses:
            if any(fnmatch.fnmatchcase(value, self.expand_string(p)) for p in patterns):
                self.execute(body)
                return

    def loop_body(self, body: list) -> bool:
        """Run a loop's body once; False after ``break``."""
        try:
            self.execute(body)
        except _Break as b:
            return b.cont
        return True

    def while_(self, kind: str, cond: list, body: list) -> None:
        for _ in range(_MAX_LOOP):
            self.execute(cond)
            if (self.status == 0) != (kind == "while") or not self.loop_body(body):
                return
        # a loop on a command's output (the reader takes commands as succeeding): e.g. a restart loop
        # around torchrun; stopped, its commands recorded, and noted
        self.run.assumed.setdefault(f"a {kind} loop", f"stopped after {_MAX_LOOP} rounds; --run-script runs it")

    def command(self, words: list[str], line: int) -> int:
        """One simple command: assignments, declarations, tests, ``source``, ``shift``, a function
        call, or a recorded command (status 0: the reader assumes it succeeds)."""
        if words[0] in ("[", "[[", "test"):
            return self.test(words)
        if words[0].startswith("((") and words[0].endswith("))"):
            try:
                return 0 if self.arith(words[0][2:-2]) else 1
            except ShellError:
                return 1
        k = 0
        while k < len(words) and _ASSIGN_HEAD.match(words[k]):
            k += 1
        if k == len(words):
            for w in words:
                self.assign(w)
            return 0
        heredocs = [w[len(HEREDOC):] for w in words[k:] if w.startswith(HEREDOC)]
        rest = [w for w in words[k:] if not w.startswith(HEREDOC)]
        argv = [f for w in _drop_redirections(rest) for f in self.expand_word(w)]
        if argv and argv[0].rsplit("/", 1)[-1] in _JOB_RUNNERS:
            return self.job(argv, heredocs[-1] if heredocs else None)
        return self.call(argv, rest, line) if argv else 0

    def job(self, argv: list[str], heredoc: str | None) -> int:
        """``sbatch`` / ``bash`` / ``sh`` given a script (a here-document, else a file that exists): read
        as the scheduler or shell runs it, its ``#SBATCH`` and ``sbatch`` flags the defaults of ``srun``."""
        self.run.commands.append(argv)
        inner = _shell_command(argv, first=0)
        if inner is not None:
            return self.inner_script(inner[1], list(self.prefix))
        if heredoc is not None:
            body = heredoc[1:] if heredoc[0] == "Q" else self._heredoc_text(heredoc[1:])
        else:
            files = [a for a in argv[1:] if not a.startswith("-") and self._existing(a) is not None]
            if not files:
                return 0
            body = self._existing(files[0]).read_text(encoding="utf-8", errors="replace")
        flags = [a for a in argv[1:] if a.startswith("-")] if argv[0].endswith("sbatch") else []
        flags += [f for line in re.findall(r"^\s*#SBATCH\s+(.*)$", body, re.MULTILINE) for f in shlex.split(line, True)]
        sub = _Evaluator([], dict(self.vars), self.script, self.run)
        sub.functions, sub.steps, sub.depth, sub.srun_defaults = dict(self.functions), self.steps, self.depth + 1, flags
        if sub.depth > _MAX_SOURCE_DEPTH:
            raise ShellError("job scripts nested too deeply")
        try:
            sub.execute(_Parser(tokenize(body)).parse_list())
        except _Done:
            pass
        self.steps = sub.steps
        return 0

    def inner_script(self, text: str, prefix: list[str]) -> int:
        """``bash -c TEXT`` (under ``srun``: each command of TEXT recorded after ``prefix``)."""
        sub = _Evaluator([], dict(self.vars), self.script, self.run)
        sub.functions, sub.steps, sub.depth, sub.prefix = dict(self.functions), self.steps, self.depth + 1, prefix
        if sub.depth > _MAX_SOURCE_DEPTH:
            raise ShellError("bash -c nested too deeply")
        try:
            sub.execute(_Parser(tokenize(text)).parse_list())
        except _Done:
            pass
        self.steps = sub.steps
        return 0

    def _heredoc_text(self, body: str) -> str:
        out = _Fields(split=False)
        self._double_quoted(body, out)
        return "".join(out.done())

    def _existing(self, name: str) -> Path | None:
        base = self.script.parent if self.script else Path.cwd()
        return next((p for p in (Path(name), base / name) if p.is_file()), None)

    def call(self, argv: list[str], raw: list[str], line: int) -> int:
        name = argv[0]
        if name.rsplit("/", 1)[-1] == "srun":
            argv = [name, *_missing_flags(self.srun_defaults, argv), *argv[1:]]
            inner = _shell_command(argv)
            if inner is not None:  # srun ... bash -c "CMD": CMD's commands, each launched by this srun
                return self.inner_script(inner[1], list(self.prefix) + inner[0])
        if name in _DECLARE:
            for w in raw[1:]:
                if _ASSIGN_HEAD.match(w):
                    self.assign(w)
            return 0
        if name in ("source", ".") and len(argv) > 1:
            return self.source(argv[1], argv[2:])
        if name == "shift":
            self.args = self.args[int(argv[1]) if len(argv) > 1 and argv[1].isdigit() else 1:]
            return 0
        if name == "set" and len(argv) > 1 and argv[1] == "--":
            self.args = argv[2:]
            return 0
        if name == "unset":
            for var in argv[1:]:
                self.vars.pop(var, None)
            return 0
        if name in ("break", "continue"):
            raise _Break(cont=name == "continue")
        if name in ("exit", "return"):
            raise _Done(function_only=name == "return")
        if name == "false":
            return 1
        if name in self.functions:
            return self.call_function(name, argv[1:])
        if name == "eval":
            self.run.unknown.setdefault(f"eval at line {line}", "--run-script (eval builds code at run time)")
            return 0
        if self.output is not None and name in _PRINTERS:
            return self.print_(argv)
        if name == "cd" and len(argv) > 1:
            self.cwd = argv[1]
            return 0
        if name not in _BUILTIN_QUIET or self.output is not None:
            self.run.commands.append(list(self.prefix) + argv)
        return 0

    def print_(self, argv: list[str]) -> int:
        """What a printing command writes, inside ``$(...)``."""
        name, rest = argv[0], argv[1:]
        if name == "echo":
            flags = {a for a in rest[:1] if a in ("-n", "-e")}
            words = rest[len(flags):]
            self.output.append(" ".join(words) + ("" if "-n" in flags else "\n"))
        elif name == "printf" and rest:
            self.output.append(rest[0].replace("%s", " ".join(rest[1:])).replace("\\n", "\n"))
        elif name in ("dirname", "basename", "realpath", "readlink"):
            paths = [a for a in rest if not a.startswith("-")]
            if not paths:
                return 1
            path = paths[0]
            out = os.path.dirname(path.rstrip("/")) or "." if name == "dirname" else \
                os.path.basename(path.rstrip("/")) if name == "basename" else path
            if name == "basename" and len(paths) > 1 and out.endswith(paths[1]) and out != paths[1]:
                out = out[:-len(paths[1])]  # basename NAME SUFFIX
            self.output.append(out + "\n")
        elif name == "pwd":
            if self.cwd is None:
                self.run.commands.append(argv)  # the directory the user runs it from: unknown
                return 0
            self.output.append(self.cwd + "\n")
        elif name == "expr":
            try:
                self.output.append(str(_arith_eval(" ".join(rest))) + "\n")
            except ShellError:
                self.run.commands.append(argv)
        return 0

    def call_function(self, name: str, args: list[str]) -> int:
        saved, self.args = self.args, args
        try:
            self.node(self.functions[name])
        except _Done as done:
            if not done.function_only:
                raise
        finally:
            self.args = saved
        return 0

    def source(self, file: str, args: list[str]) -> int:
        """``source FILE``: read inline when the file exists (relative to the script's folder first)."""
        base = self.script.parent if self.script else Path.cwd()
        path = next((p for p in (base / file, Path(file)) if p.is_file()), None)
        if path is None or self.depth >= _MAX_SOURCE_DEPTH:
            self.run.unknown.setdefault(f"source {file}"[:60], "--env for the values it sets (the file is not here)")
            return 1
        self.depth += 1
        saved = self.args
        if args:
            self.args = args
        try:
            self.execute(_Parser(tokenize(path.read_text(encoding="utf-8", errors="replace"))).parse_list())
        except _Done as done:
            if not done.function_only:
                raise
        finally:
            self.args, self.depth = saved, self.depth - 1
        return 0

    def assign(self, word: str) -> None:
        """``NAME=value``, ``NAME+=value``, ``NAME=( ... )``, ``NAME+=( ... )``, ``NAME[i]=value``."""
        m = _ASSIGN_HEAD.match(word)
        name, index, append, rhs = m.group(1), m.group(2), m.group(3), word[m.end():]
        old = self.vars.get(name)
        if rhs.startswith("(") and rhs.endswith(")") and not index:
            words = [t[1] for t in tokenize(rhs[1:-1]) if t[0] == "word"]
            elements = [f for w in words for f in self.expand_word(w)]
            base = ([old] if isinstance(old, str) else old or []) if append else []
            self.vars[name] = list(base) + elements
            return
        value = self.expand_string(rhs) if rhs else ""
        if index:
            array = [old] if isinstance(old, str) else list(old or [])
            k = int(self.arith(index[1:-1]))
            array += [""] * (k + 1 - len(array))
            array[k] = (array[k] + value) if append else value
            self.vars[name] = array
        elif isinstance(old, list):
            self.vars[name] = [(old[0] if old and append else "") + value] + old[1:]
        else:
            self.vars[name] = ((old or "") + value) if append else value

    def file_test(self, op: str, name: str) -> bool:
        """``-f`` / ``-d`` / ``-e`` ... of a path: tested when it exists here (beside the script or as
        given); otherwise the files are on the machine the script was written for, so it is taken
        as true there ("the checkout has pretrain_gpt.py"), and noted."""
        base = self.script.parent if self.script else Path.cwd()
        found = next((p for p in (Path(name), base / name) if name and p.exists()), None)
        if found is None:
            self.run.assumed.setdefault(f"[ {op} {name} ]"[:60], "taken as true; --run-script tests it")
            return op != "-L"
        checks = {"-f": found.is_file, "-d": found.is_dir, "-s": lambda: found.stat().st_size > 0,
                  "-L": found.is_symlink, "-h": found.is_symlink}
        return checks.get(op, lambda: True)()

    def test(self, words: list[str]) -> int:
        """``[ ... ]`` / ``[[ ... ]]`` / ``test ...``: 0 when true, as bash decides it."""
        body = words[1:-1] if words[-1] in ("]", "]]") else words[1:]
        self.in_test = True
        try:
            value, _ = self._test_or(body, 0, words[0] == "[[")
        except (IndexError, ValueError, ShellError):
            value = False
        finally:
            self.in_test = False
        return 0 if value else 1

    def _test_or(self, w: list[str], i: int, double: bool) -> tuple[bool, int]:
        value, i = self._test_and(w, i, double)
        while i < len(w) and w[i] in ("-o", "||"):
            right, i = self._test_and(w, i + 1, double)
            value = value or right
        return value, i

    def _test_and(self, w: list[str], i: int, double: bool) -> tuple[bool, int]:
        value, i = self._test_not(w, i, double)
        while i < len(w) and w[i] in ("-a", "&&"):
            right, i = self._test_not(w, i + 1, double)
            value = value and right
        return value, i

    def _test_not(self, w: list[str], i: int, double: bool) -> tuple[bool, int]:
        if w[i] == "!":
            value, i = self._test_not(w, i + 1, double)
            return not value, i
        if w[i] == "(":
            value, i = self._test_or(w, i + 1, double)
            return value, i + 1
        return self._test_primary(w, i, double)

    def _test_primary(self, w: list[str], i: int, double: bool) -> tuple[bool, int]:
        word = self.expand_string
        if i + 2 < len(w) + 1 and i + 1 < len(w) and w[i + 1] in _BINARY and i + 2 < len(w):
            a, op, b = word(w[i]), w[i + 1], w[i + 2]
            return _binary(self, a, op, b, double), i + 3
        if w[i] in ("-z", "-n") and i + 1 < len(w):
            empty = word(w[i + 1]) == ""
            return empty if w[i] == "-z" else not empty, i + 2
        if w[i] == "-v" and i + 1 < len(w):
            return word(w[i + 1]) in self.vars, i + 2
        if re.fullmatch(r"-[a-zA-Z]", w[i]) and i + 1 < len(w):
            return self.file_test(w[i], word(w[i + 1])), i + 2
        return word(w[i]) != "", i + 1


_BINARY = ("=", "==", "!=", "<", ">", "=~", "-eq", "-ne", "-lt", "-le", "-gt", "-ge")


def _binary(sh: _Evaluator, a: str, op: str, raw_b: str, double: bool) -> bool:
    """``a OP b`` of a test; in ``[[ ]]`` an unquoted right side of ``==`` is a glob pattern."""
    b = sh.expand_string(raw_b)
    if op in ("=", "==", "!="):
        pattern = double and not raw_b.startswith(('"', "'"))
        same = fnmatch.fnmatchcase(a, b) if pattern else a == b
        return same if op != "!=" else not same
    if op in ("<", ">"):
        return a < b if op == "<" else a > b
    if op == "=~":
        return re.search(b, a) is not None
    x, y = sh.arith(a or "0"), sh.arith(b or "0")
    return {"-eq": x == y, "-ne": x != y, "-lt": x < y, "-le": x <= y, "-gt": x > y, "-ge": x >= y}[op]


def _drop_redirections(words: list[str]) -> list[str]:
    """A command's words without ``>log``, ``2>&1``, ``> log`` (the target of a bare operator too)."""
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
            continue
        m = _REDIRECT.match(w)
        if m and m.end() > 0 and not w.startswith(("'", '"')):
            skip = m.end() == len(w) and not m.group(2)
            continue
        out.append(w)
    return out


# ---------------------------------------------------------------- entry points


def read_script(text: str, args: list[str] | tuple[str, ...] = (), env: dict[str, str] | None = None,
                path: str | Path | None = None) -> ShellRun:
    """Every command ``text`` would run under bash with positional ``args`` and environment ``env``,
    expanded; nothing is executed. Raises :class:`ShellError` on a script it cannot follow."""
    run = ShellRun()
    shell = _Evaluator(list(args), dict(env or {}), Path(path) if path else None, run)
    try:
        parser = _Parser(tokenize(text))
        nodes = parser.parse_list()
        if parser.peek() is not None:
            raise ShellError(f"unexpected {parser.peek()[1]!r} at line {parser.peek()[2]}")
        shell.execute(nodes)
    except _Done:
        pass
    except RecursionError:
        raise ShellError("nested too deeply") from None
    return run


def find_launch(run: ShellRun, entry: re.Pattern = ENTRY) -> tuple[list[str], list[str]] | None:
    """(the launcher's argv before the entry point, the arguments after it) of the last command that
    calls ``entry``; None when no command does."""
    for argv in reversed(run.commands):
        for k, tok in enumerate(argv):
            if entry.search(tok):
                return argv[:k], argv[k + 1:]
    return None


def bare_arguments(run: ShellRun) -> list[str]:
    """The words of commands that start with a flag: a file holding only the training arguments."""
    return [tok for argv in run.commands if argv[0].startswith("-") for tok in argv]


def launcher_world_size(tokens: list[str]) -> int | None:
    """Ranks per node x nodes of a torchrun / deepspeed launcher's arguments, when both are numbers
    (MindSpore's ``msrun --worker_num``: all ranks)."""
    found: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        name, _, inline = tok.partition("=")
        value = inline or (tokens[i + 1] if i + 1 < len(tokens) else "")
        if name == "--worker_num" and value.isdigit():
            return int(value)
        kind = "per_node" if name in _PER_NODE else "nodes" if name in _NODES else None
        if kind and value.split(":")[-1].isdigit():
            found.setdefault(kind, int(value.split(":")[-1]))  # an elastic range "1:4": its maximum
    if "per_node" not in found:
        return _task_launcher_world_size(tokens)
    return found["per_node"] * found.get("nodes", 1)


#: srun / mpirun flags: one task is one rank (``--ntasks-per-node`` x ``--nodes``, or ``--ntasks`` / ``-np``).
_TASKS_PER_NODE, _TASK_NODES, _TASKS = ("--ntasks-per-node",), ("--nodes", "-N"), ("--ntasks", "-n", "-np")


def _task_launcher_world_size(tokens: list[str]) -> int | None:
    """Ranks of an ``srun`` / ``mpirun`` launch (only where one of them is the launcher)."""
    if not any(tok.rsplit("/", 1)[-1] in ("srun", "mpirun", "mpiexec") for tok in tokens):
        return None
    found: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        name, eq, inline = tok.partition("=")
        value = inline if eq else (tokens[i + 1] if i + 1 < len(tokens) else "")
        kind = "per_node" if name in _TASKS_PER_NODE else "nodes" if name in _TASK_NODES else \
            "total" if name in _TASKS else None
        if kind and value.isdigit():
            found.setdefault(kind, int(value))
    if "total" in found:
        return found["total"]
    return found["per_node"] * found.get("nodes", 1) if "per_node" in found else None


def argv_from_script(text: str, entry: str = "pretrain_gpt.py") -> list[str]:
    """The arguments after ``entry`` in a plain command line (``\\`` continuations and ``#`` comments
    handled; a text without ``entry`` is taken as bare arguments). No variables: :func:`read_script`."""
    lines = [l for l in text.splitlines() if not l.lstrip().startswith("#")]
    tokens = shlex.split("\n".join(lines).replace("\\\n", " "), comments=True)
    for i, tok in enumerate(tokens):
        if tok.endswith(entry):
            return tokens[i + 1:]
    return tokens


def script_world_size(text: str) -> int | None:
    """Ranks per node x nodes of a plain command line's torchrun / deepspeed launcher."""
    try:
        return launcher_world_size(shlex.split(text.replace("\\\n", " "), comments=True))
    except ValueError:
        return None


_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(\((?:[^()]*)\)|\"[^\"]*\"|'[^']*'|\S*)",
                     re.MULTILINE)


def expand_variables(text: str) -> str:
    """The text with plain ``NAME=value`` assignments substituted into ``$NAME`` (torchtitan override
    files; launch scripts go through :func:`read_script`, which follows bash)."""
    values: dict[str, str] = {}
    for name, raw in _ASSIGN.findall(text):
        value = raw[1:-1] if raw[:1] in "(\"'" else raw
        values[name] = re.sub(r"\\\n|\n|#[^\n]*", " ", value) if raw[:1] == "(" else value
    def sub(m: re.Match) -> str:
        return values.get(m.group(1) or m.group(2), m.group(0))
    body = _ASSIGN.sub("", text)
    for _ in range(3):
        body = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:\[@\])?\}|\$([A-Za-z_][A-Za-z0-9_]*)", sub, body)
    return body

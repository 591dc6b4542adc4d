"""Words expanded as bash expands them: parameters and arrays, ``${VAR:-x}`` and the other operators,
arithmetic, command substitution that only prints, field splitting (bash(1), "EXPANSION")."""
from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from .base import _NAME, ShellError, ShellRun
from .tokens import _scan_balanced, _scan_dquote


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
        """``$(...)``: the evaluator runs it (:meth:`.evaluate._Evaluator._command_output`)."""
        raise NotImplementedError

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

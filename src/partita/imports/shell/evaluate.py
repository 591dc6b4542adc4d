"""The parsed script evaluated without running any command: assignments, conditions, loops, functions,
``source``, and each command recorded with its expanded argv (bash(1), "SHELL BUILTIN COMMANDS")."""
from __future__ import annotations

import fnmatch
import os
import re
import shlex
from pathlib import Path

from .base import _ASSIGN_HEAD, _MAX_LOOP, _MAX_SOURCE_DEPTH, _MAX_STEPS, ShellError, ShellRun
from .expand import _arith_eval, _Break, _Done, _Expander, _Fields, _REDIRECT
from .parse import _Parser
from .tokens import HEREDOC, tokenize


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
        elif kind == "pipe":
            if not self.pipe_to_file(node[1]):
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
        if argv and argv[0] == "read" and heredocs:
            return self.read_heredoc(argv, heredocs[-1])
        if argv and argv[0] in ("cat", "sed") and self.write_file(rest, self.filter_text(argv, heredocs, None)):
            return 0
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

    def read_heredoc(self, argv: list[str], heredoc: str) -> int:
        """``read -r -d '' NAME <<EOF ... EOF``: NAME holds the here-document (OpenRLHF's example scripts
        keep their command line so). With ``-d ''`` read stops at a NUL, so the whole text is read (less
        its leading and trailing whitespace, IFS); without it, the first line. Status 1 as bash returns
        at the end of input without a NUL (``set -e`` scripts follow it with ``|| true``)."""
        names = [a for a in argv[1:] if not a.startswith("-") and a.isidentifier()]
        body = heredoc[1:] if heredoc[0] == "Q" else self._heredoc_text(heredoc[1:])
        whole = any(a == "-d" for a in argv[1:]) or any(a.startswith("-") and a.endswith("d") for a in argv[1:])
        text = body if whole else body.split("\n", 1)[0]
        if "-r" not in argv and not any(a.startswith("-") and "r" in a for a in argv[1:]):
            text = text.replace("\\\n", "")
        if names:
            self.vars[names[-1]] = text.strip()
        return 1 if whole else 0

    def _heredoc_body(self, heredoc: str) -> str:
        """A here-document's text as bash feeds it: expanded, unless its delimiter was quoted."""
        return heredoc[1:] if heredoc[0] == "Q" else self._heredoc_text(heredoc[1:])

    def filter_text(self, argv: list[str], heredocs: list[str], stdin: str | None) -> str | None:
        """What ``cat`` or ``sed`` (``s`` commands only) writes to its output, or None when the reader
        cannot know it (a file not here, another sed command). Input: the files named (beside the
        script first), else the here-document, else ``stdin`` (the pipe before it)."""
        name, rest = argv[0], argv[1:]
        scripts: list[str] = []
        files: list[str] = []
        k = 0
        while k < len(rest):
            a = rest[k]
            if name == "sed" and a in ("-e", "--expression") and k + 1 < len(rest):
                scripts.append(rest[k + 1])
                k += 2
                continue
            if a.startswith("-") and a != "-":
                return None  # sed -i / -n / -E, cat -n ...: not a plain copy or substitution
            files.append(a)
            k += 1
        if name == "sed" and not scripts:
            if not files:
                return None
            scripts.append(files.pop(0))
        if files:
            paths = [self._existing(f) for f in files]
            if any(p is None for p in paths):
                return None
            text = "".join(p.read_text(encoding="utf-8", errors="replace") for p in paths)
        elif heredocs:
            text = self._heredoc_body(heredocs[-1])
        elif stdin is not None:
            text = stdin
        else:
            return None
        for script in scripts:
            text = _sed_substitute(script, text)
            if text is None:
                return None
        return text

    def write_file(self, words: list[str], text: str | None) -> bool:
        """Record ``text`` as the file of the command's ``> FILE`` / ``>> FILE`` (bash(1), "Redirecting
        Output" / "Appending Redirected Output"); False when it has none or ``text`` is unknown."""
        target = _stdout_target(words)
        if target is None or text is None:
            return False
        path = self.expand_string(target[0])
        self.run.files[path] = (self.run.files.get(path, "") if target[1] else "") + text
        return True

    def pipe_to_file(self, commands: list) -> bool:
        """``cat``/``sed ... | sed ... > FILE``: the file each stage's output leads to, recorded; False
        (the pipeline read as its commands) for any other pipeline."""
        text: str | None = None
        for i, node in enumerate(commands):
            if node[0] != "cmd":
                return False
            words = node[1]
            heredocs = [w[len(HEREDOC):] for w in words if w.startswith(HEREDOC)]
            rest = [w for w in words if not w.startswith(HEREDOC)]
            argv = [f for w in _drop_redirections(rest) for f in self.expand_word(w)]
            if not argv or argv[0] not in ("cat", "sed"):
                return False
            text = self.filter_text(argv, heredocs, text if i else None)
            if text is None:
                return False
            if i == len(commands) - 1:
                return self.write_file(rest, text)
        return False

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
            return self.eval_(" ".join(argv[1:]), line)
        if self.output is not None and name in _PRINTERS:
            return self.print_(argv)
        if name == "cd" and len(argv) > 1:
            self.cwd = argv[1]
            return 0
        if name not in _BUILTIN_QUIET or self.output is not None:
            self.run.commands.append(list(self.prefix) + argv)
        return 0

    def eval_(self, text: str, line: int) -> int:
        """``eval WORDS``: bash joins the expanded words with spaces and runs the result as script text
        in the current shell (bash(1), "eval"), so a command line built in a string (``run_cmd="torchrun
        ..."; eval ${run_cmd}``, Pai-Megatron-Patch's examples) is parsed and evaluated here the same way:
        its quotes removed and its ``$`` expanded a second time."""
        if self.depth >= _MAX_SOURCE_DEPTH:
            self.run.unknown.setdefault(f"eval at line {line}", "--run-script (eval nested too deeply)")
            return 0
        self.depth += 1
        try:
            self.execute(_Parser(tokenize(text)).parse_list())
        except ShellError:
            self.run.unknown.setdefault(f"eval at line {line}", "--run-script (eval builds code the reader cannot parse)")
        finally:
            self.depth -= 1
        return self.status

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


def _stdout_target(words: list[str]) -> tuple[str, bool] | None:
    """(the unexpanded target word, appended) of the last ``>`` / ``>>`` / ``1>`` redirection of
    standard output among a command's words; None when its output goes elsewhere."""
    found = None
    for k, w in enumerate(words):
        m = _REDIRECT.match(w)
        if not m or m.end() == 0 or w.startswith(("'", '"')) or m.group(2):
            continue
        if m.group(1) not in (">", ">>") or w[:m.start(1)] not in ("", "1"):
            continue
        target = w[m.end():] or (words[k + 1] if k + 1 < len(words) else "")
        if target:
            found = (target, m.group(1) == ">>")
    return found


def _sed_substitute(script: str, text: str) -> str | None:
    """``text`` through one sed ``s/REGEX/REPLACEMENT/[g]`` (GNU sed(1), "The s Command"): each line,
    the first match (every match with ``g``) replaced, ``&`` the match. Only basic regular
    expressions without groups, back-references or intervals (what ds_config templates use); None for anything
    else (another command, other flags), so the file is left unknown rather than guessed."""
    if len(script) < 4 or script[0] != "s":
        return None
    d = script[1]
    parts, cur, k = [], "", 2
    while k < len(script):
        c = script[k]
        if c == "\\" and k + 1 < len(script):
            cur += script[k:k + 2] if script[k + 1] != d else d
            k += 2
            continue
        if c == d:
            parts.append(cur)
            cur = ""
        else:
            cur += c
        k += 1
    parts.append(cur)
    if len(parts) != 3 or parts[2] not in ("", "g"):
        return None
    pattern, replacement = parts[0], parts[1]
    if re.search(r"\\[(){}|+?]", pattern) or re.search(r"\\[1-9]", replacement):
        return None
    regex = "".join(re.escape(c) if c in "+?(){}|" else c for c in pattern)  # literal in a basic regex
    def replace(m: re.Match) -> str:
        out, j = "", 0
        while j < len(replacement):
            c = replacement[j]
            if c == "\\" and j + 1 < len(replacement):
                out += "\n" if replacement[j + 1] == "n" else replacement[j + 1]
                j += 2
                continue
            out += m.group(0) if c == "&" else c
            j += 1
        return out
    try:
        compiled = re.compile(regex)
    except re.error:
        return None
    count = 0 if parts[2] == "g" else 1
    return "".join(compiled.sub(replace, line, count=count) for line in text.splitlines(keepends=True))


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

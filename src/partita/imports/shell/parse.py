"""The token stream as bash's grammar: simple commands, lists, pipelines, compound commands
(``if``, ``case``, ``for``, ``while``, functions, subshells; bash(1), "SHELL GRAMMAR")."""
from __future__ import annotations

from .base import ShellError


class _Parser:
    """Tokens -> nested tuples: ``("cmd", words, line)``, ``("andor", [node, op, node, ...])``,
    ``("if", [(cond, body), ...], else_body)``, ``("case", word, [(patterns, body), ...])``,
    ``("for", name, words, body)``, ``("while", cond, body)``, ``("func", name, body)``, ``("group", body)``,
    ``("pipe", commands)`` (a pipeline: its commands in order)."""

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
        node = cmds[0] if len(cmds) == 1 else ("pipe", cmds)
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

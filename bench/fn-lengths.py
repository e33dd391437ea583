#!/usr/bin/env python3
"""Measure the length of every Rust function under a directory (issue 32).

Usage: bench/fn-lengths.py [DIR] [--over N]
  DIR     defaults to crates/appsrv/src
  --over  list only functions longer than N lines (default 0: all of them)

Prints "LINES PATH:LINE NAME", longest first. A function's length is counted from the line
of its `fn` keyword to the line of its closing brace, both included, so a one-line function
is 1. The body is found by brace matching on a token stream that skips line comments, block
comments (nested, as Rust allows), string literals (with escapes), raw strings (`r#"..."#`,
any number of `#`), byte strings and char literals (told apart from lifetimes), so a brace
inside a string or a comment does not count. Declarations without a body (trait methods,
`extern` items) and `fn(..)` pointer types are skipped. A nested function is listed on its
own and also counts towards the function that contains it.
"""

import os
import re
import signal
import sys

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def tokens(src):
    """Yield (kind, text, line) for idents, and single-character punctuation that matters
    here, skipping comments and literals."""
    i, n, line = 0, len(src), 1
    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    line += src[i] == "\n"
                    i += 1
        elif c in "rb" and re.match(r"(br|r)#*\"", src[i:i + 260]):
            m = re.match(r"(br|r)(#*)\"", src[i:])
            end = '"' + m.group(2)
            j = src.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            line += src.count("\n", i, j)
            i = j
        elif c == '"' or (c == "b" and src.startswith('b"', i)):
            i += 1 if c == '"' else 2
            while i < n and src[i] != '"':
                if src[i] == "\\":
                    i += 1
                line += src[i] == "\n"
                i += 1
            i += 1
        elif c == "'" or (c == "b" and src.startswith("b'", i)):
            start = i + (1 if c == "'" else 2)
            # A char literal: 'x', '\n', '\u{..}', '\''. Otherwise a lifetime or label.
            m = re.match(r"(\\u\{[0-9a-fA-F_]*\}|\\.|[^\\'\n])'", src[start:start + 12])
            if m:
                i = start + m.end()
            else:
                i += 1
        elif IDENT.match(c):
            m = IDENT.match(src, i)
            yield ("ident", m.group(0), line)
            i = m.end()
        elif c in "{}()[];":
            yield ("punct", c, line)
            i += 1
        else:
            i += 1


def functions(src):
    """Return (name, first_line, last_line) for every function with a body."""
    toks = list(tokens(src))
    found = []
    for k, (kind, text, line) in enumerate(toks):
        if kind != "ident" or text != "fn":
            continue
        if k + 1 >= len(toks) or toks[k + 1][0] != "ident":
            continue  # `fn(u8) -> u8`, a pointer type
        name = toks[k + 1][1]
        # The body is the first `{` outside parentheses and brackets (`-> [u8; 29] {`); a
        # `;` first means no body.
        parens, j = 0, k + 2
        while j < len(toks):
            t = toks[j][1]
            if t in "([":
                parens += 1
            elif t in ")]":
                parens -= 1
            elif parens == 0 and t in "{;":
                break
            j += 1
        if j >= len(toks) or toks[j][1] == ";":
            continue
        depth = 0
        while j < len(toks):
            t = toks[j][1]
            if t == "{":
                depth += 1
            elif t == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        found.append((name, line, toks[min(j, len(toks) - 1)][2]))
    return found


def main(argv):
    root, over = "crates/appsrv/src", 0
    args = iter(argv)
    for a in args:
        if a == "--over":
            over = int(next(args))
        else:
            root = a
    rows = []
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".rs"):
                path = os.path.join(d, f)
                with open(path, encoding="utf-8") as fh:
                    for name, first, last in functions(fh.read()):
                        rows.append((last - first + 1, path, first, name))
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    for length, path, first, name in rows:
        if length > over:
            print(f"{length:5} {path}:{first} {name}")


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the listing quietly
    main(sys.argv[1:])

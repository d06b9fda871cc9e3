#!/usr/bin/env python3
# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""The documentation names only what exists (ctest docs_test).

Reads README.md and docs/*.md and checks:

- every `--flag` in a command line of a Larder binary (`larder-master ...`, `build/bin/larder-bench
  store ...`, in code blocks and inline code) and in the first column of a table under a heading
  that names a binary (or a binary and its subcommand) is a flag of that binary or subcommand as
  its `--help` lists it; where such a table has a "default" column and --help shows a default,
  the two agree;
- every other `--flag` (prose, comments) is a flag of some Larder binary, or one of the few other
  tools' flags in FOREIGN_FLAGS below;
- every `LARDER_*` name (environment variables, CMake options, macros) occurs in the sources;
- every path of the master's HTTP server that the docs name (`/api/...`, `/metrics`, ...) is served.

Usage: docs_test.py --source-dir DIR --bin-dir DIR [--docs FILE...] [--expect=NAME...]
With --expect=NAME (once per name), it succeeds only when exactly the named flags, variables and
routes are reported (the test of the test: docs_test_catches_unknown_names).
"""

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

# Flags of other tools that the docs show in their own command lines. Keep this list short: a
# Larder flag never belongs here.
FOREIGN_FLAGS = {
    "--build", "--install", "--target",  # cmake --build DIR --target T; cmake --install DIR
    "--test-dir", "--output-on-failure",  # ctest
    "--gtest_filter",  # GoogleTest binaries
    "--cflags", "--libs",  # pkg-config
    "--no-build-isolation",  # pip install (also --target DIR)
    "--now",  # systemctl enable --now
    "--data-dir",  # etcd
    # SGLang's launch_server (docs/python.md)
    "--model-path", "--enable-hierarchical-cache", "--hicache-storage-backend",
    "--hicache-storage-backend-extra-config",
}

# Spellings of one default: CLI11 prints booleans as 1 and 0.
SAME_VALUES = {"1": {"true", "on"}, "0": {"false", "off", "none"}, "true": {"1", "on"},
               "false": {"0", "off"}}

BINARIES = ["larder-master", "larder-client", "larder-ctl", "larder-bench", "larder-demo",
            "larder-e2e-peer"]
BINARY_RE = re.compile(r"(?<![\w-])(?:[\w.${}/-]*/)?(" + "|".join(map(re.escape, BINARIES)) +
                       r")(?![\w-]|\.\w)")
FLAG_RE = re.compile(r"(?<![\w-])(--[a-z][a-z0-9_-]*)")
VARIABLE_RE = re.compile(r"\bLARDER_[A-Z0-9]+(?:_[A-Z0-9]+)*\b")
# Where a shell command ends: a pipe, a list operator, a comment, a closing backtick.
COMMAND_END_RE = re.compile(r"\s(?:\|\|?|&&|;|#)|&\s*$|`")
# HTTP paths of the master (and the Mooncake layer's client server): a path in inline code, alone
# or after GET/POST, that is not a file or etcd key.
ROUTE_RE = re.compile(r"^(?:(?:GET|POST) )?(/[a-z_][a-z_/]*)(?:\?.*)?$")
NOT_ROUTES = {"proc", "sys", "etc", "usr", "var", "dev", "tmp", "larder", "path", "opt", "run",
              "lib", "home"}
SOURCE_ROUTE_RE = re.compile(r"""(?:\.(?:Get|Post)\(\s*|path\s*==\s*)["'](/[^"'?]*)["']""")


class Command:
    """One binary, or one subcommand of it: its flags and subcommands, from --help."""

    def __init__(self, help_text):
        self.flags = set()
        self.defaults = {}  # flag -> the default --help shows ("--port UINT=50051")
        self.subcommands = []
        section = None
        for line in help_text.splitlines():
            if re.match(r"^\S.*:\s*$", line):
                section = line.strip().rstrip(":")
                continue
            if section == "Options":
                match = re.match(r"^\s+(?:-\w,)?(--[a-z][a-z0-9_-]*)(\S*(?: \S+)*)", line)
                if match:
                    self.flags.add(match.group(1))
                    default = re.search(r"=(\S+)", match.group(2))
                    if default:
                        self.defaults[match.group(1)] = default.group(1)
            elif section == "Subcommands":
                match = re.match(r"^\s+([a-z][a-z0-9-]*)\s", line + " ")
                if match:
                    self.subcommands.append(match.group(1))


class Binaries:
    """The Larder binaries of a build, asked for their --help on demand."""

    def __init__(self, bin_dir):
        self.bin_dir = Path(bin_dir)
        self.cache = {}
        self.env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
        missing = [b for b in BINARIES[:5] if not (self.bin_dir / b).exists()]
        if missing:
            sys.exit(f"docs_test: {', '.join(missing)} not built in {self.bin_dir}")

    def command(self, binary, subcommand=None):
        """The Command for `binary [subcommand]`, or None when there is no such command."""
        key = (binary, subcommand)
        if key not in self.cache:
            path = self.bin_dir / binary
            argv = [str(path)] + ([subcommand] if subcommand else []) + ["--help"]
            result = None
            if path.exists():
                try:
                    run = subprocess.run(argv, capture_output=True, text=True, env=self.env,
                                         timeout=60)
                except OSError as error:
                    sys.exit(f"docs_test: cannot run {' '.join(argv)}: {error}")
                if run.returncode == 0:
                    result = Command(run.stdout)
            self.cache[key] = result
        return self.cache[key]

    def valid_flags(self, binary, subcommand=None):
        """Flags `binary [subcommand] ...` accepts: the binary's own and, with a subcommand, the
        subcommand's; without one, those of every listed subcommand too (prose about the binary
        as a whole)."""
        top = self.command(binary)
        if top is None:
            return set()
        flags = set(top.flags)
        if subcommand:
            sub = self.command(binary, subcommand)
            flags |= sub.flags if sub else set()
        else:
            for name in top.subcommands:
                sub = self.command(binary, name)
                flags |= sub.flags if sub else set()
        return flags

    def all_flags(self):
        flags = set()
        for binary in BINARIES:
            flags |= self.valid_flags(binary)
        return flags

    def subcommand_of(self, binary, words):
        """The subcommand that `binary WORDS...` runs: the first word that is a listed subcommand,
        else the first word when it is a hidden one (a bare word that answers --help)."""
        top = self.command(binary)
        if top is None or not top.subcommands:
            return None
        for word in words:
            if word in top.subcommands:
                return word
        if words and re.fullmatch(r"[a-z][a-z0-9-]*", words[0]) and \
                self.command(binary, words[0]) is not None:
            return words[0]
        return None


def words_of(text):
    return [w.strip("[]()'\"`,") for w in text.split()]


class Checker:
    def __init__(self, binaries):
        self.binaries = binaries
        self.all_flags = binaries.all_flags()
        self.problems = []  # (file, line, name, why)
        self.attributed = 0  # flags checked against one command
        self.verbose = False

    def report(self, where, name, why):
        self.problems.append((where[0], where[1], name, why))

    def check_attributed(self, where, flags, binary, subcommand):
        valid = self.binaries.valid_flags(binary, subcommand)
        command = binary + (" " + subcommand if subcommand else "")
        self.attributed += len(flags)
        if self.verbose:
            for flag in flags:
                print(f"{where[0]}:{where[1]}: {flag} -> {command}")
        for flag in flags:
            if flag not in valid:
                self.report(where, flag, f"`{command}` has no such flag (see its --help)")

    def check_command_line(self, where, text, context):
        """Every binary invocation in `text`; returns the flags it attributed."""
        attributed = set()
        for match in BINARY_RE.finditer(text):
            binary = match.group(1)
            rest = text[match.end():]
            end = COMMAND_END_RE.search(rest)
            args = rest[:end.start()] if end else rest
            subcommand = self.binaries.subcommand_of(binary, words_of(args))
            flags = FLAG_RE.findall(args)
            self.check_attributed(where, flags, binary, subcommand)
            attributed.update(flags)
        # A span like `transfer --target` under a `larder-bench` heading: that subcommand.
        if not attributed and context:
            words = words_of(text)
            top = self.binaries.command(context[0])
            if words and top and words[0] in top.subcommands:
                flags = FLAG_RE.findall(text)
                self.check_attributed(where, flags, context[0], words[0])
                attributed.update(flags)
        return attributed

    def check_loose(self, where, text, attributed):
        """Flags in prose may name any binary's (the master's `--client-ttl` on a page about the
        client), so they need only exist somewhere."""
        for flag in FLAG_RE.findall(text):
            if flag in attributed:
                continue
            if flag not in self.all_flags and flag not in FOREIGN_FLAGS:
                self.report(where, flag, "no Larder binary has this flag (nor is it in "
                            "FOREIGN_FLAGS, tests/docs/docs_test.py)")

    def check_file(self, path, display):
        headings = []  # (level, context or None)
        default_column = None  # of the table being read, when it has a "default" column
        in_code = False
        code_lang = ""
        lines = path.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            number = i + 1
            i += 1
            where = (display, number)
            fence = re.match(r"^\s*(```+|~~~+)\s*(\S*)", line)
            if fence:
                in_code = not in_code
                code_lang = fence.group(2) if in_code else ""
                continue
            if in_code:
                # Join continued shell lines; a comment ends a command.
                while line.endswith("\\") and i < len(lines):
                    line = line[:-1] + " " + lines[i]
                    i += 1
                command = line
                if code_lang in ("", "sh", "bash", "console", "shell"):
                    command = re.split(r"(?:^|\s)#", line, maxsplit=1)[0]
                # Flags of a binary's command line are that binary's; the others (comments,
                # other tools) are checked loosely, whatever the heading says.
                attributed = self.check_command_line(where, command, None)
                self.check_loose(where, line, attributed)
                continue
            heading = re.match(r"^(#+)\s+(.*)$", line)
            if heading:
                level = len(heading.group(1))
                headings = [h for h in headings if h[0] < level]
                headings.append((level, self.heading_context(heading.group(2))))
                continue
            context = self.context(headings)
            attributed = set()
            spans = re.findall(r"`([^`]+)`", line)
            for span in spans:
                attributed |= self.check_command_line(where, span, context)
            if re.match(r"^\s*\|[-|: ]+\|\s*$", line) and i >= 2:
                header = [c.strip().lower() for c in lines[i - 2].strip().strip("|").split("|")]
                default_column = header.index("default") if "default" in header else None
            elif not line.lstrip().startswith("|"):
                default_column = None
            if line.lstrip().startswith("|") and context:
                cells = line.strip().strip("|").split("|")
                first = cells[0].replace("`", "")
                flags = FLAG_RE.findall(first)
                if flags:
                    binary, subcommand = context
                    if subcommand is None:
                        subcommand = self.binaries.subcommand_of(binary, words_of(first))
                    self.check_attributed(where, flags, binary, subcommand)
                    attributed.update(flags)
                    if len(flags) == 1 and default_column is not None and \
                            default_column < len(cells):
                        self.check_default(where, flags[0], cells[default_column], binary,
                                           subcommand)
            self.check_loose(where, " ".join(spans), attributed)

    def check_default(self, where, flag, cell, binary, subcommand):
        """A table's default for a flag must be the one --help shows, when it shows one."""
        commands = [self.binaries.command(binary, subcommand), self.binaries.command(binary)]
        shown = next((c.defaults[flag] for c in commands if c and flag in c.defaults), None)
        if shown is None:
            return
        text = re.sub(r"(\d) (ms|s|m|h)\b", r"\1\2", cell.replace("`", ""))  # "10 s": 10s
        words = {w.lower() for w in re.findall(r"[\w.:,/@-]+", text)}
        same = {shown.lower()} | SAME_VALUES.get(shown.lower(), set())
        if not words & same:
            self.report(where, flag, f"the docs' default '{cell.strip()}' is not the "
                        f"'{shown}' that `{binary}{' ' + subcommand if subcommand else ''} "
                        "--help` shows")

    def heading_context(self, text):
        match = BINARY_RE.search(text.replace("`", ""))
        if not match:
            return None
        binary = match.group(1)
        rest = words_of(text.replace("`", "")[match.end():])
        top = self.binaries.command(binary)
        subcommand = rest[0] if rest and top and rest[0] in top.subcommands else None
        return (binary, subcommand)

    @staticmethod
    def context(headings):
        for _, context in reversed(headings):
            if context:
                return context
        return None


def source_files(source_dir):
    skip_dirs = {".git", "docs", "__pycache__", "node_modules"}
    for root, dirs, files in os.walk(source_dir):
        rel = Path(root).relative_to(source_dir)
        dirs[:] = [d for d in dirs if d not in skip_dirs and not (
            rel == Path(".") and (d.startswith("build") or d.startswith("."))
            and d != ".ci") and not (rel == Path("tests") and d == "docs")]
        for name in files:
            if name.endswith((".md", ".png", ".svg", ".pem", ".so", ".jsonl")):
                continue
            path = Path(root) / name
            try:
                yield path, path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--docs", nargs="*")
    parser.add_argument("--expect", action="append", metavar="NAME",
                        help="--expect=NAME, once per name: succeed only when exactly these are "
                        "reported")
    parser.add_argument("--verbose", action="store_true", help="list every attributed flag")
    args = parser.parse_args()
    source_dir = Path(args.source_dir).resolve()
    docs = [Path(d) for d in args.docs] if args.docs else \
        [source_dir / "README.md"] + sorted((source_dir / "docs").glob("*.md"))

    checker = Checker(Binaries(args.bin_dir))
    checker.verbose = args.verbose
    sources = list(source_files(source_dir))
    source_words = set()
    routes = set()
    for path, text in sources:
        source_words.update(VARIABLE_RE.findall(text))
        routes.update(SOURCE_ROUTE_RE.findall(text))
    if "/metrics" not in routes:
        sys.exit("docs_test: found no HTTP routes in the sources (SOURCE_ROUTE_RE)")

    for doc in docs:
        resolved = doc.resolve()
        display = str(resolved.relative_to(source_dir)) if resolved.is_relative_to(source_dir) \
            else str(doc)
        checker.check_file(doc, display)
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for name in VARIABLE_RE.findall(line):
                if name not in source_words:
                    checker.report((display, number), name, "named nowhere in the sources")
            for span in re.findall(r"`([^`]+)`", line):
                match = ROUTE_RE.match(span.strip())
                if match and match.group(1).split("/")[1] not in NOT_ROUTES:
                    route = match.group(1)
                    if route not in routes and route.rstrip("/") not in routes:
                        checker.report((display, number), route, "no HTTP server serves it")

    found = sorted({p[2] for p in checker.problems})
    for file, line, name, why in checker.problems:
        print(f"{file}:{line}: {name}: {why}")
    if args.expect is not None:
        if found == sorted(set(args.expect)):
            print(f"docs_test: reported exactly what was expected: {', '.join(found)}")
            return 0
        print(f"docs_test: expected {sorted(set(args.expect))}, reported {found}")
        return 1
    if checker.problems:
        print(f"docs_test: {len(checker.problems)} name(s) in the docs that the code does not have")
        return 1
    print(f"docs_test: {len(docs)} files, {checker.attributed} flags checked against their "
          "command: every flag, LARDER_* name and HTTP route exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())

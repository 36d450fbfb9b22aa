#!/usr/bin/env python3
"""Extracts the ```cpp blocks of Markdown files into translation units, so that
the build compiles every snippet the documentation shows.

  snippets.py OUT_DIR ROOT FILE.md...

A block is placed by the HTML comment on the line before it:

  (none)                          a fragment: the body of a function that sees
                                  prelude.hpp's names (ctx, model, opt, x, y, ...)
  <!-- snippet: declarations -->  namespace-scope code (types, policies)
  <!-- snippet: parallel -->      a fragment that needs amp::parallel (MPI)
  <!-- snippet: program -->       a complete program: built and run
  <!-- snippet: skip REASON -->   not compiled; the test prints the reason
  <!-- snippet: copy PATH -->     a copy of the file PATH (built and tested
                                  there): the test fails where they differ

Fragments of one file share a translation unit (each in its own function, so
their names do not meet); #include lines move to its top. #line directives
make the compiler's messages name the Markdown file and line. Writes
fragments_<file>.cpp, parallel_<file>.cpp, program_<file>_<n>.cpp and
manifest.txt (one line per unit or skip: KIND NAME [REASON])."""
import pathlib
import re
import sys

MARK = re.compile(r"<!--\s*snippet:\s*(\w+)\s*(.*?)\s*-->")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


def blocks(path):
    """(line of the first code line, kind, reason, code lines) per ```cpp block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if lang == "cpp":
            mark = MARK.search(lines[i - 1]) if i > 0 else None
            kind, reason = (mark.group(1), mark.group(2)) if mark else ("fragment", "")
            code = [l[len(indent):] if l.startswith(indent) else l for l in lines[i + 1:end]]
            yield i + 2, kind, reason, code
        i = end + 1


def unit(source, parts):
    """Fragments in one translation unit: the includes hoisted, each part at its #line."""
    includes = ["#include <amp/amp.hpp>", '#include "prelude.hpp"']
    body = []
    for line, code, wrap in parts:
        body += [wrap[0]] if wrap else []
        body.append(f'#line {line} "{source}"')
        for text in code:
            is_include = text.lstrip().startswith("#include")
            if is_include and text.strip() not in includes:
                includes.append(text.strip())
            body.append("" if is_include else text)  # a blank keeps the line numbers
        body += [wrap[1]] if wrap else []
    return "\n".join(includes + ["namespace readme {"] + body + ["}  // namespace readme", ""])


def main():
    out, root, files = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3:]
    out.mkdir(parents=True, exist_ok=True)
    written = {}  # file name -> text; written at the end, only where it changed (no needless rebuilds)
    manifest = []
    for name in files:
        path = pathlib.Path(name)
        source = path.resolve().relative_to(root.resolve()).as_posix()
        stem = re.sub(r"\W", "_", source.removesuffix(".md"))
        groups = {"fragments": [], "parallel": []}
        for n, (line, kind, reason, code) in enumerate(blocks(path)):
            function = (f"[[maybe_unused]] void snippet_{n}() {{", "}")
            if kind == "fragment":
                groups["fragments"].append((line, code, function))
            elif kind == "parallel":
                groups["parallel"].append((line, code, function))
            elif kind == "declarations":
                groups["fragments"].append((line, code, None))
            elif kind == "program":
                unit_name = f"program_{stem}_{sum(m.startswith('program') for m in manifest)}"
                written[f"{unit_name}.cpp"] = "\n".join([f'#line {line} "{source}"'] + code + [""])
                manifest.append(f"program {unit_name}")
            elif kind == "copy":
                same = (root / reason).read_text(encoding="utf-8").splitlines() == code
                manifest.append(f"{'copy' if same else 'stale'} {source}:{line} {reason}")
            elif kind == "skip":
                manifest.append(f"skip {source}:{line} {reason or '(no reason given)'}")
            else:
                sys.exit(f"{source}:{line - 1}: unknown snippet kind '{kind}'")
        for kind, parts in groups.items():
            if parts:
                written[f"{kind}_{stem}.cpp"] = unit(source, parts)
                manifest.append(f"{kind} {kind}_{stem}")
    written["manifest.txt"] = "\n".join(manifest) + "\n"
    for old in out.iterdir():
        if old.name not in written:
            old.unlink()
    for name, text in written.items():
        if not (out / name).exists() or (out / name).read_text() != text:
            (out / name).write_text(text)


if __name__ == "__main__":
    main()

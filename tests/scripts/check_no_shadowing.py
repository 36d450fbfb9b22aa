#!/usr/bin/env python3
"""No file in scripts/ (or bench/) may shadow a standard module: `python3 scripts/plot.py` puts scripts/ first on
the module path, so a scripts/tokenize.py once broke matplotlib's import of the standard `tokenize`.

usage: check_no_shadowing.py FOLDER..."""
import os
import sys

clashes = []
for folder in sys.argv[1:]:
    for name in sorted(os.listdir(folder)):
        stem, ext = os.path.splitext(name)
        if ext == ".py" and stem in sys.stdlib_module_names:
            clashes.append(os.path.join(folder, name))
if clashes:
    sys.exit("these shadow Python's standard modules of the same name for every script beside them: "
             + ", ".join(clashes) + " (rename them)")
print(f"no shadowing: checked {len(sys.argv) - 1} folder(s) against {len(sys.stdlib_module_names)} standard modules")

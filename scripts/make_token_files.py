#!/usr/bin/env python3
"""Writes llm.c token files from text with a byte-level tokenizer (token id = byte value, vocabulary 256).

    scripts/make_token_files.py OUT_PREFIX TEXT... [--val-fraction 0.1]

TEXT: files, or folders whose files without an extension are read in name order (as char_lm reads the fortunes).
The text is concatenated; the last --val-fraction validates. Writes OUT_PREFIX_train.bin and OUT_PREFIX_val.bin:
a header of 256 little-endian int32 (magic 20240520, version 1, the number of ids), then the ids as uint16 —
the format of llm.c's data scripts, which char_lm reads with --train-tokens/--val-tokens --vocab-size 256.
"""
import argparse
import os
import struct
import sys

MAGIC, VERSION = 20240520, 1


def text_files(paths):
    for path in paths:
        if os.path.isdir(path):
            for name in sorted(os.listdir(path)):
                full = os.path.join(path, name)
                if "." not in name and os.path.isfile(full):
                    yield full
        elif os.path.isfile(path):
            yield path
        else:
            sys.exit(f"make_token_files.py: '{path}' is neither a file nor a folder")


def write(path, ids):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<256i", MAGIC, VERSION, len(ids), *([0] * 253)))
        f.write(struct.pack(f"<{len(ids)}H", *ids))
    os.replace(tmp, path)  # no half-written file under the name
    print(f"wrote {path}: {len(ids)} tokens")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefix")
    parser.add_argument("text", nargs="+")
    parser.add_argument("--val-fraction", type=float, default=0.1)
    a = parser.parse_args()
    if not 0 < a.val_fraction < 1:
        sys.exit("make_token_files.py: --val-fraction must be in (0, 1)")
    data = b"".join(open(f, "rb").read() for f in text_files(a.text))
    split = int(len(data) * (1 - a.val_fraction))
    if split < 2 or len(data) - split < 2:
        sys.exit(f"make_token_files.py: {len(data)} bytes of text are too few to split")
    write(a.prefix + "_train.bin", list(data[:split]))
    write(a.prefix + "_val.bin", list(data[split:]))


if __name__ == "__main__":
    main()

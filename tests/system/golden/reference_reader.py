"""Runs the minimal Python reader of docs/format.md, exactly as the page shows it, against the
golden native checkpoints (every format version cairn writes), and checks every value.

    reference_reader.py DOCS_FORMAT_MD GOLDEN_DATA_DIR

Exits 77 (ctest SKIP) with the reason when python3-xxhash is missing; a version 3 checkpoint
(zstd) is skipped, visibly, when python3-zstandard is missing.
"""
import importlib.util
import os
import re
import shutil
import struct
import sys
import tempfile


def main():
    doc, golden = sys.argv[1], sys.argv[2]
    if importlib.util.find_spec("xxhash") is None:
        print("SKIP: python3-xxhash is not installed (scripts/bootstrap installs it)")
        return 77
    text = open(doc, encoding="utf-8").read()
    section = text[text.index("## A minimal reader (Python)"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    reader = {}
    exec(compile(code, "docs/format.md (reader)", "exec"), reader)

    def bf16(x):
        return struct.pack("<f", x)[2:]

    want = {
        "model.w": ("F32", [6, 5], b"".join(struct.pack("<f", 0.25 * i) for i in range(30))),
        "model.e": ("BF16", [4, 6], b"".join(bf16(r * 6 + c - 7.5) for r in range(4) for c in range(6))),
        "model.b": ("I64", [7], b"".join(struct.pack("<q", (1 << 40) + i) for i in range(7))),
        "optim.big": ("I32", [40, 8], b"".join(struct.pack("<i", i % 13) for i in range(320))),
    }
    checked = 0
    uneven = {"model.u": ("F32", [5, 3], b"".join(struct.pack("<f", -0.5 * i) for i in range(15)))}
    for name in ("native_plain", "native_tiled", "native_zstd", "native_index", "native_grid"):
        root = f"{golden}/{name}"
        meta = reader["read_metadata"](root)
        compressed = '"codec"' in open(f"{root}/metadata.json").read() or name == "native_zstd"
        if compressed and importlib.util.find_spec("zstandard") is None:
            print(f"SKIP {name} (version {meta['version']}): python3-zstandard is not installed")
            continue
        tensors = dict(want, **uneven) if name == "native_grid" else want
        for key, (dtype, shape, data) in tensors.items():
            got = reader["read_tensor"](root, key)
            if got != (dtype, shape, data):
                print(f"FAIL {name}: {key} read {got[0]} {got[1]}, "
                      f"{sum(a != b for a, b in zip(got[2], data))} bytes differ")
                return 1
            checked += 1
        print(f"ok {name} (version {meta['version']}): {len(tensors)} tensors exact")
    # The reader refuses a flipped byte in a version 4 or 5 index file, wherever it is.
    for fixture in ("native_index", "native_grid"):
        with tempfile.TemporaryDirectory() as tmp:
            root = shutil.copytree(f"{golden}/{fixture}", f"{tmp}/ckpt")
            index = [n for n in os.listdir(root) if n.startswith("index.")]
            meta = reader["read_metadata"](root)
            for name in index:
                path = f"{root}/{name}"
                good = open(path, "rb").read()
                for at in range(len(good)):
                    bad = bytearray(good)
                    bad[at] ^= 0x01
                    open(path, "wb").write(bytes(bad))
                    try:
                        for key, t in meta["tensors"].items():
                            if meta["files"][t["index"]["file"]]["name"] == name:
                                reader["read_tensor"](root, key)
                    except (IOError, ValueError, KeyError, struct.error):
                        continue
                    print(f"FAIL: a flipped byte {at} of {name} was read")
                    return 1
                open(path, "wb").write(good)
            print(f"every flipped byte of {len(index)} index files of {fixture} refused")
    if checked:
        print(f"{checked} tensors read exactly by the reader in docs/format.md")
    return 0 if checked else 1


if __name__ == "__main__":
    sys.exit(main())

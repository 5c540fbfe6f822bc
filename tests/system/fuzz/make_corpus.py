"""Writes the seed corpus of cairn's fuzz targets from real files.

    make_corpus.py --cairn BIN/cairn --make-checkpoint BIN/cairn-test-make-checkpoint OUT

OUT/<target>/ gets one file per distinct input (named by its SHA-1, as libFuzzer names corpus
files), for the targets of tests/fuzz:

  metadata           metadata.json of cairn saves (make_checkpoint, plain and zstd) and of
                     `cairn convert --strategy native` from cairn, torch_dist and torch's own DCP
  safetensors        *.safetensors written by `cairn convert` (one_file, per_tensor, chunks)
  safetensors_index  model.safetensors.index.json written by `cairn convert --strategy chunks`
  dcp_metadata       .metadata written by torch 1.13's DCP (save_state_dict) and by
                     `cairn convert --strategy torch_dist`; torch 2.x and Megatron layouts from
                     tests/format/samples/gen_dcp2x_metadata.py
  torch_zip          torch.save files (dtypes, views, Parameters, nn.Module and optimizer state),
                     the items of .distcp files, cairn's common.pt
  pickle             data.pkl of every torch_zip seed, every .metadata, CPython pickles of
                     assorted values at protocols 0-5
  index              sections of format version 4's binary index, built here (index_sections;
                     layout in include/cairn/format/native/index_file.hpp)

PyTorch parts run in this interpreter (Debian's /usr/bin/python3 with python3-torch); without
torch they are skipped with a printed note and the rest is still written. Files above 64 KiB
are left out (small inputs fuzz faster).
"""
import argparse
import collections
import hashlib
import io
import os
import pickle
import subprocess
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "interop"))
from torch_dcp import import_dcp  # noqa: E402 (tests/system/interop/torch_dcp.py)

TARGETS = ("metadata", "safetensors", "safetensors_index", "dcp_metadata", "torch_zip", "pickle",
           "index")
MAX_SEED = 64 << 10
HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLES = os.path.join(HERE, "..", "..", "format", "samples")


class Corpus:
    def __init__(self, out):
        self.out = out
        self.count = collections.Counter()
        for t in TARGETS:
            os.makedirs(os.path.join(out, t), exist_ok=True)

    def add(self, target, data):
        if not data or len(data) > MAX_SEED:
            return
        name = hashlib.sha1(data).hexdigest()
        path = os.path.join(self.out, target, name)
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(data)
            self.count[target] += 1
        if target == "torch_zip":  # its data.pkl is a pickle seed too
            try:
                with zipfile.ZipFile(io.BytesIO(data)) as z:
                    for n in z.namelist():
                        if n.endswith("/data.pkl"):
                            self.add("pickle", z.read(n))
            except zipfile.BadZipFile:
                pass

    def add_file(self, target, path):
        with open(path, "rb") as f:
            self.add(target, f.read())


def run(*args):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"make_corpus: {' '.join(args)} exited {r.returncode}:\n{r.stdout}{r.stderr}")


def split_zips(blob):
    """The zip archives concatenated in `blob` (a .distcp file holds one per item)."""
    out, start, pos = [], 0, 0
    while True:
        eocd = blob.find(b"PK\x05\x06", pos)
        if eocd < 0 or eocd + 22 > len(blob):
            return out
        end = eocd + 22 + int.from_bytes(blob[eocd + 20:eocd + 22], "little")
        out.append(blob[start:end])
        start = pos = end


def collect(corpus, root):
    """Adds every file below `root` to the target its name says."""
    for d, _, files in os.walk(root):
        for n in files:
            p = os.path.join(d, n)
            if n == "metadata.json":
                corpus.add_file("metadata", p)
            elif n.endswith(".safetensors"):
                corpus.add_file("safetensors", p)
            elif n.endswith(".index.json"):
                corpus.add_file("safetensors_index", p)
            elif n == ".metadata":
                corpus.add_file("dcp_metadata", p)
                corpus.add_file("pickle", p)
            elif n.endswith(".pt"):
                corpus.add_file("torch_zip", p)
            elif n.endswith(".distcp"):
                with open(p, "rb") as f:
                    for z in split_zips(f.read()):
                        corpus.add("torch_zip", z)


def cairn_checkpoints(cairn, make_checkpoint, work):
    """cairn saves and their conversions to every layout; returns the checkpoint folders."""
    plain, zstd = os.path.join(work, "cairn"), os.path.join(work, "cairn_zstd")
    run(make_checkpoint, plain)
    run(make_checkpoint, "zstd", zstd)
    convert_all(cairn, plain, "from_cairn", work)
    convert_all(cairn, zstd, "from_zstd", work, strategies=("torch_dist", "one_file"))


def convert_all(cairn, src, tag, work,
                strategies=("native", "torch_dist", "one_file", "per_tensor", "chunks")):
    for s in strategies:
        dst = os.path.join(work, f"{tag}_{s}")
        extra = ["--chunk-size", "1KB"] if s == "chunks" else []
        run(cairn, "convert", src, dst, "--strategy", s, *extra)


def python_pickles(corpus):
    """CPython pickles of values that exercise every opcode family cairn's reader knows."""
    shared = [1, "shared"]
    values = [
        None, True, 0, -1, 255, 65535, -(2**31), 2**31, 2**63 - 1, -(2**63), 2**70, -(2**100),
        1.5, float("inf"), -0.0, "", "é\n\x00", "x" * 300, b"", b"\x00\xff" * 200,
        bytearray(b"ab"), (), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), [], [1, [2, [3, [4]]]],
        {}, {"a": 1, 2: "b", (3, 4): None}, {1, 2}, frozenset([3]), [shared, shared, (shared,)],
        collections.OrderedDict([("k", 1), ("j", [2.5])]),
        {"step": 12, "lr": 0.1, "betas": (0.9, 0.999), "name": "adam", "flags": [True, False]},
    ]
    loop = [1]
    loop.append(loop)  # a reference cycle, which cairn's reader must refuse
    values.append(loop)
    for p in range(0, pickle.HIGHEST_PROTOCOL + 1):
        for v in values:
            corpus.add("pickle", pickle.dumps(v, protocol=p))
        corpus.add("pickle", pickle.dumps(values[:-1], protocol=p))


def index_sections(corpus):
    """Sections of the version 4 index file (read with block_size 64 and 4 data files)."""
    import struct

    def section(key, dtype, shape, chunks):
        b = struct.pack("<I", len(key)) + key.encode() + struct.pack("<BB", dtype, len(shape))
        b += struct.pack(f"<{len(shape)}q", *shape) + struct.pack("<Q", len(chunks))
        for off, size, tiles, file, byte_off, nbytes, sums, blocks in chunks:
            b += struct.pack(f"<{len(off)}q", *off) + struct.pack(f"<{len(size)}q", *size)
            b += struct.pack("<B", 1 if tiles else 0)
            if tiles:
                b += struct.pack(f"<{len(tiles)}q", *tiles)
            b += struct.pack("<IQQB", file, byte_off, nbytes, 1 if blocks else 0)
            b += struct.pack(f"<{len(sums)}Q", *sums)
            if blocks:
                b += struct.pack(f"<{len(sums)}Q", *blocks[0]) + struct.pack(f"<{len(sums)}Q", *blocks[1])
        return b

    f32, bf16, i64 = 11, 10, 7
    corpus.add("index", section("w", f32, [8, 6], [([0, 0], [4, 6], None, 0, 0, 96, [1, 2], None),
                                                    ([4, 0], [4, 6], None, 1, 0, 96, [3, 4], None)]))
    corpus.add("index", section("b", bf16, [4, 16], [([0, 0], [4, 16], [2, 2], 0, 96, 128,
                                                      [1, 2, 3, 4],
                                                      ([200, 230, 260, 290], [30, 30, 30, 32]))]))
    corpus.add("index", section("step", i64, [], [([], [], None, 1, 96, 8, [9], None)]))

    def directory(key, dtype, shape, pages):
        """A tensor's directory: pages of (box offset, box size, chunks, offset, length, sum)."""
        b = struct.pack("<I", len(key)) + key.encode() + struct.pack("<BB", dtype, len(shape))
        b += struct.pack(f"<{len(shape)}q", *shape)
        b += struct.pack("<QQ", sum(p[2] for p in pages), len(pages))
        for off, size, n, at, length, xxh in pages:
            b += struct.pack(f"<{len(off)}q", *off) + struct.pack(f"<{len(size)}q", *size)
            b += struct.pack("<QQQQ", n, at, length, xxh)
        return b

    corpus.add("index", directory("w", f32, [8, 6], [([0, 0], [6, 6], 2, 400, 120, 7),
                                                      ([6, 0], [2, 6], 1, 520, 80, 9)]))
    corpus.add("index", directory("step", i64, [], [([], [], 1, 16, 60, 3)]))

    def directory_v5(key, dtype, shape, chunks, layout):
        """Version 5: the head, the layout byte, then pages (as above) or a grid."""
        b = struct.pack("<I", len(key)) + key.encode() + struct.pack("<BB", dtype, len(shape))
        b += struct.pack(f"<{len(shape)}q", *shape) + struct.pack("<QB", chunks, 0 if
                                                                    isinstance(layout, list) else 1)
        if isinstance(layout, list):
            b += struct.pack("<Q", len(layout))
            for off, size, n, at, length, xxh in layout:
                b += struct.pack(f"<{len(off)}q", *off) + struct.pack(f"<{len(size)}q", *size)
                b += struct.pack("<QQQQ", n, at, length, xxh)
        else:
            cell, tiles, at, entry = layout
            b += struct.pack(f"<{len(cell)}q", *cell) + struct.pack("<B", 1 if tiles else 0)
            if tiles:
                b += struct.pack(f"<{len(tiles)}q", *tiles)
            b += struct.pack("<QQ", at, entry)
        return b

    corpus.add("index", directory_v5("w", f32, [8, 6], 4, ([2, 6], None, 400, 28)))
    corpus.add("index", directory_v5("m", f32, [4, 8], 2, ([2, 8], [1, 2], 400, 36)))
    corpus.add("index", directory_v5("w", f32, [8, 6], 2, [([0, 0], [6, 6], 2, 400, 120, 7)]))

    def entries(cells):
        """Grid entries of (rank, byte offset, checksums), each closed by its own XXH3-64."""
        import xxhash
        out = b""
        for rank, at, sums in cells:
            e = struct.pack("<IQ", rank, at) + struct.pack(f"<{len(sums)}Q", *sums)
            out += e + struct.pack("<Q", xxhash.xxh3_64_intdigest(e))
        return out

    corpus.add("index", entries([(0, 0, [5]), (1, 48, [6]), (3, 96, [7])]))


def gen_dcp2x(corpus):
    """torch 2.x and Megatron .metadata layouts, built without torch by the format tests."""
    script = os.path.join(SAMPLES, "gen_dcp2x_metadata.py")
    r = subprocess.run([sys.executable, script], capture_output=True, text=True, check=True)
    for line in r.stdout.split("\n"):
        if line.strip():
            b = bytes.fromhex(line.split()[1])
            corpus.add("dcp_metadata", b)
            corpus.add("pickle", b)


def torch_files(cairn, work):
    """torch.save files and DCP checkpoints from the real PyTorch; False without torch."""
    try:
        import torch
    except ImportError as e:
        print(f"make_corpus: torch parts skipped: {e} (scripts/bootstrap installs python3-torch)")
        return False
    torch.manual_seed(0)
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
              torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]
    kinds = {str(t).split(".")[1]: torch.arange(6).reshape(2, 3).to(t) for t in dtypes}
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    views = {
        "transposed": base.t(),                   # strides (1, 6)
        "sliced": base[1:3, 2:5],                 # storage offset 8, strides (6, 1)
        "row": base[2],                           # shares base's storage
        "expanded": torch.ones(3).expand(4, 3),  # stride 0
        "base": base,
        "scalar": torch.tensor(3.25),
        "empty": torch.zeros(0, 3),
    }
    lin = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(lin.parameters(), lr=0.01)
    lin(torch.ones(1, 3)).sum().backward()
    opt.step()
    common = {"step": 12, "lr": 0.1, "name": "run-1", "flag": True, "none": None,
              "pair": (1, 2), "raw": b"ab", "big": 2**70, "ids": [3, 1, 2]}
    saves = {
        "tensor": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "dtypes": kinds,
        "views": views,
        "module": lin.state_dict(),
        "optimizer": opt.state_dict(),
        "parameter": torch.nn.Parameter(torch.ones(2, 2)),
        "params": [torch.nn.Parameter(torch.zeros(2)), (torch.ones(1),)],
        "nested": {"model": {"w": torch.ones(2, 2), "b": torch.zeros(2)}, "common": common},
        "common": common,
    }
    pt = os.path.join(work, "torch_save")
    os.makedirs(pt)
    for name, obj in saves.items():
        torch.save(obj, os.path.join(pt, f"{name}.pt"))
        torch.save(obj, os.path.join(pt, f"{name}_p4.pt"), pickle_protocol=4)

    # torch 1.13's DCP: tensors (one chunk each) and a bytes item, then cairn's conversions.
    dcp = import_dcp()
    sd = {"model.w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
          "model.b": torch.ones(4, dtype=torch.bfloat16), "ids": torch.arange(5),
          "step": 7}
    torch_dcp = os.path.join(work, "torch_dcp")
    dcp.save_state_dict(sd, dcp.FileSystemWriter(torch_dcp), no_dist=True)
    convert_all(cairn, torch_dcp, "from_torch_dcp", work,
                strategies=("native", "one_file", "chunks"))
    # Every dtype and a few shapes (scalar, empty, 3-d), through DCP into every layout.
    sd = {f"dtype.{k}": v for k, v in kinds.items()}
    sd.update({"shape.scalar": torch.tensor(2.5), "shape.empty": torch.zeros(0, 3),
               "shape.cube": torch.arange(24, dtype=torch.int16).reshape(2, 3, 4)})
    dtypes_dcp = os.path.join(work, "torch_dcp_dtypes")
    dcp.save_state_dict(sd, dcp.FileSystemWriter(dtypes_dcp), no_dist=True)
    convert_all(cairn, dtypes_dcp, "from_dtypes_dcp", work)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cairn", required=True, help="the cairn tool (build/bin/cairn)")
    ap.add_argument("--make-checkpoint", required=True,
                    help="tests/cli's helper (build/bin/cairn-test-make-checkpoint)")
    ap.add_argument("--work", help="keep the checkpoints the seeds come from in this folder")
    ap.add_argument("out", help="corpus folder; OUT/<target>/ is created")
    args = ap.parse_args()
    corpus = Corpus(args.out)
    with tempfile.TemporaryDirectory(prefix="cairn-corpus-") as tmp:
        work = args.work or tmp
        os.makedirs(work, exist_ok=True)
        cairn_checkpoints(args.cairn, args.make_checkpoint, work)
        try:
            have_torch = torch_files(args.cairn, work)
        except Exception as e:  # a broken torch install must not stop the other seeds
            print(f"make_corpus: torch parts failed, skipped: {type(e).__name__}: {e}")
            have_torch = False
        collect(corpus, work)
    python_pickles(corpus)
    index_sections(corpus)
    gen_dcp2x(corpus)
    total = {t: len(os.listdir(os.path.join(args.out, t))) for t in TARGETS}
    print("make_corpus: " + ", ".join(f"{t} {total[t]}" for t in TARGETS) +
          f" seeds in {args.out}" + ("" if have_torch else " (no torch parts)"))


if __name__ == "__main__":
    main()

"""Python side of cairn's interop tests: run by ctest with Debian's /usr/bin/python3 (torch 1.13
on the host; torch 2.14 in the today tier's root, scripts/today-root).

    interop.py CASE TOOL WORKDIR

CASE is one of safetensors_numpy, pt_torch_load, pt_from_torch, torch_save_load, dcp_torch_load,
dcp_from_torch, unshard_numpy, convert_dcp_torch_load, strategy_torch_dist, strategy_safetensors,
deepspeed_zero_load.
TOOL is the cairn_interop helper (tests/system/interop/cairn_interop.cpp). Exits 77 (ctest SKIP) with a
printed reason when numpy or torch is missing. Every tensor holds pattern() (mirrored in the C++
helper), compared bit for bit for f32, f16, bf16, f64, i64, i32, i16, i8, u8 and bool.
"""
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import zipfile

import torch_dcp  # beside this file
from torch_dcp import TORCH2, import_dcp

SKIP = 77

try:
    import numpy as np
    import torch
except ImportError as e:  # visible skip, never a silent pass
    print(f"SKIP: {e} (run scripts/bootstrap to install python3-torch and python3-numpy)")
    sys.exit(SKIP)

TYPES = {
    "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64,
    "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8,
    "u8": torch.uint8, "bool": torch.bool,
}
# The dtypes torch 1.13 lacks: unsigned (torch >= 2.3) and float8 (>= 2.1). The DCP cases use them
# too under torch 2.x (DCP_TYPES), asking the C++ helper for them with --all-dtypes (DCP_FLAG).
NEW_TYPES = {"u16": "uint16", "u32": "uint32", "u64": "uint64", "f8_e4m3": "float8_e4m3fn",
             "f8_e5m2": "float8_e5m2"}
if TORCH2:
    TYPES_TORCH2 = dict(TYPES, **{n: getattr(torch, a) for n, a in NEW_TYPES.items()})
DCP_TYPES = TYPES_TORCH2 if TORCH2 else TYPES
DCP_FLAG = ["--all-dtypes"] if TORCH2 else []
ST_NUMPY = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8", "I64": "<i8", "I32": "<i4",
            "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}
ST_SIZE = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
           "U8": 1, "BOOL": 1}


def pattern(name, n, first=0):
    """Element i of the test pattern, as a 1-d torch tensor (mirrors element() in C++)."""
    i = np.arange(first, first + n, dtype=np.int64)
    f = ((i * 37) % 101 - 50) / 8.0
    if name in ("f32", "f16", "bf16", "f64"):
        return torch.from_numpy(f).to(TYPES[name])
    if name.startswith("f8_"):  # every bit pattern, compared as bytes
        return torch.from_numpy(((i * 37 + 11) % 256).astype(np.uint8)).view(TYPES_TORCH2[name])
    if name in ("u16", "u32", "u64"):
        a = {"u16": ((i * 37) % 65536).astype(np.uint16), "u32": (i * 100003 + 5000).astype(np.uint32),
             "u64": ((i * 1000003 + 5000) * 1048576).astype(np.uint64)}[name]
        return torch.from_numpy(a)
    a = {"i64": (i * 1000003 - 5000) * 1048576, "i32": (i * 100003 - 5000).astype(np.int32),
         "i16": ((i * 37) % 65536 - 32768).astype(np.int16),
         "i8": ((i * 7) % 256 - 128).astype(np.int8), "u8": ((i * 7) % 256).astype(np.uint8),
         "bool": (i % 3 == 0)}[name]
    return torch.from_numpy(np.ascontiguousarray(a))


def raw(t):
    """The little-endian bytes of a tensor (bf16 through its int16 view)."""
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    elif t.dtype not in (torch.bool,) and t.dtype not in TYPES.values() and t.dim() > 0:
        t = t.view(torch.uint8)  # float8 and unsigned: numpy has no float8
    return t.numpy().tobytes()


def same(name, got, want):
    if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape) or raw(got) != raw(want):
        sys.exit(f"FAIL {name}: got {got.dtype} {tuple(got.shape)} {got.flatten()[:6]}, "
                 f"want {want.dtype} {tuple(want.shape)} {want.flatten()[:6]}")


def run(tool, *args):
    r = subprocess.run([tool, *args], capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        sys.exit(f"FAIL: {tool} {' '.join(args)} exited {r.returncode}:\n{r.stderr}")


def read_safetensors_numpy(path):
    """A safetensors reader of our own (no safetensors package on Debian): numpy arrays."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert (8 + n) % 8 == 0, "header not padded to 8 bytes"
    header = json.loads(blob[8:8 + n])
    keys = list(header)
    if "__metadata__" in header:
        assert keys[0] == "__metadata__", "__metadata__ must come first"
    data = blob[8 + n:]
    out, end = {}, 0
    for k, v in header.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        assert b == end, f"{k}: not contiguous"
        assert (8 + n + b) % ST_SIZE[v["dtype"]] == 0, f"{k}: misaligned"
        end = e
        out[k] = (v["dtype"], np.frombuffer(data[b:e], dtype=ST_NUMPY[v["dtype"]]).reshape(v["shape"]))
    assert end == len(data), "trailing bytes"
    return header.get("__metadata__", {}), out


def case_safetensors_numpy(tool, work):
    run(tool, "write-safetensors", work)
    meta, ts = read_safetensors_numpy(os.path.join(work, "model.safetensors"))
    assert meta == {"format": "pt"}, meta
    index = json.load(open(os.path.join(work, "model.safetensors.index.json")))
    total = 0
    for name in TYPES:
        want = pattern(name, 15).reshape(3, 5)
        dt, arr = ts["t_" + name]
        if raw(want) != arr.tobytes() or arr.shape != (3, 5):
            sys.exit(f"FAIL t_{name}: {arr.flatten()[:6]} vs {want.flatten()[:6]}")
        shard = index["weight_map"]["t_" + name]
        _, sts = read_safetensors_numpy(os.path.join(work, shard))
        assert sts["t_" + name][1].tobytes() == arr.tobytes(), f"{shard}: t_{name} differs"
        total += arr.nbytes
    assert index["metadata"]["total_size"] == total
    assert ts["scalar"][1].shape == () and ts["empty"][1].shape == (0, 3)
    print(f"numpy read {len(TYPES)} dtypes element-exact from cairn's safetensors (+ index)")


def case_pt_torch_load(tool, work):
    run(tool, "write-pt", work)
    path = os.path.join(work, "cairn.pt")
    blob = open(path, "rb").read()
    with zipfile.ZipFile(path) as z:  # CRCs, stored records, 64-byte alignment
        assert z.testzip() is None
        for info in z.infolist():
            assert info.compress_type == zipfile.ZIP_STORED
            nlen, xlen = struct.unpack("<HH", blob[info.header_offset + 26:info.header_offset + 30])
            off = info.header_offset + 30 + nlen + xlen
            assert off % 64 == 0, f"{info.filename} at {off}"
    for weights_only in (True, False):
        sd = torch.load(path, weights_only=weights_only)
        for name in TYPES:
            same("t_" + name, sd["t_" + name], pattern(name, 15).reshape(3, 5))
        assert sd["scalar"].shape == () and sd["scalar"].item() == pattern("i64", 1).item()
        assert sd["empty"].shape == (0, 3)
    print(f"torch {torch.__version__} torch.load read {len(TYPES)} dtypes element-exact "
          "(weights_only=True and False)")


def case_pt_from_torch(tool, work):
    sd = {"t_" + n: pattern(n, 15).reshape(3, 5) for n in TYPES}
    sd["transposed"] = pattern("f32", 15).reshape(3, 5).t()
    full = pattern("i64", 15)
    sd["full"] = full
    sd["slice"] = full[4:9]  # shares full's storage, storage_offset 4
    torch.save(sd, os.path.join(work, "torch.pt"))
    run(tool, "check-pt", os.path.join(work, "torch.pt"))


def case_torch_save_load(tool, work):
    """torch.save of a state dict read as a checkpoint (format torch_save): cairn::load on 3
    ranks reads each tensor in place, element-exact; a slice sharing a storage too; a transposed
    view is refused naming it."""
    sd = {"t_" + n: pattern(n, 48).reshape(8, 6) for n in DCP_TYPES}
    torch.save(sd, os.path.join(work, "model.pt"))
    run(tool, *DCP_FLAG, "load-dcp-layout", work, "8", "6", "3", "1")  # 3 ranks by columns
    shared = os.path.join(work, "shared")
    os.makedirs(shared)
    # t_f64 is a view 10 elements into a larger storage, saved with the whole storage.
    store = torch.cat([torch.zeros(10, dtype=torch.float64), pattern("f64", 48)])
    torch.save({"t_f64": store[10:].reshape(8, 6)}, os.path.join(shared, "pytorch_model.bin"))
    r = subprocess.run([tool, "load-dcp-layout", shared, "8", "6", "2", "0", "f64"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    bad = os.path.join(work, "bad")
    os.makedirs(bad)
    torch.save({"t_f32": pattern("f32", 48).reshape(6, 8).t()}, os.path.join(bad, "model.pt"))
    r = subprocess.run([tool, "load-dcp-layout", bad, "8", "6", "1", "0", "f32"],
                       capture_output=True, text=True)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "non-contiguous" in out and "t_f32" in out, out
    print(f"torch {torch.__version__} torch.save files: cairn::load on 3 ranks read "
          f"{len(DCP_TYPES)} dtypes element-exact in place; a transposed view refused")


def case_dcp_torch_load(tool, work):
    """cairn writes DCP in the flavor of this torch (module paths of 1.13 or 2.x); torch loads it."""
    run(tool, *DCP_FLAG, "write-dcp-torch2" if TORCH2 else "write-dcp", work)
    dcp = import_dcp()
    sd = {"t_" + n: torch.zeros(4, 6, dtype=DCP_TYPES[n]) for n in DCP_TYPES}
    sd["step"] = 0
    torch_dcp.load(dcp, sd, dcp.FileSystemReader(work))
    for n in DCP_TYPES:
        same("t_" + n, sd["t_" + n], pattern(n, 24).reshape(4, 6))
    assert sd["step"] == 7, sd["step"]
    print(f"torch {torch.__version__} DCP load read cairn's checkpoint "
          f"({'torch2' if TORCH2 else 'torch1_13'} flavor): "
          f"{len(DCP_TYPES)} dtypes element-exact, bytes item ok")


def case_dcp_from_torch(tool, work):
    dcp = import_dcp()
    sd = {"t_" + n: pattern(n, 24).reshape(4, 6) for n in DCP_TYPES}
    torch_dcp.save(dcp, sd, dcp.FileSystemWriter(work))
    run(tool, *DCP_FLAG, "check-dcp", work)
    run(tool, *DCP_FLAG, "load-dcp", work)


def case_unshard_numpy(tool, work):
    ckpt, out = os.path.join(work, "ckpt"), os.path.join(work, "out")
    run(tool, "write-multirank", ckpt)
    run(tool, "unshard", ckpt, out)
    meta, ts = read_safetensors_numpy(os.path.join(out, "model.safetensors"))
    assert meta == {"format": "pt"}, meta
    index = json.load(open(os.path.join(out, "chunks", "model.safetensors.index.json")))
    files = set(index["weight_map"].values())
    assert len(files) > 1, files
    for name in TYPES:
        want = raw(pattern(name, 48).reshape(8, 6))
        _, arr = ts["t_" + name]
        if arr.shape != (8, 6) or arr.tobytes() != want:
            sys.exit(f"FAIL t_{name}: {arr.flatten()[:6]} vs {pattern(name, 6)}")
        _, cts = read_safetensors_numpy(os.path.join(out, "chunks", index["weight_map"]["t_" + name]))
        assert cts["t_" + name][1].tobytes() == want, f"chunks: t_{name} differs"
    print(f"numpy read {len(TYPES)} dtypes element-exact from cairn unshard of a 4-rank checkpoint "
          f"(one_file and {len(files)} chunks + index)")


def case_convert_dcp_torch_load(tool, work):
    ckpt, dist = os.path.join(work, "ckpt"), os.path.join(work, "dist")
    run(tool, *DCP_FLAG, "write-multirank", ckpt)
    run(tool, *DCP_FLAG, "convert-dcp", ckpt, dist)
    dcp = import_dcp()
    md = torch_dcp.reader(dcp, dist).read_metadata()
    assert len(md.state_dict_metadata["t_f32"].chunks) > 1, "expected several items per tensor"
    sd = {"t_" + n: torch.zeros(8, 6, dtype=DCP_TYPES[n]) for n in DCP_TYPES}
    torch_dcp.load(dcp, sd, torch_dcp.reader(dcp, dist))
    for n in DCP_TYPES:
        same("t_" + n, sd["t_" + n], pattern(n, 48).reshape(8, 6))
    mj = json.load(open(os.path.join(dist, "metadata.json")))
    assert mj["sharded_backend"] == "torch_dist", mj
    common = torch.load(os.path.join(dist, "common.pt"))
    assert common == {"step": 12}, common
    print(f"torch {torch.__version__} DCP load read cairn convert --strategy torch_dist "
          f"of a 4-rank checkpoint: {len(DCP_TYPES)} dtypes element-exact; metadata.json, common.pt ok")


def case_strategy_torch_dist(tool, work):
    """cairn::save with the torch_dist strategy on 4 ranks; torch's DCP loader reads it."""
    run(tool, *DCP_FLAG, "save-strategy", "torch_dist", work)
    dcp = import_dcp()
    sd = {"t_" + n: torch.zeros(8, 6, dtype=DCP_TYPES[n]) for n in DCP_TYPES}
    torch_dcp.load(dcp, sd, torch_dcp.reader(dcp, work))
    for n in DCP_TYPES:
        same("t_" + n, sd["t_" + n], pattern(n, 48).reshape(8, 6))
    md = torch_dcp.reader(dcp, work).read_metadata()
    files = {v.relative_path for v in md.storage_data.values()}
    assert len(files) == 4, f"expected one .distcp per rank: {files}"
    assert json.load(open(os.path.join(work, "metadata.json")))["sharded_backend"] == "torch_dist"
    common = torch.load(os.path.join(work, "common.pt"))
    # Megatron's load_content_metadata(dir) is load_common(dir).get("content_metadata").
    want = {"step": 12, "content_metadata": {"source": "cairn interop", "tp": "4"}}
    assert common == want, common
    # remove_sharded_tensors as Megatron's torch_dist strategy does it: torch's DCP loader reads
    # the rest, and the removed keys are gone from its metadata.
    gone = sorted("t_" + n for n in DCP_TYPES if n.startswith("f"))
    out = subprocess.run([tool, "remove-prefix", work, "t_f"], check=True, capture_output=True,
                         text=True).stdout.split()
    assert out[1::2] == gone, out
    md = torch_dcp.reader(dcp, work).read_metadata()
    assert not set(gone) & set(md.state_dict_metadata), sorted(md.state_dict_metadata)
    assert all(k.fqn not in gone for k in md.storage_data), "storage_data keeps removed keys"
    kept = [n for n in DCP_TYPES if not n.startswith("f")]
    sd = {"t_" + n: torch.zeros(8, 6, dtype=DCP_TYPES[n]) for n in kept}
    torch_dcp.load(dcp, sd, torch_dcp.reader(dcp, work))
    for n in kept:
        same("t_" + n, sd["t_" + n], pattern(n, 48).reshape(8, 6))
    print(f"torch {torch.__version__} DCP load read cairn::save(torch_dist) from 4 "
          f"ranks ({len(files)} .distcp files): {len(DCP_TYPES)} dtypes element-exact; common.pt "
          f"with content_metadata ok; after remove_sharded_tensors('t_f') {len(kept)} dtypes "
          f"element-exact, {len(gone)} gone")


def case_strategy_safetensors(tool, work):
    """cairn::save with one_file, per_tensor and chunks on 4 ranks; numpy reads every file."""
    counts = {}
    for strategy in ("one_file", "per_tensor", "chunks"):
        out = os.path.join(work, strategy)
        run(tool, "save-strategy", strategy, out)
        if strategy == "one_file":
            weight_map = {"t_" + n: "model.safetensors" for n in TYPES}
            assert sorted(os.listdir(out)) == ["model.safetensors"], os.listdir(out)
        else:
            weight_map = json.load(open(os.path.join(out, "model.safetensors.index.json")))["weight_map"]
        files = set(weight_map.values())
        counts[strategy] = len(files)
        for name in TYPES:
            meta, ts = read_safetensors_numpy(os.path.join(out, weight_map["t_" + name]))
            assert meta == {"format": "pt"}, meta
            _, arr = ts["t_" + name]
            if arr.shape != (8, 6) or arr.tobytes() != raw(pattern(name, 48).reshape(8, 6)):
                sys.exit(f"FAIL {strategy} t_{name}: {arr.flatten()[:6]} vs {pattern(name, 6)}")
    assert counts["per_tensor"] == len(TYPES) and counts["chunks"] > 1, counts
    print(f"numpy read cairn::save(one_file | per_tensor | chunks) from 4 ranks: {len(TYPES)} "
          f"dtypes element-exact; files {counts}")


def case_deepspeed_zero_load(tool, work):
    """DeepSpeed ZeRO checkpoints (stages 1, 2, 3), written by torch in DeepSpeed 0.16's layout
    (deepspeed_layout.py, beside this file), read as format "deepspeed": cairn::load on 1, 2
    and 3 ranks gives what DeepSpeed's zero_to_fp32 gives, element-exact; a save folder (through
    `latest`) and a tag folder alike; a missing rank's file is refused naming it."""
    fixtures = os.path.join(work, "fixtures")
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, os.path.join(here, "deepspeed_layout.py"), fixtures],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL deepspeed_layout.py: {r.stdout}{r.stderr}")
    names = ["zero1_w2", "zero2_w3", "zero3_w2", "zero3_w3"]
    for name in names:
        ckpt = os.path.join(fixtures, name)
        expected = os.path.join(work, "expected_" + name)
        os.makedirs(expected)
        shutil.copy(os.path.join(ckpt, "expected_fp32.pt"), expected)
        tag = open(os.path.join(ckpt, "latest")).read().strip()
        for ranks in ("1", "2", "3"):
            run(tool, "load-deepspeed", ckpt, expected, ranks)
        run(tool, "load-deepspeed", os.path.join(ckpt, tag), expected, "2")
    # A rank's optimizer states missing: refused, naming the rank.
    broken = os.path.join(work, "broken")
    shutil.copytree(os.path.join(fixtures, "zero2_w3"), broken)
    tag = open(os.path.join(broken, "latest")).read().strip()
    victim = [f for f in os.listdir(os.path.join(broken, tag)) if "zero_pp_rank_1_" in f]
    assert len(victim) == 1, victim
    os.remove(os.path.join(broken, tag, victim[0]))
    r = subprocess.run([tool, "load-deepspeed", broken, os.path.join(work, "expected_zero2_w3"), "2"],
                       capture_output=True, text=True)
    if r.returncode == 0 or "rank 1" not in r.stderr:
        sys.exit(f"FAIL a missing rank file was not refused naming it: {r.stdout}{r.stderr}")
    print(f"cairn::load of {len(names)} DeepSpeed ZeRO checkpoints (stages 1, 2, 3) on 1-3 ranks "
          "equals zero_to_fp32's result; a missing rank is refused: " + r.stderr.strip()[-120:])


def main():
    case, tool, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    globals()["case_" + case](tool, work)
    print(f"PASS {case}")


if __name__ == "__main__":
    main()

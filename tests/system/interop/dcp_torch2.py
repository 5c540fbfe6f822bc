"""DCP with torch 2.x, both ways, across process counts and DTensor layouts (the today tier).

    dcp_torch2.py CASE TOOL CLI WORKDIR

CASE:
  dtensor_to_cairn   torch saves DTensors from 1 to 4 gloo processes (Shard(0), Shard(1) and
                     Replicate on 1-D meshes, Shard/Replicate pairs on a 2x2 mesh, uneven shards,
                     one async_save) with non-tensor items (int, float, str, list, BytesIO);
                     cairn loads every checkpoint on 1, 2 and 3 ranks split by rows and by
                     columns, element-exact; `cairn verify` passes and `cairn inspect` lists the
                     non-tensor items.
                     torch's own `torch_save_to_dcp` output loads too; `cairn diff` finds two
                     layouts of the same state the same.
  cairn_to_dtensor   cairn saves with the torch_dist strategy from 4 ranks, and converts a native
                     checkpoint with `convert --strategy torch_dist`; torch loads both into plain
                     tensors and into DTensors (Shard(0), Shard(1)) on 2 and 3 processes,
                     element-exact; common.pt loads with torch.load(weights_only=True); torch's
                     `dcp_to_torch_save` consolidates them into one .pt.
  hf_storage         torch's Hugging Face storage writer: from 1 process (index and files), and
                     from 2 and 3 gloo processes with save_distributed=True (DCP_SHARDING_INFO in
                     each rank's files, no index; Shard(0), Shard(1), Replicate) and with
                     enable_consolidation=True; cairn loads every one on 1-3 ranks element-exact,
                     `verify`, `inspect` and `diff` handle them; torch's HuggingFaceStorageReader
                     reads cairn's sharded safetensors (`cairn unshard`).
Every dtype torch 2.x has that cairn has (15: the unsigned and float8 ones too).
TOOL is tests/system/interop/cairn_interop.cpp's program, CLI the cairn command-line tool.
Exits 77 (ctest SKIP) with the reason under torch 1.x (its DCP has no DTensor) or without torch.
"""
import io
import json
import os
import shutil
import socket
import subprocess
import sys

os.environ.setdefault("USE_LIBUV", "0")  # Debian's torch is built without libuv

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIP: {e} (the today tier's root has torch 2.x: scripts/today-root)")
    sys.exit(77)
if int(torch.__version__.split(".")[0]) < 2:
    print(f"SKIP: torch {torch.__version__} has no DTensor DCP (the today tier runs this with 2.x)")
    sys.exit(77)

import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from interop import DCP_FLAG, DCP_TYPES as TYPES, pattern, raw  # noqa: E402

R, C = 7, 5  # torch's checkpoints: uneven over 2, 3 and 4 processes along both axes
NON_TENSOR = {"step": 7, "lr": 0.25, "name": "llama", "milestones": [10, 20, 30]}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(*cmd, expect=0):
    r = subprocess.run(list(cmd), capture_output=True, text=True)
    if r.returncode != expect:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {r.returncode}, not {expect}:\n{r.stdout}\n"
                 f"{r.stderr}")
    return r.stdout


def tool_run(tool, *args):
    """The C++ helper, asked for every dtype this torch has."""
    return run(tool, *DCP_FLAG, *args)


def distribute(full, mesh, placements):
    """A DTensor of `full` made from this rank's piece alone: no collective (gloo cannot scatter
    int16 or bool). Pieces as DTensor cuts them (torch.chunk per mesh dimension)."""
    local = full
    coord = mesh.get_coordinate()
    for mesh_dim, p in enumerate(placements):
        if isinstance(p, Shard):
            local = torch.chunk(local, mesh.size(mesh_dim), dim=p.dim)
            local = local[coord[mesh_dim]] if coord[mesh_dim] < len(local) else \
                full.narrow(p.dim, 0, 0)
    return DTensor.from_local(local.contiguous(), mesh, placements, run_check=False,
                              shape=full.shape, stride=full.stride())


def state(mesh, placements, with_bytes_io=True):
    sd = {"t_" + n: pattern(n, R * C).reshape(R, C) for n in TYPES}
    if mesh is not None:
        sd = {k: distribute(v, mesh, placements) for k, v in sd.items()}
    sd.update(NON_TENSOR)
    if with_bytes_io:
        sd["blob"] = io.BytesIO(b"cairn reads what torch pickles")
    return sd


def layouts(world):
    """(name, mesh shape, placements, async) of the checkpoints `world` processes write."""
    if world == 2:
        return [("p2_shard0", (2,), [Shard(0)], False), ("p2_replicate", (2,), [Replicate()], False),
                ("p2_shard1_async", (2,), [Shard(1)], True)]
    if world == 3:
        return [("p3_shard0", (3,), [Shard(0)], False), ("p3_shard1", (3,), [Shard(1)], False)]
    return [("p4_shard0", (4,), [Shard(0)], False),
            ("p4_mesh_s0_s1", (2, 2), [Shard(0), Shard(1)], False),
            ("p4_mesh_rep_s0", (2, 2), [Replicate(), Shard(0)], False)]


def save_worker(rank, world, port, work):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        for name, shape, placements, use_async in layouts(world):
            mesh = init_device_mesh("cpu", shape)
            sd = state(mesh, placements)
            path = os.path.join(work, name)
            if use_async:
                f = dcp.async_save(sd, checkpoint_id=path)
                (f.result() if hasattr(f, "result") else f.staging_completion.result())
            else:
                dcp.save(sd, checkpoint_id=path)
            dist.barrier()
    finally:
        dist.destroy_process_group()


def case_dtensor_to_cairn(tool, cli, work):
    dcp.save(state(None, None), checkpoint_id=os.path.join(work, "p1_plain"))
    for world in (2, 3, 4):
        mp.spawn(save_worker, args=(world, free_port(), work), nprocs=world, join=True)
    names = ["p1_plain"] + [n for w in (2, 3, 4) for n, *_ in layouts(w)]
    for name in names:
        path = os.path.join(work, name)
        for ranks, axis in ((1, 0), (2, 0), (3, 0), (2, 1), (3, 1)):
            tool_run(tool, "load-dcp-layout", path, str(R), str(C), str(ranks), str(axis))
        run(cli, "verify", path)
        shown = run(cli, "inspect", path)
        for absent in ("format version", "checksum blocks", "save id"):  # native fields only
            if absent in shown:
                sys.exit(f"FAIL: cairn inspect {name} shows '{absent}' for a DCP checkpoint")
        for key in list(NON_TENSOR) + ["blob"]:
            if key not in shown:
                sys.exit(f"FAIL: cairn inspect {name} does not list the non-tensor item {key}:\n"
                         f"{shown}")
    # torch's offline converter from a torch.save file
    from torch.distributed.checkpoint.format_utils import torch_save_to_dcp
    pt, from_pt = os.path.join(work, "state.pt"), os.path.join(work, "from_torch_save")
    torch.save({k: v for k, v in state(None, None).items() if k.startswith("t_")}, pt)
    torch_save_to_dcp(pt, from_pt)
    tool_run(tool, "load-dcp-layout", from_pt, str(R), str(C), "2", "1")
    # the same state in two layouts is the same to `cairn diff`, and a changed one is not
    run(cli, "diff", os.path.join(work, "p1_plain"), os.path.join(work, "p4_mesh_s0_s1"))
    run(cli, "diff", os.path.join(work, "p3_shard1"), from_pt)
    changed = os.path.join(work, "changed")
    sd = state(None, None, with_bytes_io=False)
    sd["t_f32"][6, 4] += 1
    dcp.save(sd, checkpoint_id=changed)
    shown = run(cli, "diff", os.path.join(work, "p2_shard1_async"), changed, expect=1)
    if "t_f32" not in shown or "1 of 35 elements differ" not in shown:
        sys.exit(f"FAIL: cairn diff does not show the one changed element:\n{shown}")
    print(f"cairn loaded {len(names) + 1} checkpoints torch {torch.__version__} saved "
          f"({', '.join(names)}, torch_save_to_dcp) on 1-3 ranks by rows and columns: {len(TYPES)} "
          "dtypes element-exact; verify, inspect and diff ok")


def expected_local(name, rows, cols, world, rank, dim):
    full = pattern(name, rows * cols).reshape(rows, cols)
    return torch.chunk(full, world, dim=dim)[rank] if dim is not None else full


def load_worker(rank, world, port, path, rows, cols, result_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    bad = []
    try:
        mesh = init_device_mesh("cpu", (world,))
        for dim in (0, 1):
            sd = {"t_" + n: distribute(torch.zeros(rows, cols, dtype=TYPES[n]), mesh, [Shard(dim)])
                  for n in TYPES}
            dcp.load(sd, checkpoint_id=path)
            for n in TYPES:
                got = sd["t_" + n].to_local()
                want = expected_local(n, rows, cols, world, rank, dim)
                if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape) or \
                        raw(got) != raw(want):
                    bad.append(f"t_{n} Shard({dim}) rank {rank}/{world}")
    finally:
        dist.destroy_process_group()
    with open(os.path.join(result_dir, f"{world}.{rank}"), "w") as f:
        f.write("\n".join(bad))


def load_everywhere(path, rows, cols, work, content_metadata=None):
    sd = {"t_" + n: torch.zeros(rows, cols, dtype=TYPES[n]) for n in TYPES}
    dcp.load(sd, checkpoint_id=path)
    for n in TYPES:
        if raw(sd["t_" + n]) != raw(expected_local(n, rows, cols, 1, 0, None)):
            sys.exit(f"FAIL {path}: plain t_{n} differs")
    results = os.path.join(work, "results")
    shutil.rmtree(results, ignore_errors=True)
    os.makedirs(results)
    for world in (2, 3):
        mp.spawn(load_worker, args=(world, free_port(), path, rows, cols, results), nprocs=world,
                 join=True)
    bad = [line for f in sorted(os.listdir(results))
           for line in open(os.path.join(results, f)).read().splitlines() if line]
    if bad:
        sys.exit(f"FAIL {path}: DTensor pieces differ: {bad}")
    common = torch.load(os.path.join(path, "common.pt"), weights_only=True)
    # Megatron's load_content_metadata(path) is common.get("content_metadata").
    assert common.pop("content_metadata", None) == content_metadata, common
    assert common == {"step": 12}, common
    assert json.load(open(os.path.join(path, "metadata.json")))["sharded_backend"] == "torch_dist"


def case_cairn_to_dtensor(tool, cli, work):
    saved, native, converted = (os.path.join(work, d) for d in ("saved", "native", "converted"))
    tool_run(tool, "save-strategy", "torch_dist", saved)
    tool_run(tool, "write-multirank", native)
    tool_run(tool, "convert-dcp", native, converted)
    for path in (saved, converted):
        # cairn_interop saves with content_metadata; convert-dcp's native source has none.
        load_everywhere(path, 8, 6, work,
                        {"source": "cairn interop", "tp": "4"} if path == saved else None)
        # torch's offline consolidation into one torch.save file
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
        pt = os.path.join(work, os.path.basename(path) + ".pt")
        dcp_to_torch_save(path, pt)
        whole = torch.load(pt, weights_only=True)
        for n in TYPES:
            if raw(whole["t_" + n]) != raw(expected_local(n, 8, 6, 1, 0, None)):
                sys.exit(f"FAIL {path}: dcp_to_torch_save's t_{n} differs")
    print(f"torch {torch.__version__} loaded cairn::save(torch_dist) from 4 ranks and cairn convert "
          f"into plain tensors and DTensors Shard(0)/Shard(1) on 2 and 3 processes: {len(TYPES)} "
          "dtypes element-exact; common.pt with weights_only=True; dcp_to_torch_save ok")


# torch 2.14's consolidation sizes elements with torch.finfo, which refuses integer and bool
# dtypes (TypeError): consolidated checkpoints hold the floating ones.
FLOATING = ["f32", "f16", "bf16", "f64", "f8_e4m3", "f8_e5m2"]


def hf_layouts(world):
    """(name, placements, dtype names, consolidate) of the checkpoints `world` processes write
    through torch's HuggingFaceStorageWriter(save_distributed=True)."""
    if world == 2:
        return [("hf_p2_shard0", [Shard(0)], list(TYPES), False),
                ("hf_p2_shard1_consolidated", [Shard(1)], FLOATING, True)]
    return [("hf_p3_shard1", [Shard(1)], list(TYPES), False),
            ("hf_p3_replicate", [Replicate()], list(TYPES), False)]


def hf_save_worker(rank, world, port, work):
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        for name, placements, names, consolidate in hf_layouts(world):
            sd = {"t_" + n: distribute(pattern(n, R * C).reshape(R, C), mesh, placements)
                  for n in names}
            mapping = {k: 1 + i % 2 for i, k in enumerate(sorted(sd))}  # two output files
            dcp.save(sd, storage_writer=HuggingFaceStorageWriter(
                path=os.path.join(work, name), save_distributed=True,
                enable_consolidation=consolidate, fqn_to_index_mapping=mapping))
            dist.barrier()
    finally:
        dist.destroy_process_group()


def case_hf_storage(tool, cli, work):
    from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
    plain = {k: v for k, v in state(None, None).items() if k.startswith("t_")}
    dcp.save(plain, storage_writer=HuggingFaceStorageWriter(path=os.path.join(work, "hf_p1")))
    for world in (2, 3):
        mp.spawn(hf_save_worker, args=(world, free_port(), work), nprocs=world, join=True)
    checked = [("hf_p1", list(TYPES))]
    for world in (2, 3):
        for name, _, names, consolidate in hf_layouts(world):
            checked.append((name, names))
            if consolidate:
                checked.append((os.path.join(name, "sharded"), names))
    for name, names in checked:
        path = os.path.join(work, name)
        for ranks, axis in ((1, 0), (2, 0), (3, 1)):
            tool_run(tool, "load-dcp-layout", path, str(R), str(C), str(ranks), str(axis),
                     ",".join(names))
        run(cli, "verify", path)
        shown = run(cli, "inspect", path)
        if "safetensors" not in shown or f"t_{names[0]}" not in shown:
            sys.exit(f"FAIL: cairn inspect {name}:\n{shown}")
    work_of = lambda name: os.path.join(work, name)  # noqa: E731
    run(cli, "diff", work_of("hf_p1"), work_of("hf_p2_shard0"))
    run(cli, "diff", work_of("hf_p3_shard1"), work_of("hf_p3_replicate"))
    shown = run(cli, "diff", work_of("hf_p1"), work_of("hf_p2_shard1_consolidated"), expect=1)
    if "t_i64" not in shown:
        sys.exit(f"FAIL: cairn diff does not show the tensors consolidation dropped:\n{shown}")

    # torch reads cairn's sharded safetensors (an index and its files) and one file
    native, out = work_of("native"), work_of("unsharded")
    tool_run(tool, "write-multirank", native)
    tool_run(tool, "unshard", native, out)
    for path in (out, os.path.join(out, "chunks")):
        sd = {"t_" + n: torch.zeros(8, 6, dtype=TYPES[n]) for n in TYPES}
        dcp.load(sd, storage_reader=HuggingFaceStorageReader(path=path))
        for n in TYPES:
            if raw(sd["t_" + n]) != raw(pattern(n, 48).reshape(8, 6)):
                sys.exit(f"FAIL {path}: HuggingFaceStorageReader's t_{n} differs")
    print(f"cairn loaded {len(checked)} checkpoints of torch {torch.__version__}'s "
          f"HuggingFaceStorageWriter ({', '.join(n for n, _ in checked)}) on 1-3 ranks: "
          f"{len(TYPES)} dtypes element-exact (consolidated: {len(FLOATING)} floating); verify, "
          "inspect and diff ok; HuggingFaceStorageReader read cairn unshard's one file and chunks")


def main():
    case, tool, cli, work = sys.argv[1:5]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    globals()["case_" + case](tool, cli, work)
    print(f"PASS {case}")


if __name__ == "__main__":
    main()

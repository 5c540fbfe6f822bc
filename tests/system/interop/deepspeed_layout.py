#!/usr/bin/env python3
"""DeepSpeed ZeRO checkpoint fixtures, written by real torch.save in DeepSpeed's on-disk layout.

    deepspeed_layout.py OUT_DIR [--cpu-tags]

DeepSpeed is not needed (nor used): the layout was read from DeepSpeed 0.16.5 (commit
38327e07f6cd39b63418f60cedd1651b0be3e7c3) and is described in docs/torch-formats.md. This
script is an independent re-implementation of what DeepSpeedEngine.save_checkpoint() writes; no
DeepSpeed code is copied.

Writes OUT_DIR/{zero1_w2, zero2_w3, zero3_w2, zero3_w3} (ZeRO stage, data-parallel world size),
each a DeepSpeed checkpoint directory:

    latest                      the tag, "global_step7" (no newline, as DeepSpeed writes it)
    zero_to_fp32.py             a placeholder (DeepSpeed copies its recovery script here)
    global_step7/               model-states file(s) and one optimizer-states file per dp rank
    expected_fp32.pt            what deepspeed.utils.zero_to_fp32 would produce (computed from the
                                master values, not by reading the files back)
    expected.json               stage, world size, tag, steps, params, and where every parameter's
                                fp32 values live (rank file, tensor, element offset, count)

zero1_w2 and zero3_w2 use fp16 (DynamicLossScaler, file prefix zero_pp_rank_), zero2_w3 and
zero3_w3 use bf16 (LossScaler, file prefix bf16_zero_pp_rank_). zero3_w3 uses sub_group_size=10
so a parameter group splits into several fp32 flat groups.

DeepSpeed classes that DeepSpeed pickles into these files (ZeroStageEnum, LossScaler,
DynamicLossScaler, fragment_address) are replaced by stand-ins defined here that carry the real
module paths (deepspeed.runtime.zero.config.ZeroStageEnum, ...), so the pickles name exactly the
globals a real checkpoint names. To torch.load a fixture in Python without DeepSpeed, call
install_deepspeed_stubs() first and pass weights_only=False and map_location="cpu".

Storages are tagged with the device DeepSpeed would have had them on ("cuda:<rank>"; "cpu" for
the .cpu() frozen fragments and torch Adam's step counters), so torch.load needs
map_location="cpu" on a machine without CUDA, as with real checkpoints. --cpu-tags writes plain
"cpu" locations instead.

After writing, the script reads every checkpoint back with its own zero_to_fp32-style reader and
compares against expected_fp32.pt and the locations in expected.json; it exits 1 on mismatch.
Works with torch 1.13 and 2.x; needs only torch and the standard library.
"""
import argparse
import collections
import dataclasses
import enum
import glob
import inspect
import json
import math
import os
import re
import sys
import types

import torch

DS_VERSION = "0.16.5"
GLOBAL_STEPS = 7
TAG = f"global_step{GLOBAL_STEPS}"
MICRO_BATCH = 4
SENTINEL = -9999.0  # stands for the uninitialised padding of ZeRO-3 partitions
FIXTURES = [  # name, stage, dp world size, dtype, stage-3 sub_group_size
    ("zero1_w2", 1, 2, torch.float16, None),
    ("zero2_w3", 2, 3, torch.bfloat16, None),
    ("zero3_w2", 3, 2, torch.float16, None),
    ("zero3_w3", 3, 3, torch.bfloat16, 10),
]
PERSISTENCE_THRESHOLD = 10  # stage3_param_persistence_threshold used in the stage-3 fixtures

# ----------------------------------------------------------------------------------------------
# Stand-ins for the DeepSpeed classes that appear in the pickles, under DeepSpeed's module paths.


class ZeroStageEnum(int, enum.Enum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


class LossScalerBase:
    def __init__(self, cur_scale):
        self.cur_scale = cur_scale
        self.dynamic = False


class LossScaler(LossScalerBase):
    def __init__(self, scale=1):
        super().__init__(scale)


class DynamicLossScaler(LossScalerBase):
    def __init__(self, init_scale=2**32, scale_factor=2., scale_window=1000, min_scale=1,
                 delayed_shift=1, consecutive_hysteresis=False, raise_error_at_min_scale=True,
                 dtype=torch.half):
        super().__init__(init_scale)
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self.min_scale = min_scale
        self.delayed_shift = delayed_shift
        self.cur_hysteresis = delayed_shift
        self.consecutive_hysteresis = consecutive_hysteresis
        self.raise_error_at_min_scale = raise_error_at_min_scale
        self.dynamic = True
        self.dtype = dtype


@dataclasses.dataclass
class fragment_address:  # noqa: N801 (DeepSpeed's name)
    numel: int
    start: int


_STUBS = {
    "deepspeed.runtime.zero.config": [ZeroStageEnum],
    "deepspeed.runtime.fp16.loss_scaler": [LossScalerBase, LossScaler, DynamicLossScaler],
    "deepspeed.utils.tensor_fragment": [fragment_address],
}


def install_deepspeed_stubs():
    """Registers the stand-ins as deepspeed.* modules so pickle writes and reads DeepSpeed's
    global names. Refuses if a real deepspeed is already imported."""
    real = sys.modules.get("deepspeed")
    if real is not None and not getattr(real, "_cairn_stub", False):
        raise RuntimeError("a real deepspeed is imported; its classes would be shadowed")
    for modname, classes in _STUBS.items():
        parts = modname.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name not in sys.modules:
                m = types.ModuleType(name)
                m._cairn_stub = True
                m.__path__ = []
                sys.modules[name] = m
                if i > 1:
                    setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], m)
        for cls in classes:
            cls.__module__ = modname
            setattr(sys.modules[modname], cls.__name__, cls)


install_deepspeed_stubs()

# ----------------------------------------------------------------------------------------------
# Storage location tags: real DeepSpeed checkpoints are saved from GPU tensors.

_TAGS = {"on": False, "default": "cpu", "cpu_ptrs": set()}


def _tagger(storage):
    try:
        if not _TAGS["on"] or storage.device.type != "cpu":
            return None
        ptr = storage.data_ptr()
    except Exception:  # an unexpected storage type: let torch tag it
        return None
    if ptr != 0 and ptr in _TAGS["cpu_ptrs"]:
        return "cpu"
    return _TAGS["default"]


def _never_deserialize(storage, location):
    return None


try:  # priority 0 runs before torch's own cpu (10) and cuda (20) taggers
    torch.serialization.register_package(0, _tagger, _never_deserialize)
    _TAGGER_OK = True
except Exception as e:  # pragma: no cover (a torch that refuses it: fall back to cpu tags)
    print(f"warning: cannot register a storage tagger ({e}); writing 'cpu' locations",
          file=sys.stderr)
    _TAGGER_OK = False


def save(obj, path, device_tag, cpu_tensors=()):
    """torch.save with every storage tagged device_tag except those of cpu_tensors."""
    _TAGS.update(on=_TAGGER_OK and device_tag != "cpu", default=device_tag,
                 cpu_ptrs={t.data_ptr() for t in cpu_tensors})
    try:
        torch.save(obj, path)
    finally:
        _TAGS.update(on=False, default="cpu", cpu_ptrs=set())


def load(path):
    kw = {"map_location": "cpu"}
    if "weights_only" in inspect.signature(torch.load).parameters:
        kw["weights_only"] = False
    return torch.load(path, **kw)

# ----------------------------------------------------------------------------------------------
# The model: a 2-D weight whose numel (35) no world size divides, 1-D biases, a 3-D conv weight,
# a frozen weight, a weight tied to another (head.weight is embed.weight), a float and an int
# buffer, and a non-persistent buffer.


class Norm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(5))
        self.bias = torch.nn.Parameter(torch.zeros(5))
        self.register_buffer("running_mean", torch.zeros(5))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(3, 4)                          # weight (4, 3), bias (4,)
        self.conv = torch.nn.Conv1d(3, 2, 3, bias=False)           # weight (2, 3, 3)
        self.norm = Norm()
        self.scale = torch.nn.Parameter(torch.ones(2))             # (2,)
        self.register_buffer("scratch", torch.zeros(3), persistent=False)


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(7, 5)                      # weight (7, 5): 35 elements
        self.block = Block()
        self.frozen = torch.nn.Linear(1, 5, bias=False)            # weight (5, 1), frozen
        self.frozen.weight.requires_grad_(False)
        self.head = torch.nn.Linear(5, 7, bias=False)
        self.head.weight = self.embed.weight                       # tied


# Optimizer parameter groups, in the order the user passes them (not named_parameters order).
GROUPS = [
    ["block.conv.weight", "embed.weight", "block.proj.weight"],    # weight decay 0.01
    ["block.proj.bias", "block.norm.weight", "block.norm.bias"],   # weight decay 0
    ["block.scale"],                                               # lr x 0.1
]
GROUP_HPARAMS = [dict(weight_decay=0.01), dict(weight_decay=0.0), dict(lr=1e-4, weight_decay=0.0)]
FROZEN = ["frozen.weight"]
SHARED = collections.OrderedDict([("head.weight", "embed.weight")])


def master_values(model):
    """Distinct fp32 values per element (not exactly representable in fp16/bf16), per parameter
    in named_parameters order."""
    out = collections.OrderedDict()
    for k, (name, p) in enumerate(model.named_parameters()):
        i = torch.arange(p.numel(), dtype=torch.float64)
        v = ((k + 1) + i / 128 + 1 / 3) * torch.where(i % 2 == 0, 1.0, -1.0)
        out[name] = v.to(torch.float32).view(p.shape)
    return out


def buffer_values(dtype):
    return collections.OrderedDict([
        ("block.norm.running_mean", (torch.arange(5, dtype=torch.float32) * 0.3 - 0.55).to(dtype)),
        ("block.norm.num_batches_tracked", torch.tensor(GLOBAL_STEPS, dtype=torch.long)),
    ])


def ds_config(stage, world, dtype, sub_group_size):
    zero = {"stage": stage}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = PERSISTENCE_THRESHOLD
        if sub_group_size is not None:
            zero["sub_group_size"] = sub_group_size
    cfg = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": 1,
        "train_batch_size": MICRO_BATCH * world,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
        "zero_optimization": zero,
        "gradient_clipping": 1.0,
    }
    if dtype == torch.float16:
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    else:
        cfg["bf16"] = {"enabled": True}
    return cfg


def loss_scaler_for(dtype):
    if dtype == torch.float16:  # dynamic scaling, one overflow at the start (step skipped)
        s = DynamicLossScaler(init_scale=2**16, scale_window=1000, min_scale=1, delayed_shift=2,
                              consecutive_hysteresis=False, dtype=torch.float16)
        s.cur_scale = 32768.0
        s.cur_iter = GLOBAL_STEPS + 1
        s.last_overflow_iter = 0
        s.cur_hysteresis = 1
        return s, True, 1
    return LossScaler(scale=1.0), False, 0


def base_optimizer_state(flat_params, group_of_param):
    """A real torch optimizer state_dict for the flat fp32 tensors (as ZeRO's wrapped optimizer
    holds them): one AdamW step with fixed gradients. CPU 'step' tensors are returned too."""
    tensors = [torch.zeros(t.numel(), dtype=torch.float32, requires_grad=True) for t in flat_params]
    groups = []
    for g, hp in enumerate(GROUP_HPARAMS):
        ps = [t for t, gi in zip(tensors, group_of_param) if gi == g]
        groups.append(dict(params=ps, **hp))
    opt = torch.optim.AdamW(groups, lr=1e-3)
    for j, t in enumerate(tensors):
        t.grad = torch.linspace(-1, 1, t.numel()) * (j + 1) if t.numel() else torch.zeros(0)
    opt.step()
    sd = opt.state_dict()
    steps = [s["step"] for s in sd["state"].values() if torch.is_tensor(s.get("step"))]
    return sd, steps

# ----------------------------------------------------------------------------------------------
# Writing


def model_states_dict(module_sd, param_shapes, frozen_shapes, frozen_frags, shared, cfg, world,
                      skipped):
    # keys and order as DeepSpeedEngine._save_checkpoint builds them
    return dict(module=module_sd,
                buffer_names=list(buffer_values(torch.float32).keys()),
                optimizer=None,
                param_shapes=param_shapes,
                frozen_param_shapes=frozen_shapes,
                shared_params=shared,
                frozen_param_fragments=frozen_frags,
                lr_scheduler=None,
                data_sampler=None,
                random_ltd=None,
                sparse_tensor_module_names=set(),
                skipped_steps=skipped,
                global_steps=GLOBAL_STEPS,
                global_samples=GLOBAL_STEPS * MICRO_BATCH * world,
                dp_world_size=world,
                mp_world_size=1,
                ds_config=cfg,
                ds_version=DS_VERSION)


def zero_prefix(dtype):
    return "bf16_zero_pp_rank_" if dtype == torch.bfloat16 else "zero_pp_rank_"


def write_stage12(ckdir, stage, world, dtype, cfg, master, cpu_tags):
    """Returns (locations, files)."""
    model = Tiny()
    model.to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.data = master[name].to(dtype)
        for name, b in buffer_values(dtype).items():
            model.get_buffer(name).copy_(b)
    params = dict(model.named_parameters())
    align = 2 * world  # nccl_start_alignment_factor (2) * dp world size
    flats_lp, flats_fp32, part_sizes, group_numels = [], [], [], []
    for names in GROUPS:
        n = sum(params[x].numel() for x in names)
        total = align * math.ceil(n / align)
        lp = torch.zeros(total, dtype=dtype)
        hp = torch.zeros(total, dtype=torch.float32)
        off = 0
        for x in names:
            k = params[x].numel()
            lp[off:off + k] = master[x].reshape(-1).to(dtype)
            hp[off:off + k] = master[x].reshape(-1)
            off += k
        # the model's 16-bit params become views into the flat buffer
        off = 0
        for x in names:
            k = params[x].numel()
            params[x].data = lp.narrow(0, off, k).view(params[x].shape)
            off += k
        flats_lp.append(lp)
        flats_fp32.append(hp)
        part_sizes.append(total // world)
        group_numels.append(n)
    module_sd = model.state_dict()

    tagof = (lambda r: "cpu") if cpu_tags else (lambda r: f"cuda:{r}")
    scaler, dynamic, skipped = loss_scaler_for(dtype)
    param_shapes = [collections.OrderedDict((x, params[x].shape) for x in names) for names in GROUPS]
    if stage >= 2:
        frozen_shapes = collections.OrderedDict((x, params[x].shape) for x in FROZEN)
        frozen_frags = collections.OrderedDict((x, params[x].detach().clone()) for x in FROZEN)
    else:
        frozen_shapes = frozen_frags = None
    files = {"model_states": ["mp_rank_00_model_states.pt"], "optim_states": []}
    save(model_states_dict(module_sd, param_shapes, frozen_shapes, frozen_frags, dict(SHARED), cfg,
                           world, skipped),
         os.path.join(ckdir, files["model_states"][0]), tagof(0),
         cpu_tensors=list(frozen_frags.values()) if frozen_frags else [])

    for r in range(world):
        parts, paddings, mappings = [], [], []
        for g, names in enumerate(GROUPS):
            P = part_sizes[g]
            part = flats_fp32[g][r * P:(r + 1) * P].clone()
            left = r * P
            n = group_numels[g]
            pad = P if n <= left else (left + P - n if n < left + P else 0)
            paddings.append(pad)
            parts.append(part)
            m = collections.OrderedDict()
            off = 0
            for x in names:
                k = params[x].numel()
                s, e = max(off, left), min(off + k, left + P)
                if off < left + P and off + k > left:
                    m[x] = fragment_address(numel=e - s, start=s - left)
                off += k
            mappings.append(m)
        base, steps = base_optimizer_state(parts, list(range(len(GROUPS))))
        osd = {
            "loss_scaler": scaler,
            "dynamic_loss_scale": dynamic,
            "overflow": False,
            "clip_grad": 1.0,
            "base_optimizer_state": base,
            # lean views: the storage still holds the padded partition
            "single_partition_of_fp32_groups": [p[:p.numel() - pad] for p, pad in zip(parts, paddings)],
            "zero_stage": ZeroStageEnum.gradients if stage == 2 else ZeroStageEnum.optimizer_states,
            "group_paddings": paddings,
            "partition_count": [world] * len(GROUPS),
            "ds_version": DS_VERSION,
            "param_slice_mappings": mappings,
        }
        fname = f"{zero_prefix(dtype)}{r}_mp_rank_00_optim_states.pt"
        files["optim_states"].append(fname)
        save(dict(optimizer_state_dict=osd, ds_config=cfg, ds_version=DS_VERSION),
             os.path.join(ckdir, fname), tagof(r), cpu_tensors=steps)

    # where every parameter's fp32 values are (computed from the layout, checked on read-back)
    locations = collections.OrderedDict()
    for g, names in enumerate(GROUPS):
        P = part_sizes[g]
        off = 0
        for x in names:
            k = params[x].numel()
            frags = []
            for r in range(world):
                s, e = max(off, r * P), min(off + k, (r + 1) * P)
                if s < e:
                    frags.append(dict(rank=r, file=files["optim_states"][r],
                                      key="single_partition_of_fp32_groups", index=g,
                                      offset=s - r * P, numel=e - s, param_offset=s - off))
            locations[x] = frags
            off += k
    layout = dict(align=align, groups=[dict(params=names, numel=group_numels[g],
                                            padded_numel=part_sizes[g] * world,
                                            partition_numel=part_sizes[g])
                                       for g, names in enumerate(GROUPS)])
    return locations, files, layout


def stage3_subgroups(world, sub_group_size):
    """Splits each parameter group into sub-groups by per-rank partition numel (as
    DeepSpeedZeroOptimizer_Stage3._create_fp16_sub_groups does)."""
    model = Tiny()
    params = dict(model.named_parameters())
    pn = {x: math.ceil(params[x].numel() / world) for x in params}
    subs, sub_group_of = [], []
    for g, names in enumerate(GROUPS):
        total = sum(pn[x] for x in names)
        if sub_group_size is None or sub_group_size >= total:
            subs.append(list(names))
            sub_group_of.append(g)
            continue
        cur, acc = [], 0
        for x in names:
            cur.append(x)
            acc += pn[x]
            if acc >= sub_group_size or x == names[-1]:
                subs.append(cur)
                sub_group_of.append(g)
                cur, acc = [], 0
    return subs, sub_group_of


def part3(t, world, r, fill):
    """Rank r's stage-3 partition of flat tensor t: ceil(numel/world) elements, tail padded."""
    ps = math.ceil(t.numel() / world)
    out = torch.full((ps,), fill, dtype=t.dtype)
    s, e = r * ps, min((r + 1) * ps, t.numel())
    if s < e:
        out[:e - s] = t[s:e]
    return out


def write_stage3(ckdir, world, dtype, cfg, master, sub_group_size, cpu_tags):
    model = Tiny()
    model.to(dtype)
    with torch.no_grad():
        for name, b in buffer_values(dtype).items():
            model.get_buffer(name).copy_(b)
        # partitioned params keep an empty placeholder; small ("persistent") ones stay whole
        for name, p in model.named_parameters():
            if p.numel() <= PERSISTENCE_THRESHOLD:
                p.data = master[name].to(dtype)
            else:
                p.data = torch.empty(0, dtype=dtype)
    shapes = {name: master[name].shape for name in master}
    module_sd = model.state_dict()
    subs, sub_group_of = stage3_subgroups(world, sub_group_size)
    param_shapes = [collections.OrderedDict((x, shapes[x]) for x in sub) for sub in subs]
    frozen_shapes = collections.OrderedDict((x, shapes[x]) for x in FROZEN)
    tagof = (lambda r: "cpu") if cpu_tags else (lambda r: f"cuda:{r}")
    scaler, dynamic, skipped = loss_scaler_for(dtype)
    lp_fill = torch.tensor(SENTINEL).to(dtype).item()
    files = {"model_states": [], "optim_states": []}
    for r in range(world):
        frags = collections.OrderedDict(
            (x, part3(master[x].reshape(-1).to(dtype), world, r, lp_fill)) for x in FROZEN)
        shared = dict(SHARED) if r == 0 else {}  # only global rank 0 fills shared_params
        fname = f"zero_pp_rank_{r}_mp_rank_00_model_states.pt"
        files["model_states"].append(fname)
        save(model_states_dict(module_sd, param_shapes, frozen_shapes, frags, shared, cfg, world,
                               skipped),
             os.path.join(ckdir, fname), tagof(r), cpu_tensors=list(frags.values()))

        flats = [torch.cat([part3(master[x].reshape(-1), world, r, SENTINEL) for x in sub])
                 for sub in subs]
        base, steps = base_optimizer_state(flats, sub_group_of)
        osd = {
            "zero_stage": ZeroStageEnum.weights,
            "loss_scaler": scaler,
            "dynamic_loss_scale": dynamic,
            "overflow": False,
            "partition_count": world,
            "optimizer_state_dict": base,
            "fp32_flat_groups": flats,
        }
        fname = f"{zero_prefix(dtype)}{r}_mp_rank_00_optim_states.pt"
        files["optim_states"].append(fname)
        save(dict(optimizer_state_dict=osd, ds_config=cfg, ds_version=DS_VERSION),
             os.path.join(ckdir, fname), tagof(r), cpu_tensors=steps)

    locations = collections.OrderedDict()
    for i, sub in enumerate(subs):
        off = 0
        for x in sub:
            n = shapes[x].numel()
            ps = math.ceil(n / world)
            frags = []
            for r in range(world):
                k = min(ps, n - r * ps)
                if k > 0:
                    frags.append(dict(rank=r, file=files["optim_states"][r], key="fp32_flat_groups",
                                      index=i, offset=off, numel=k, param_offset=r * ps))
            locations[x] = frags
            off += ps
    layout = dict(sub_groups=[dict(params=sub, param_group=sub_group_of[i],
                                   partition_numel=sum(math.ceil(shapes[x].numel() / world)
                                                       for x in sub))
                              for i, sub in enumerate(subs)])
    return locations, files, layout


def expected_state_dict(stage, dtype, master):
    """What zero_to_fp32 returns: buffers (as float), frozen params (stage >= 2, left in their
    16-bit dtype), trainable params in fp32 in param_shapes order, then shared names."""
    sd = collections.OrderedDict()
    for name, b in buffer_values(dtype).items():
        sd[name] = b.float()
    if stage >= 2:
        for x in FROZEN:
            sd[x] = master[x].to(dtype)
    for names in GROUPS:
        for x in names:
            sd[x] = master[x].clone()
    for alias, target in SHARED.items():
        if target in sd:
            sd[alias] = sd[target]
    return sd


def write_fixture(out, name, stage, world, dtype, sub_group_size, cpu_tags):
    root = os.path.join(out, name)
    ckdir = os.path.join(root, TAG)
    os.makedirs(ckdir, exist_ok=True)
    for f in glob.glob(os.path.join(ckdir, "*.pt")):
        os.remove(f)
    master = master_values(Tiny())
    cfg = ds_config(stage, world, dtype, sub_group_size)
    if stage <= 2:
        locations, files, layout = write_stage12(ckdir, stage, world, dtype, cfg, master, cpu_tags)
    else:
        locations, files, layout = write_stage3(ckdir, world, dtype, cfg, master, sub_group_size,
                                                cpu_tags)
    with open(os.path.join(root, "latest"), "w") as fd:
        fd.write(TAG)
    with open(os.path.join(root, "zero_to_fp32.py"), "w") as fd:
        fd.write("# placeholder: DeepSpeed copies deepspeed/utils/zero_to_fp32.py here\n")
    exp = expected_state_dict(stage, dtype, master)
    torch.save(exp, os.path.join(root, "expected_fp32.pt"))
    trainable = [x for names in GROUPS for x in names]
    meta = dict(
        stage=stage, dp_world_size=world, mp_world_size=1, tag=TAG, global_steps=GLOBAL_STEPS,
        ds_version=DS_VERSION, dtype=str(dtype).replace("torch.", ""),
        device_tags="cpu" if cpu_tags or not _TAGGER_OK else "cuda:<rank>",
        model_states_files=[f"{TAG}/{f}" for f in files["model_states"]],
        optim_states_files=[f"{TAG}/{f}" for f in files["optim_states"]],
        params=[dict(name=x, shape=list(master[x].shape), numel=master[x].numel(),
                     group=next(g for g, ns in enumerate(GROUPS) if x in ns), trainable=True)
                for x in trainable]
        + [dict(name=x, shape=list(master[x].shape), numel=master[x].numel(), group=None,
                trainable=False) for x in FROZEN],
        buffers=[dict(name=k, shape=list(v.shape), dtype=str(v.dtype).replace("torch.", ""))
                 for k, v in buffer_values(dtype).items()],
        shared_params=dict(SHARED),
        expected_fp32=[dict(name=k, shape=list(v.shape), dtype=str(v.dtype).replace("torch.", ""))
                       for k, v in exp.items()],
        layout=layout,
        fp32_locations=locations,
        stage3_padding_sentinel=SENTINEL if stage == 3 else None,
    )
    with open(os.path.join(root, "expected.json"), "w") as fd:
        json.dump(meta, fd, indent=1)
        fd.write("\n")

# ----------------------------------------------------------------------------------------------
# Independent reader, following zero_to_fp32's rules (reads only the written checkpoint)


def natural_key(s):
    return [int(c) if c.isdigit() else c for c in re.split(r"(\d+)", s)]


def reassemble(ckpt_root):
    with open(os.path.join(ckpt_root, "latest")) as fd:
        tag = fd.read().strip()
    d = os.path.join(ckpt_root, tag)
    optim = sorted(glob.glob(os.path.join(d, "*_optim_states.pt")), key=natural_key)
    osds = [load(f)["optimizer_state_dict"] for f in optim]
    stage = int(osds[0]["zero_stage"])
    world = osds[0]["partition_count"]
    world = max(world) if isinstance(world, list) else world
    if world != len(optim):
        raise ValueError(f"{len(optim)} optimizer files, partition_count {world}")
    model_file = "mp_rank_00_model_states.pt" if stage <= 2 else \
        "zero_pp_rank_0_mp_rank_00_model_states.pt"
    model_files = sorted(glob.glob(os.path.join(d, "*_model_states.pt")), key=natural_key)
    ms = [load(f) for f in model_files]
    assert os.path.basename(model_files[0]) == model_file, model_files
    m0 = ms[0]
    sd = collections.OrderedDict()
    for k, v in m0["module"].items():
        if k in m0["buffer_names"]:
            sd[k] = v.float()
    frozen = m0.get("frozen_param_shapes") or {}
    if stage <= 2:
        for x in frozen:
            sd[x] = m0["frozen_param_fragments"][x]
        align = 2 * world
        for shapes, g in zip(m0["param_shapes"], range(len(m0["param_shapes"]))):
            full = torch.cat([o["single_partition_of_fp32_groups"][g] for o in osds])
            off = 0
            for x, shape in shapes.items():
                n = shape.numel()
                sd[x] = full.narrow(0, off, n).view(shape).clone()
                off += n
            if align * math.ceil(off / align) != align * math.ceil(full.numel() / align):
                raise ValueError(f"group {g}: consumed {off} of {full.numel()}")
    else:
        for x, shape in frozen.items():
            n = shape.numel()
            sd[x] = torch.cat([m["frozen_param_fragments"][x] for m in ms]).narrow(0, 0, n).view(shape)
        per_rank = [torch.cat(list(o["fp32_flat_groups"])) for o in osds]
        off = 0
        for shapes in m0["param_shapes"]:
            for x, shape in shapes.items():
                n = shape.numel()
                ps = math.ceil(n / world)
                sd[x] = torch.cat([r[off:off + ps] for r in per_rank])[:n].view(shape).clone()
                off += ps
        if off != per_rank[0].numel():
            raise ValueError(f"consumed {off * world} of {per_rank[0].numel() * world}")
    for alias, target in m0["shared_params"].items():
        if target in sd:
            sd[alias] = sd[target]
    return sd, osds


def check_fixture(root):
    errors = []
    got, osds = reassemble(root)
    exp = load(os.path.join(root, "expected_fp32.pt"))
    if list(got) != list(exp):
        errors.append(f"keys {list(got)} != {list(exp)}")
    for k in exp:
        if k in got and not (got[k].dtype == exp[k].dtype and got[k].shape == exp[k].shape
                             and torch.equal(got[k], exp[k])):
            errors.append(f"{k}: got {got[k].dtype} {tuple(got[k].shape)}, want {exp[k].dtype} "
                          f"{tuple(exp[k].shape)}, values {'differ' if got[k].shape == exp[k].shape else '-'}")
    with open(os.path.join(root, "expected.json")) as fd:
        meta = json.load(fd)
    key = "single_partition_of_fp32_groups" if meta["stage"] <= 2 else "fp32_flat_groups"
    for name, frags in meta["fp32_locations"].items():
        flat = exp[name].reshape(-1)
        for f in frags:
            t = osds[f["rank"]][f["key"]][f["index"]]
            a = t[f["offset"]:f["offset"] + f["numel"]]
            b = flat[f["param_offset"]:f["param_offset"] + f["numel"]]
            if f["key"] != key or not torch.equal(a, b):
                errors.append(f"location {name} {f}")
        if sum(f["numel"] for f in frags) != flat.numel():
            errors.append(f"locations of {name} cover {sum(f['numel'] for f in frags)}")
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--cpu-tags", action="store_true",
                    help="tag storages 'cpu' instead of DeepSpeed's 'cuda:<rank>'")
    args = ap.parse_args()
    torch.manual_seed(0)
    failed = False
    for name, stage, world, dtype, sgs in FIXTURES:
        write_fixture(args.out_dir, name, stage, world, dtype, sgs, args.cpu_tags)
        errors = check_fixture(os.path.join(args.out_dir, name))
        print(f"{name}: stage {stage}, dp {world}, {str(dtype)[6:]}: "
              f"{'OK' if not errors else 'MISMATCH'}")
        for e in errors:
            print("  " + e)
        failed |= bool(errors)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

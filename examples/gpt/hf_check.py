"""The reference trainer and Hugging Face transformers, both ways (the today tier's root:
torch 2.x, transformers 5; run.sh calls it through scripts/today-root).

    hf_check.py export WORK_DIR    WORK_DIR/hf: the trainer's final model converted by cairn
                                   (sharded safetensors + index) with the config.json the
                                   trainer wrote; from_pretrained loads it and its logits on the
                                   trainer's evaluation batch match the C++ model's within 1e-5
    hf_check.py init WORK_DIR      a LlamaForCausalLM of the trainer's sizes (WORK_DIR/config.json)
                                   that transformers initializes and saves (save_pretrained) in
                                   WORK_DIR/hf_init, with its logits
    hf_check.py import WORK_DIR LABEL...
                                   for each import run LABEL (import_<processes>x<tp>): the
                                   trainer's logits right after importing hf_init match
                                   transformers' within 1e-5, and its training from there lowers
                                   the loss
"""
import glob
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

import transformers  # noqa: E402


def tokens(work):
    raw = open(os.path.join(work, "eval_tokens.bin"), "rb").read()
    return torch.frombuffer(bytearray(raw), dtype=torch.int64).reshape(3, -1)


def logits_file(path, shape):
    return torch.frombuffer(bytearray(open(path, "rb").read()), dtype=torch.float32).reshape(shape)


def compare(what, got, want):
    diff = (got - want).abs().max().item()
    ok = diff <= 1e-5
    print(f"{what}: logits {tuple(got.shape)}, max |difference| {diff:.3g} -> "
          f"{'match (<= 1e-5)' if ok else 'DIFFERENT'}")
    return ok


def export(work):
    hf = os.path.join(work, "hf")
    shards = sorted(glob.glob(os.path.join(hf, "*.safetensors")))
    index = json.load(open(os.path.join(hf, "model.safetensors.index.json")))
    model = AutoModelForCausalLM.from_pretrained(hf, attn_implementation="eager")
    model.eval()
    t = tokens(work)
    with torch.no_grad():
        got = model(t).logits
    want = logits_file(os.path.join(work, "logits_resume_2x2.bin"), got.shape)
    ok = compare(f"transformers {transformers.__version__} from_pretrained of cairn's export "
                 f"({len(shards)} safetensors shards, {len(index['weight_map'])} tensors in the "
                 f"index) vs the C++ trainer (tp 2)", got, want)
    sys.exit(0 if ok else 1)


def init(work):
    cfg = LlamaConfig.from_pretrained(work)  # the config.json the trainer wrote
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    model.eval()
    out = os.path.join(work, "hf_init")
    model.save_pretrained(out)
    with torch.no_grad():
        model.config._attn_implementation = "eager"
        logits = model(tokens(work)).logits.contiguous()
    open(os.path.join(out, "logits.bin"), "wb").write(logits.numpy().tobytes())
    print(f"transformers {transformers.__version__} saved a new LlamaForCausalLM to {out}: "
          f"{sorted(os.listdir(out))}")


def import_(work, *labels):
    t = tokens(work)
    vocab = LlamaConfig.from_pretrained(work).vocab_size
    want = logits_file(os.path.join(work, "hf_init", "logits.bin"), (3, t.shape[1], vocab))
    ok = bool(labels)
    for label in labels:
        tp = label.split("x")[-1]
        got = logits_file(os.path.join(work, f"logits_{label}_initial.bin"), want.shape)
        ok &= compare(f"the C++ trainer after importing transformers' save_pretrained (tp {tp})",
                      got, want)
        losses = [float(line.split()[1]) for line in open(os.path.join(work, f"loss_{label}.txt"))]
        trained = losses[-1] < losses[0]
        ok &= trained
        print(f"training from the imported model (tp {tp}): loss {losses[0]:.4f} -> "
              f"{losses[-1]:.4f} in {len(losses)} steps -> {'lower' if trained else 'NOT LOWER'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    {"export": export, "init": init, "import": import_}[sys.argv[1]](*sys.argv[2:])

"""The AWS SDK for Python against what cairn wrote to an S3 server (moto_test.sh, in the today
tier's Debian testing root, where boto3 is a Debian package).

    boto3_check.py create ENDPOINT BUCKET
    boto3_check.py source DIR           writes DIR/model.safetensors (a 40 MB tensor and small ones)
    boto3_check.py read-back ENDPOINT BUCKET DIR
        lists native/ and st/ (cairn convert wrote them from DIR/model.safetensors), checks that
        the 40 MB objects were multipart uploads, reads the safetensors header and slices of
        the big tensor with ranged GETs, and compares the whole file with the source tensors
"""
import json
import struct
import sys

import boto3
import torch
from safetensors.torch import load, save_file


def client(endpoint):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def tensors():
    g = torch.Generator().manual_seed(7)
    return {"big": torch.randn(10_000_000, generator=g),  # 40 MB: three 16 MiB parts
            "layers.0.weight": torch.arange(24, dtype=torch.float32).reshape(4, 6),
            "step": torch.tensor(12, dtype=torch.int64),
            "mask": torch.tensor([True, False, True])}


def create(endpoint, bucket):
    client(endpoint).create_bucket(Bucket=bucket)


def source(d):
    save_file(tensors(), f"{d}/model.safetensors", metadata={"format": "pt"})


def read_back(endpoint, bucket, d):
    s3 = client(endpoint)
    want = tensors()
    keys = {}
    for prefix in ("native/", "st/"):
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        objs = [o for p in pages for o in p.get("Contents", [])]
        assert objs, f"nothing under {prefix}"
        keys[prefix] = {o["Key"]: o for o in objs}
    big = [o for o in keys["native/"].values() if o["Size"] > 32 << 20]
    assert big, f"no object over 32 MiB under native/: {list(keys['native/'])}"
    for o in big + [keys["st/"]["st/model.safetensors"]]:
        etag = s3.head_object(Bucket=bucket, Key=o["Key"])["ETag"].strip('"')
        assert "-" in etag, f"{o['Key']} ({o['Size']} bytes) was not a multipart upload: {etag}"
    key = "st/model.safetensors"
    (n,) = struct.unpack("<Q", s3.get_object(Bucket=bucket, Key=key, Range="bytes=0-7")["Body"].read())
    header = json.loads(s3.get_object(Bucket=bucket, Key=key, Range=f"bytes=8-{8 + n - 1}")["Body"].read())
    b, e = header["big"]["data_offsets"]
    base = 8 + n + b
    for lo, hi in ((0, 4096), (17 << 20, (17 << 20) + 12345), (e - b - 1000, e - b)):
        got = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={base + lo}-{base + hi - 1}")["Body"].read()
        assert got == want["big"].numpy().tobytes()[lo:hi], f"ranged GET {lo}-{hi} differs"
    whole = load(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    for k, t in want.items():
        assert whole[k].dtype == t.dtype and torch.equal(whole[k], t), f"{k} differs"
    print(f"boto3 {boto3.__version__}: listed {sum(map(len, keys.values()))} objects cairn wrote, "
          f"{len(big) + 1} multipart, read the safetensors header and 3 slices by ranged GETs and "
          f"the whole file: {len(want)} tensors exact")


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"create": create, "source": source, "read-back": read_back}[cmd](*args)

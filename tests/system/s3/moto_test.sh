#!/usr/bin/env bash
# The S3 backend against a second S3 implementation: moto's server (Python; from the today tier's
# Debian testing root, scripts/today-root) on 127.0.0.1, with the AWS SDK for Python reading back.
# 1. test_s3's storage conformance suite and s3_storage cases against moto (CAIRN_S3_ENDPOINT);
# 2. the cairn CLI converts a safetensors file to native and to one_file on s3:// (objects of
#    40 MB: multipart uploads) and verifies; boto3 lists them, checks the multipart ETags, and
#    reads the header and slices with ranged GETs and the whole file (boto3_check.py).
# Exits 77 (ctest: skipped), saying why, when the root is not ready.
#
#   moto_test.sh TEST_S3 CAIRN_CLI WORKDIR
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
test_s3="$1" cli="$2" work="$3"
if ! why="$("$repo/scripts/today-root" check)"; then
  echo "SKIP: moto and boto3 live in the today tier's root: $why"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port=$((20000 + RANDOM % 20000))
while listening "$port"; do port=$((port + 1)); done
endpoint="http://127.0.0.1:$port"
bucket=cairn-test

setsid "$repo/scripts/today-root" run moto_server -H 127.0.0.1 -p "$port" >"$work/moto.log" 2>&1 &
moto=$!
trap 'kill -- -$moto 2>/dev/null || true' EXIT
for _ in $(seq 200); do
  listening "$port" && break
  sleep 0.1
done
listening "$port" || {
  cat "$work/moto.log"
  echo "moto_server did not start on $endpoint"
  exit 1
}
in_root() { "$repo/scripts/today-root" run "$@"; }
in_root python3 "$here/boto3_check.py" create "$endpoint" "$bucket"

echo "--- test_s3 (storage conformance, s3_storage) against moto at $endpoint"
CAIRN_S3_ENDPOINT="$endpoint" CAIRN_S3_BUCKET="$bucket" CAIRN_SOURCE_DIR="$repo" \
  "$test_s3" -ts="storage conformance,s3_storage"

echo "--- cairn convert to s3://$bucket, boto3 reads back"
export AWS_ENDPOINT_URL="$endpoint" AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing \
  AWS_REGION=us-east-1
mkdir -p "$work/src"
in_root python3 "$here/boto3_check.py" source "$work/src"
"$cli" convert "$work/src" "s3://$bucket/native" --format native --no-progress
"$cli" verify "s3://$bucket/native" --no-progress
"$cli" convert "s3://$bucket/native" "s3://$bucket/st" --format one_file --no-progress
in_root python3 "$here/boto3_check.py" read-back "$endpoint" "$bucket" "$work/src"
echo "PASS moto_test"

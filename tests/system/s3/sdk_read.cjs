// Reads objects back with the official AWS SDK (@aws-sdk/client-s3): lists s3://bucket/prefix
// (ListObjectsV2, every page) and prints "<key> <size> <sha256 hex>" for each object.
// Usage: node sdk_read.cjs ENDPOINT BUCKET PREFIX   (NODE_PATH=<repo>/.deps/node_modules)
const crypto = require("crypto");
const { S3Client, ListObjectsV2Command, GetObjectCommand } = require("@aws-sdk/client-s3");

(async () => {
  const [endpoint, bucket, prefix] = process.argv.slice(2);
  const s3 = new S3Client({ endpoint, region: "us-east-1", forcePathStyle: true,
                            credentials: { accessKeyId: "S3RVER", secretAccessKey: "S3RVER" } });
  let token;
  do {
    const page = await s3.send(new ListObjectsV2Command(
        { Bucket: bucket, Prefix: prefix, ContinuationToken: token, MaxKeys: 5 }));
    for (const o of page.Contents || []) {
      const got = await s3.send(new GetObjectCommand({ Bucket: bucket, Key: o.Key }));
      const body = Buffer.from(await got.Body.transformToByteArray());
      console.log(o.Key, body.length, crypto.createHash("sha256").update(body).digest("hex"));
    }
    token = page.IsTruncated ? page.NextContinuationToken : undefined;
  } while (token);
})().catch((e) => { console.error(e); process.exit(1); });

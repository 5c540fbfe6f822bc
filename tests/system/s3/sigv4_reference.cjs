// Reference SigV4 signatures from the AWS SDK's signer (@smithy/signature-v4) for the requests
// described in the JSON file argv[2]: {credentials, region, requests: [{method, host, path,
// query: {name: value}, headers: {name: value}, date}]}. Prints one hex signature per line.
// Run with NODE_PATH=<repo>/.deps/node_modules.
const fs = require("fs");
const { SignatureV4 } = require("@smithy/signature-v4");
const { Sha256 } = require("@aws-crypto/sha256-js");

(async () => {
  const spec = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
  const signer = new SignatureV4({
    credentials: spec.credentials,
    region: spec.region,
    service: "s3",
    sha256: Sha256,
    uriEscapePath: false, // S3: the path is signed as sent (already encoded), never re-encoded
    applyChecksum: true,
  });
  for (const r of spec.requests) {
    const d = r.date; // YYYYMMDDTHHMMSSZ
    const date = new Date(Date.UTC(+d.slice(0, 4), +d.slice(4, 6) - 1, +d.slice(6, 8),
                                   +d.slice(9, 11), +d.slice(11, 13), +d.slice(13, 15)));
    const signed = await signer.sign(
        { method: r.method, protocol: "http:", hostname: r.host, path: r.path, query: r.query,
          headers: { host: r.host, ...r.headers } },
        { signingDate: date });
    const auth = signed.headers.authorization || signed.headers.Authorization;
    console.log(/Signature=([0-9a-f]+)/.exec(auth)[1]);
  }
})().catch((e) => { console.error(e); process.exit(1); });

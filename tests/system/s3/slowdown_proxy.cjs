// An HTTP proxy in front of an S3 server that answers 503 SlowDown to a fraction of requests
// (after reading their bodies, as S3 does). Writes "PORT <n>" to the file argv[last] once
// listening. GET /__stats answers {"requests": n, "slowdowns": m}.
// Usage: node slowdown_proxy.cjs TARGET_PORT FRACTION SEED PORT_FILE
const http = require("http");
const fs = require("fs");

const [targetPort, fraction, seed, portFile] = process.argv.slice(2);
let state = (+seed) >>> 0 || 1;
const rand = () => { state ^= state << 13; state >>>= 0; state ^= state >>> 17;
                     state ^= state << 5; state >>>= 0; return state / 4294967296; };
const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });
let requests = 0, slowdowns = 0;

const server = http.createServer((req, res) => {
  if (req.url === "/__stats") {
    res.end(JSON.stringify({ requests, slowdowns }));
    return;
  }
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    ++requests;
    if (rand() < +fraction) {
      ++slowdowns;
      const body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>" +
                   "<Message>Please reduce your request rate.</Message></Error>";
      res.writeHead(503, { "Content-Type": "application/xml", "Content-Length": body.length });
      res.end(body);
      return;
    }
    const up = http.request({ host: "127.0.0.1", port: +targetPort, method: req.method,
                              path: req.url, headers: req.headers, agent }, (r) => {
      res.writeHead(r.statusCode, r.headers);
      r.pipe(res);
    });
    up.on("error", () => { res.destroy(); });
    up.end(Buffer.concat(chunks));
  });
});
server.keepAliveTimeout = 5000;
server.listen(0, "127.0.0.1", () => {
  fs.writeFileSync(portFile, "PORT " + server.address().port + "\n");
});

// A hostile "S3 server" that answers every request with an error whose body echoes the request's
// headers (Authorization, x-amz-security-token, ...) in <Message>, in several shapes: header
// lines, JSON, a truncated and a percent-encoded session token, the bare signature, and the
// SECRET it was given (as if it knew the secret key), then 10 000 bytes of filler. POST answers
// carry the Authorization header as <Code>. GET answers 500 (retried), HEAD 403 (no body), others
// 403. Writes "PORT <n>" to the file argv[last] once listening.
// Usage: node echo_server.cjs SECRET PORT_FILE
const http = require("http");
const fs = require("fs");

const [secret, portFile] = process.argv.slice(2);
const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");

const server = http.createServer((req, res) => {
  req.resume();
  req.on("end", () => {
    const auth = req.headers["authorization"] || "";
    const token = req.headers["x-amz-security-token"] || "";
    const sig = (auth.match(/Signature=([0-9a-f]+)/) || [])[1] || "";
    let lines = "";
    for (let i = 0; i < req.rawHeaders.length; i += 2)
      lines += req.rawHeaders[i] + ": " + req.rawHeaders[i + 1] + "\n";
    const message = "Request headers:\n" + lines + " json=" + JSON.stringify(req.headers) +
                    " secret=" + secret + " token-start=" + token.slice(0, 24) +
                    " token-end=" + token.slice(-20) + " token-url=" + encodeURIComponent(token) +
                    " sig=" + sig + " sig-upper=" + sig.toUpperCase() + " tail:" +
                    "y".repeat(10000);
    const code = req.method === "POST" ? auth : "AccessDenied";
    const body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>" + esc(code) +
                 "</Code><Message>" + esc(message) + "</Message></Error>";
    const status = req.method === "GET" ? 500 : 403;
    res.writeHead(status, { "Content-Type": "application/xml",
                            "Content-Length": Buffer.byteLength(body) });
    res.end(req.method === "HEAD" ? undefined : body);
  });
});
server.listen(0, "127.0.0.1", () => {
  fs.writeFileSync(portFile, "PORT " + server.address().port + "\n");
});

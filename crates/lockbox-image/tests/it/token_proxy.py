"""A registry front for the tests: answers /v2/ requests with a Bearer challenge unless they
carry the token its /token endpoint hands out, then forwards them to the real registry
(docker-registry on 127.0.0.1:UPSTREAM). Some repository names misbehave on purpose:
  loop/*      redirects to itself forever
  endless/*   a manifest that never ends
  corrupt/*   blobs with one byte flipped
Prints its port on stdout, then serves until killed."""
import http.server, json, sys, threading, urllib.request, urllib.error, base64

UPSTREAM = int(sys.argv[1])
USER = sys.argv[2] if len(sys.argv) > 2 else None  # user:password the token endpoint wants
TOKEN = "t0ken-for-tests"

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, code, body=b"", headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self):
        port = self.server.server_address[1]
        if self.path.startswith("/token"):
            if USER is not None:
                want = "Basic " + base64.b64encode(USER.encode()).decode()
                if self.headers.get("Authorization") != want:
                    return self.send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}')
            return self.send(200, json.dumps({"token": TOKEN}).encode(), [("Content-Type", "application/json")])
        if not self.path.startswith("/v2/"):
            return self.send(404)
        if self.headers.get("Authorization") != "Bearer " + TOKEN:
            realm = f'Bearer realm="http://127.0.0.1:{port}/token",service="test-registry",scope="repository:x:pull"'
            return self.send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', [("WWW-Authenticate", realm)])
        if self.path.startswith("/v2/loop/"):
            return self.send(302, b"", [("Location", self.path)])
        if self.path.startswith("/v2/endless/") and "/manifests/" in self.path:
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b" " * 65536
            try:
                for _ in range(1024):  # 64 MiB at most, far beyond the bound
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (BrokenPipeError, ConnectionResetError):
                pass
            return
        path = self.path
        corrupt = path.startswith("/v2/corrupt/")
        if corrupt:
            path = "/v2/busybox/" + path[len("/v2/corrupt/"):]
        req = urllib.request.Request(f"http://127.0.0.1:{UPSTREAM}{path}")
        if self.headers.get("Accept"):
            req.add_header("Accept", self.headers["Accept"])
        try:
            with urllib.request.urlopen(req) as r:
                body = r.read()
                code = r.status
                hdrs = [(k, r.headers[k]) for k in ("Content-Type", "Docker-Content-Digest") if r.headers.get(k)]
        except urllib.error.HTTPError as e:
            body, code, hdrs = e.read(), e.code, []
        if corrupt and "/blobs/" in path and len(body) > 100:
            body = body[:50] + bytes([body[50] ^ 1]) + body[51:]
        self.send(code, body, hdrs)

    def forward(self, method):
        # A push through the front: HEAD, POST, PATCH and PUT go to the registry as they
        # came (after the same token check), its upload Locations made relative to us.
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        port = self.server.server_address[1]
        if self.headers.get("Authorization") != "Bearer " + TOKEN:
            realm = f'Bearer realm="http://127.0.0.1:{port}/token",service="test-registry",scope="repository:x:pull,push"'
            return self.send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', [("WWW-Authenticate", realm)])
        req = urllib.request.Request(f"http://127.0.0.1:{UPSTREAM}{self.path}", data=body, method=method)
        for k in ("Content-Type", "Content-Range"):
            if self.headers.get(k):
                req.add_header(k, self.headers[k])
        try:
            with urllib.request.urlopen(req) as r:
                out, code, h = r.read(), r.status, r.headers
        except urllib.error.HTTPError as e:
            out, code, h = e.read(), e.code, e.headers
        hdrs = []
        for k in ("Location", "Docker-Content-Digest", "Range", "Docker-Upload-UUID"):
            if h.get(k):
                hdrs.append((k, h[k].replace(f"http://127.0.0.1:{UPSTREAM}", "")))
        self.send(code, b"" if method == "HEAD" else out, hdrs)

    def do_HEAD(self):
        self.forward("HEAD")

    def do_POST(self):
        self.forward("POST")

    def do_PATCH(self):
        self.forward("PATCH")

    def do_PUT(self):
        self.forward("PUT")

srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()

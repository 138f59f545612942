"""The real server of tests/net_credentials.rs, run inside the test's network namespace:
HTTPS on argv[1]:8443 with the certificate argv[2] (key argv[3]), made by the test's CA,
and the same without TLS on argv[1]:8080.

A request is answered 200 `ok METHOD PATH` only if it carries the secret of the file
argv[4], as `Authorization: Bearer SECRET` or `X-Api-Key: SECRET`; otherwise 401 `no`.
Each request is logged to argv[5] as `METHOD PATH auth=ok|none|wrong` (never the secret).
`/close` is answered with `Connection: close`, and the connection closed. A request with
`Upgrade: echo` that carries the secret is answered 101, and then each line
the client sends comes back as `echo LINE` (logged with ` upgraded`).
Prints `ready` once listening."""
import http.server
import ssl
import sys
import threading

ip, cert, key, secret_file, log = sys.argv[1:6]
secret = open(secret_file).read().strip()
lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body are two writes: without this, Nagle and the client's delayed ACK
    # hold the body 40 ms.
    disable_nagle_algorithm = True

    def answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        given = [self.headers.get("Authorization"), self.headers.get("X-Api-Key")]
        if f"Bearer {secret}" == given[0] or secret == given[1]:
            auth = "ok"
        elif any(given):
            auth = "wrong"
        else:
            auth = "none"
        upgraded = auth == "ok" and self.headers.get("Upgrade") == "echo"
        with lock, open(log, "a") as f:
            f.write(f"{self.command} {self.path} auth={auth}{' upgraded' if upgraded else ''}\n")
        if upgraded:
            self.send_response(101)
            self.send_header("Connection", "Upgrade")
            self.send_header("Upgrade", "echo")
            self.end_headers()
            self.wfile.flush()
            while line := self.rfile.readline():
                self.wfile.write(b"echo " + line)
                self.wfile.flush()
            self.close_connection = True
            return
        status, body = (200, f"ok {self.command} {self.path}\n") if auth == "ok" else (401, "no\n")
        data = body.encode()
        self.send_response(status)
        if self.path == "/close":
            # Ends this kept-alive connection after the answer.
            self.send_header("Connection", "close")
            self.close_connection = True
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = answer

    def log_message(self, *args):
        pass


plain = http.server.ThreadingHTTPServer((ip, 8080), Handler)
threading.Thread(target=plain.serve_forever, daemon=True).start()
server = http.server.ThreadingHTTPServer((ip, 8443), Handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
server.socket = ctx.wrap_socket(server.socket, server_side=True)
print("ready", flush=True)
server.serve_forever()

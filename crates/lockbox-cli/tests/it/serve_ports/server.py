# A test server for the port proxy, stdlib only: GET answers "hello <path>", every
# request's headers are appended (JSON, one line) to the file named by argv[2], and GET
# with `Upgrade: websocket` is a WebSocket that echoes text frames. GET /cookies sets 80 KB
# of year-long cookies (issue 32), one of them for a whole domain, and clears the site.
import base64, hashlib, json, struct, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
LOG = sys.argv[2]


def recv_frame(f):
    head = f.read(2)
    if len(head) < 2:
        return None, b""
    op, n, masked = head[0] & 0x0F, head[1] & 0x7F, head[1] & 0x80
    if n == 126:
        n = struct.unpack(">H", f.read(2))[0]
    elif n == 127:
        n = struct.unpack(">Q", f.read(8))[0]
    mask = f.read(4) if masked else b"\0\0\0\0"
    data = f.read(n)
    return op, bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def send_frame(f, op, data):
    n = len(data)
    if n < 126:
        head = bytes([0x80 | op, n])
    elif n < 65536:
        head = bytes([0x80 | op, 126]) + struct.pack(">H", n)
    else:
        head = bytes([0x80 | op, 127]) + struct.pack(">Q", n)
    f.write(head + data)
    f.flush()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def record(self):
        with open(LOG, "a") as log:
            log.write(json.dumps({"path": self.path, "headers": dict(self.headers.items())}) + "\n")

    def do_GET(self):
        self.record()
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.websocket()
        body = f"hello {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Set-Cookie", "lockbox_session=stolen; Path=/")
        if self.path == "/cookies":
            for i in range(20):
                self.send_header("Set-Cookie", f"big{i}={'x' * 4000}; Path=/; Max-Age=31536000")
            self.send_header("Set-Cookie", "wide=1; Domain=localhost; Path=/; Max-Age=31536000")
            self.send_header("Set-Cookie", "lockbox_port=forged; Path=/")
            self.send_header("Clear-Site-Data", '"cookies"')
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.record()
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(201)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def websocket(self):
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        while True:
            op, data = recv_frame(self.rfile)
            if op is None or op == 8:
                if op == 8:
                    send_frame(self.wfile, 8, data[:2])
                return
            if op == 9:
                send_frame(self.wfile, 10, data)
            elif op in (1, 2):
                send_frame(self.wfile, op, b"echo: " + data)

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()

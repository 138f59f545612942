"""The sandboxed client of tests/net_credentials.rs. Each argument is an op, answered by one
`OP RESULT` line:

- `METHOD,URL[,AUTHORIZATION[,HOST]]` (`_` for a space in AUTHORIZATION, `-` for none):
  the request (urllib, with the system's default trust: the sandbox's bundle, plus the
  file of $EXTRA_CA if set), with HOST as its `Host` header if given; RESULT `STATUS
  FIRST-LINE-OF-BODY` or `error WHY`;
- `curl,URL[,AUTHORIZATION]`: a GET with curl, HTTP/2 if the server takes it; RESULT
  `STATUS HTTP-VERSION FIRST-LINE-OF-BODY`;
- `upgrade,HOST,PORT,PATH[,AUTHORIZATION]`: an HTTP/1.1 request for `Upgrade: echo` on a
  TLS socket; once switched, sends `ping` and reads the answer; RESULT `STATUS ANSWER`;
- `raw,HOST,PORT,TARGET[,HOST-HEADER]`: `GET TARGET HTTP/1.1` with `Host: HOST:PORT` (or
  HOST-HEADER) on a TLS socket, the request target as given (an absolute URI naming
  another host, a path no library would send, say); RESULT `STATUS`;
- `keepalive,HOST,PATH,PATH...`: GETs on one kept-alive connection (http.client);
  RESULT the statuses, `+`-joined;
- `dump,FILE`: writes to FILE everything of the sandbox a credential could hide in: the
  environment, every process's /proc environ and cmdline, and every regular file under
  /etc, /tmp, /dev and /run; RESULT `dumped`."""
import http.client
import os
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request


def request(method, url, auth, host):
    req = urllib.request.Request(url, method=method, data=b"x" if method == "POST" else None)
    if auth:
        req.add_header("Authorization", auth)
    if host:
        req.add_unredirected_header("Host", host)
    ctx = ssl.create_default_context()
    if os.environ.get("EXTRA_CA"):
        ctx.load_verify_locations(os.environ["EXTRA_CA"])
    try:
        with urllib.request.urlopen(req, timeout=15, context=ctx) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    except Exception as e:  # noqa: BLE001 - the test reads the reason
        return f"error {e}".replace("\n", " ")
    lines = body.decode(errors="replace").splitlines()
    return f"{status} {lines[0] if lines else ''}"


def curl(url, auth):
    args = ["curl", "--http2", "-sS", "-m", "15", "-w", "\n%{http_code} %{http_version}", url]
    if auth:
        args += ["-H", f"Authorization: {auth}"]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        return f"error {p.stderr.strip()}"
    lines = p.stdout.splitlines()
    return f"{lines[-1]} {lines[0] if len(lines) > 1 else ''}"


def upgrade(host, port, path, auth):
    ctx = ssl.create_default_context()
    ctx.set_alpn_protocols(["http/1.1"])
    head = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n"
    if auth:
        head += f"Authorization: {auth}\r\n"
    try:
        with socket.create_connection((host, int(port)), timeout=15) as raw:
            with ctx.wrap_socket(raw, server_hostname=host) as s:
                s.sendall((head + "\r\n").encode())
                f = s.makefile("rb")
                status = f.readline().split()[1].decode()
                while f.readline() not in (b"\r\n", b""):
                    pass
                if status != "101":
                    return status
                s.sendall(b"ping\n")
                return f"{status} {f.readline().decode().strip()}"
    except Exception as e:  # noqa: BLE001 - the test reads the reason
        return f"error {e}".replace("\n", " ")


def raw(host, port, target, host_header=None):
    ctx = ssl.create_default_context()
    ctx.set_alpn_protocols(["http/1.1"])
    host_header = host_header or f"{host}:{port}"
    head = f"GET {target} HTTP/1.1\r\nHost: {host_header}\r\nConnection: close\r\n\r\n"
    try:
        with socket.create_connection((host, int(port)), timeout=15) as sock:
            with ctx.wrap_socket(sock, server_hostname=host) as s:
                s.sendall(head.encode())
                return s.makefile("rb").readline().split()[1].decode()
    except Exception as e:  # noqa: BLE001 - the test reads the reason
        return f"error {e}".replace("\n", " ")


def keepalive(host, paths):
    c = http.client.HTTPSConnection(host, 8443, context=ssl.create_default_context(), timeout=15)
    statuses = []
    for p in paths:
        c.request("GET", p)
        r = c.getresponse()
        r.read()
        statuses.append(str(r.status))
    return "+".join(statuses)


def dump(path):
    with open(path, "wb") as out:
        for k, v in os.environ.items():
            out.write(f"{k}={v}\n".encode())
        for pid in filter(str.isdigit, os.listdir("/proc")):
            for name in ("environ", "cmdline"):
                try:
                    out.write(open(f"/proc/{pid}/{name}", "rb").read() + b"\n")
                except OSError:
                    pass
        for top in ("/etc", "/tmp", "/dev", "/run"):
            for root, _, files in os.walk(top):
                for f in files:
                    p = os.path.join(root, f)
                    if p == path or not os.path.isfile(p) or os.path.islink(p):
                        continue
                    try:
                        out.write(open(p, "rb").read(1 << 20) + b"\n")
                    except OSError:
                        pass
    return "dumped"


for op in sys.argv[1:]:
    parts = op.split(",")
    if parts[0] == "dump":
        result = dump(parts[1])
    elif parts[0] == "keepalive":
        result = keepalive(parts[1], parts[2:])
    elif parts[0] == "raw":
        result = raw(*parts[1:5])
    elif parts[0] == "upgrade":
        auth = parts[4].replace("_", " ") if len(parts) > 4 else None
        result = upgrade(parts[1], parts[2], parts[3], auth)
    elif parts[0] == "curl":
        result = curl(parts[1], parts[2].replace("_", " ") if len(parts) > 2 else None)
    else:
        auth = parts[2].replace("_", " ") if len(parts) > 2 and parts[2] != "-" else None
        host = parts[3] if len(parts) > 3 else None
        result = request(parts[0], parts[1], auth, host)
    print(op, result, flush=True)

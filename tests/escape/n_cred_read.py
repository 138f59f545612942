"""Read the credential lockbox sets on requests to an intercepted host (--credential,
--http-auth) from inside: the environment, /proc/self/environ and every process's environ
and command line, the trust-store files lockbox wrote (for the per-sandbox CA's private key),
the usual places a key file would sit; then ask the intercepted host to hand the credential
back on a path the rules do not allow. The control request must get the credential set by
lockbox (the test checks the server saw it); the sandbox must never see it."""
import errno
import glob
import hashlib
import os
import re
import socket
import ssl
from lib import must_fail, must_work, finish, resolve

WANT = os.environ["CRED_SHA256"]
PATTERN = re.compile(rb"lbxcred-[0-9a-f]{32}")


def holds_secret(data):
    return any(hashlib.sha256(m).hexdigest() == WANT for m in PATTERN.findall(data))


def look(desc, read):
    def attempt():
        data = read()
        if holds_secret(data):
            return "the credential's value"
        if b"PRIVATE KEY" in data:
            return "a private key"
        raise OSError(errno.ENOENT, "neither the credential nor a private key")
    must_fail(desc, attempt, errno.ENOENT, errno.EACCES, errno.EPERM, errno.ESRCH, errno.EISDIR)


def read(path):
    return lambda: open(path, "rb").read(4 << 20)


look("os.environ", lambda: "\0".join(f"{k}={v}" for k, v in os.environ.items()).encode())


def variable():
    if "LBX_ESCAPE_CRED" in os.environ:
        return "present"
    raise OSError(errno.ENOENT, "not in the environment")


must_fail("the credential's variable (LBX_ESCAPE_CRED) in the environment", variable, errno.ENOENT)
look("/proc/self/environ", read("/proc/self/environ"))
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for what in ["environ", "cmdline"]:
        look(f"/proc/{pid}/{what}", read(f"/proc/{pid}/{what}"))
# The CA's certificate is in the sandbox's trust store; its key must be nowhere.
bundles = ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
           "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", "/etc/ssl/ca-bundle.pem",
           "/etc/ssl/cert.pem", os.environ.get("SSL_CERT_FILE", "/nonexistent")]
for path in bundles:
    look(path, read(path))
candidates = set()
for pattern in ["/etc/ssl/private/*", "/etc/ssl/*.key", "/etc/ssl/certs/*.key", "/etc/lockbox*",
                "/etc/lockbox*/*", "/run/lockbox*", "/run/lockbox*/*", "/tmp/*", "/dev/shm/*",
                "/var/tmp/*", os.path.expanduser("~/*"), "/*.pem", "/*.key"]:
    candidates.update(p for p in glob.glob(pattern) if os.path.isfile(p))
for path in sorted(candidates):
    look(path, read(path))
# Mounted files lockbox made: anything under the sandbox's /etc newer than the sandbox.
start = os.stat("/proc/1").st_mtime - 5
for root, _dirs, files in os.walk("/etc"):
    for f in files:
        p = os.path.join(root, f)
        try:
            if os.path.isfile(p) and os.stat(p).st_mtime >= start:
                look(f"{p} (written at start)", read(p))
        except OSError:
            pass

ip = must_work("allowed.test is answered", lambda: resolve("allowed.test"))[0]


def request(path, host="allowed.test", method="GET"):
    ctx = ssl.create_default_context()  # the sandbox's trust store: lockbox's CA in it
    with socket.create_connection((ip, 443), timeout=5) as s, \
            ctx.wrap_socket(s, server_hostname="allowed.test") as t:
        t.sendall(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer placeholder\r\n"
                  "Connection: close\r\n\r\n".encode())
        data = b""
        while chunk := t.recv(65536):
            data += chunk
        return data


def status_200(data):
    status = data.split(b"\r\n")[0]
    if b" 200 " not in status:
        raise OSError(errno.EPROTO, status.decode(errors="replace"))
    return status


must_work("GET /ok on the intercepted host (the credential set by lockbox)",
          lambda: status_200(request("/ok")))


def forbidden(path, host="allowed.test", method="GET"):
    data = request(path, host, method)
    if holds_secret(data):
        return "the credential in the response"
    status = data.split(b"\r\n")[0]
    if b" 403 " in status:
        raise OSError(errno.EACCES, status.decode(errors="replace"))
    return status


must_fail("GET /echo (a path --http-allow does not list)", lambda: forbidden("/echo"), errno.EACCES)
must_fail("GET /ok with Host: other.test inside the intercepted TLS (the header sent elsewhere)",
          lambda: forbidden("/ok", "other.test"), errno.EACCES)
must_fail("TRACE /ok (a server would echo the header back)",
          lambda: forbidden("/ok", method="TRACE"), errno.EACCES)
# Issue 32: paths a server reads as /ok/../echo (Tomcat's ';', IIS's %u, a second decoding,
# fullwidth dots, NUL), and userinfo a server may take for the host.
for p in ["/ok/..;/echo", "/ok/..;x=1/echo", "/ok/%u002e%u002e/echo",
          "/ok/%EF%BC%8E%EF%BC%8E/echo", "/ok/%252e%252e/echo", "/ok/.%00./echo"]:
    must_fail(f"GET {p} (a path a server could read as /echo)",
              lambda p=p: forbidden(p), errno.EACCES)
must_fail("GET /ok with Host: other.test@allowed.test (userinfo)",
          lambda: forbidden("/ok", "other.test@allowed.test"), errno.EACCES)
finish()

"""The program the function executor runs inside the sandbox (passed with ``python -c``, so
no file of lockbox has to be visible there). Kept dependency-free: stdlib plus cloudpickle
when the parent used it.

Protocol: the interpreter writes ``R`` to the result descriptor once it is ready; stdin
carries one frame ``<8-byte big-endian length><pickle of (fn, args,
kwargs)>``; the result goes to descriptor ``argv[1]`` as ``<1-byte status><8-byte
length><pickle>``, status ``o`` (value) or ``e`` (dict: type, message, traceback). The
interpreter starts (and imports the pickler) before the frame arrives, which is what makes
a warm pool warm. It flushes stdout and stderr before the result and leaves with
``os._exit`` after it, skipping the interpreter's finalisation: the parent kills the
sandbox once the result is in anyway.
"""

SOURCE = r'''
import os, sys, struct, traceback
fd = int(sys.argv[1])
use_cloudpickle = sys.argv[2] == "cloudpickle"
if use_cloudpickle:
    import cloudpickle as _p
else:
    import pickle as _p
import pickle

def _read_exact(n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(0, n - len(buf))
        if not chunk:
            os._exit(3)
        buf += chunk
    return bytes(buf)

def _send(status, data):
    # What the function printed goes out first: the sandbox is killed once the result is in.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    out = status + struct.pack(">Q", len(data)) + data
    view = memoryview(out)
    while view:
        n = os.write(fd, view)
        view = view[n:]

os.write(fd, b"R")  # ready: imports done, waiting for the payload
(n,) = struct.unpack(">Q", _read_exact(8))
payload = _read_exact(n)
if sys.argv[3] == "devnull":
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
try:
    fn, args, kwargs = pickle.loads(payload)
    value = fn(*args, **kwargs)
except BaseException as e:
    info = {"type": type(e).__module__ + "." + type(e).__qualname__, "message": str(e),
            "traceback": traceback.format_exc()}
    _send(b"e", pickle.dumps(info))
else:
    try:
        data = _p.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as e:
        info = {"type": "lockbox.UnpicklableResult", "message": "the result could not be pickled: "
                + type(e).__name__ + ": " + str(e), "traceback": traceback.format_exc()}
        _send(b"e", pickle.dumps(info))
    else:
        _send(b"o", data)
# The parent kills the sandbox once the result is in: finalising every module first would
# only take CPU from the next call (with cloudpickle loaded, ~16 ms: a fifth of the
# interpreter's whole CPU time, issue 21).
os._exit(0)
'''

"""Leave a daemon behind: the command exits at once, the daemon (double fork, setsid,
ignoring SIGTERM/SIGHUP) must die with the sandbox. The test checks no process is left."""
import os
import signal
import sys
import time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        time.sleep(300)
    os._exit(0)
time.sleep(0.2)
print("BLOCKED")
sys.exit(0)

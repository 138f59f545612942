# Read the host's secrets from the granted /etc, or change /etc.
. "$BIN/lib.sh"
must_fail "shadow" cat /etc/shadow
must_fail "gshadow" cat /etc/gshadow
must_fail "ssh host keys" sh -c 'cat /etc/ssh/ssh_host_*_key'
must_fail "append to passwd" sh -c 'echo "pwned::0:0::/:/bin/sh" >> /etc/passwd'
must_fail "write /etc/pwned" sh -c 'echo x > /etc/pwned'
finish

# /tmp and /dev/shm inside must not be the host's: the host check looks for these files.
cd /tmp || exit 3
echo x > "/tmp/lockbox-escape-pwned-$TOKEN" || exit 3
echo x > "/dev/shm/lockbox-escape-pwned-$TOKEN" || exit 3
echo BLOCKED

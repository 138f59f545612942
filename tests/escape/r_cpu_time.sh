# Spin past --max-cpu-time: the kernel must stop it (SIGXCPU, then SIGKILL).
trap '' XCPU
while :; do :; done

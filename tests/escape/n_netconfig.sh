# Reconfigure the network (the sandbox's own namespace, and without a capability).
. "$BIN/lib.sh"
must_fail "ip link add" ip link add lockboxpwn type dummy
must_fail "ip addr add" ip addr add 10.99.0.1/24 dev lo
must_fail "ip route add" ip route add 10.98.0.0/16 dev lo
finish

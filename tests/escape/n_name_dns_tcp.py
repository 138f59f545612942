"""DNS over TCP to lockbox's resolver for names off the list (exfiltration, or a way to learn
an address to connect to): NXDOMAIN, and the names are never asked of the host's resolver
(the test checks the outside DNS server's log)."""
import errno
from lib import must_fail, must_work, finish, a_records, dns_tcp, dns_query

must_work("allowed.test is answered over TCP", lambda: a_records(dns_tcp(dns_query("allowed.test"))))
for name in ["other.test", "c2VjcmV0.exfil.other.test", "allowed.test.other.test", "xallowed.test"]:
    for qtype, tname in [(1, "A"), (28, "AAAA"), (16, "TXT")]:
        must_fail(f"{tname} {name} over TCP", lambda: a_records(dns_tcp(dns_query(name, qtype))), errno.ENOENT)
finish()

//! Roots copied from a template (`Spawn::root_template`): each sandbox still has its own
//! `/proc`, scratch and terminals, the same read-only root and limits as a root built for
//! it, and nothing of the host.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lockbox_policy::Policy;
use std::io::{BufRead, BufReader};

fn templated(script: &str) -> String {
    crate::stdout_of_spawn(&Policy::default(), script, |s| s.root_template())
}

/// How many mounts `/proc/self/mountinfo` lists at `point`.
const MOUNTS_AT: &str = "mounts_at() { awk -v p=\"$1\" '$5 == p' /proc/self/mountinfo | wc -l; }";

#[test]
fn a_root_copied_from_a_template_is_the_root_a_sandbox_builds_for_itself() {
    as_root_and_nobody!(
        "a_root_copied_from_a_template_is_the_root_a_sandbox_builds_for_itself",
        || {
            let script = format!(
                "{MOUNTS_AT}; echo proc $(mounts_at /proc); ls -a / /dev /etc | md5sum; \
                 cat /proc/sys/user/max_user_namespaces /proc/sys/user/max_mnt_namespaces; \
                 id -u; hostname; echo $$; ls /proc | grep -c '^[0-9]'; \
                 touch /x 2>/dev/null && echo root-writable; \
                 echo 1 > /proc/sys/kernel/ns_last_pid 2>/dev/null && echo proc-sys-writable; \
                 echo x > /tmp/x && echo x > /dev/shm/x && cat /tmp/x /dev/shm/x; \
                 test -e /etc/shadow && echo shadow; cat /proc/kcore 2>/dev/null | wc -c; \
                 ls /proc/self/fd | tr '\\n' ' '; echo; \
                 umount /proc 2>/dev/null && echo unmounted; \
                 umount -l /tmp 2>/dev/null && echo unmounted; \
                 mount -o remount,rw / 2>/dev/null && echo remounted; \
                 cat /proc/self/status | grep -E '^(Cap(Eff|Prm|Bnd)|NoNewPrivs|Seccomp):'"
            );
            let built = crate::stdout_of(&Policy::default(), &script);
            let copied = templated(&script);
            let (built_head, built_rest) = built.split_once('\n').unwrap();
            let (copied_head, copied_rest) = copied.split_once('\n').unwrap();
            // The template's bare /proc lies under the sandbox's own: that is how a copy
            // shows (and proves this one is a copy).
            assert_eq!(built_head, "proc 1", "{built}");
            assert_eq!(copied_head, "proc 2", "{copied}");
            assert_eq!(
                built_rest, copied_rest,
                "built:\n{built}\ncopied:\n{copied}"
            );
            assert!(!copied.contains("writable"), "{copied}");
            assert!(!copied.contains("mounted"), "{copied}");
            // Only what `ls` itself opened besides stdio: the host's /proc the init wrote its
            // ids through is gone.
            assert!(copied.contains("\n0 1 2 3 \n"), "{copied}");
            assert!(copied.contains("CapEff:\t0000000000000000"), "{copied}");
            assert!(!copied.contains("shadow"), "{copied}");
            assert!(copied.contains("x\nx\n0\n"), "{copied}");
        }
    );
}

#[test]
fn sandboxes_copied_from_one_template_share_no_scratch_processes_or_boot() {
    as_root_and_nobody!(
        "sandboxes_copied_from_one_template_share_no_scratch_processes_or_boot",
        || {
            // The first writes into its scratch, says so, and stays until its stdin ends.
            let (out_r, out_w) = std::os::unix::net::UnixStream::pair().unwrap();
            let (in_r, in_w) = std::os::unix::net::UnixStream::pair().unwrap();
            let argv = [
                "sh".into(),
                "-c".into(),
                "echo first > /tmp/first; echo first > /dev/shm/first; \
                 cat /proc/sys/kernel/random/boot_id; read _ || true"
                    .into(),
            ];
            let policy = Policy::default();
            let mut first = lockbox_confine::Spawn::command(&policy, &argv)
                .root_template()
                .stdio(lockbox_confine::Stdio {
                    stdin: Some(std::os::fd::OwnedFd::from(in_r)),
                    stdout: Some(std::os::fd::OwnedFd::from(out_w)),
                    stderr: None,
                })
                .start()
                .unwrap();
            out_r
                .set_read_timeout(Some(std::time::Duration::from_secs(30)))
                .unwrap();
            let mut boot = String::new();
            BufReader::new(&out_r).read_line(&mut boot).unwrap();
            let second = templated(
                "ls -a /tmp /dev/shm; cat /proc/sys/kernel/random/boot_id; \
                 ps -e 2>/dev/null | wc -l; ls /proc | grep -c '^[0-9]'",
            );
            drop(in_w);
            match first.wait(None, None).unwrap() {
                lockbox_confine::Waited::Exited(o) => assert_eq!(o.exit_code(), 0),
                other => panic!("{other:?}"),
            }
            assert!(!second.contains("first"), "{second}");
            assert!(!boot.trim().is_empty());
            assert!(
                !second.contains(boot.trim()),
                "one boot id for two: {second}"
            );
            // Its own pid namespace: the init, the shell, ls and grep at most.
            let pids: usize = second.lines().last().unwrap().trim().parse().unwrap();
            assert!(pids <= 5, "{second}");
        }
    );
}

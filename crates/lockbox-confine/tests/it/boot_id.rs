//! Each sandbox's own boot id (`Op::OwnBootId`): a fresh one per start, as a boot's, never
//! the host's, and no trace of how it got there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lockbox_policy::Policy;

/// What a sandbox's `cat boot_id; ls -a /dev /dev/shm` prints: the boot id, and the names.
fn seen_inside() -> (String, Vec<String>) {
    let script = "cat /proc/sys/kernel/random/boot_id && ls -a /dev /dev/shm";
    let out = crate::stdout_of(&Policy::default(), script);
    let mut lines = out.lines().map(str::to_owned);
    let id = lines.next().unwrap_or_default();
    (id, lines.collect())
}

/// A version 4 UUID as the kernel writes one: 8-4-4-4-12 lowercase hex digits.
fn is_v4_uuid(id: &str) -> bool {
    let groups: Vec<&str> = id.split('-').collect();
    let lengths: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    lengths == [8, 4, 4, 4, 12]
        && id
            .chars()
            .all(|c| c == '-' || c.is_ascii_digit() || ('a'..='f').contains(&c))
        && groups[2].starts_with('4')
        && groups[3].starts_with(['8', '9', 'a', 'b'])
}

#[test]
fn each_sandbox_boots_with_a_boot_id_of_its_own_never_the_hosts() {
    as_root_and_nobody!(
        "each_sandbox_boots_with_a_boot_id_of_its_own_never_the_hosts",
        || {
            let host = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
            let (first, dev) = seen_inside();
            let (second, _) = seen_inside();
            assert!(is_v4_uuid(&first), "{first:?}");
            assert!(is_v4_uuid(&second), "{second:?}");
            assert_ne!(first, host.trim(), "the host's boot id");
            assert_ne!(first, second, "two sandboxes, one boot id");
            assert!(dev.contains(&"null".to_owned()), "{dev:?}");
            assert!(
                !dev.iter().any(|name| name.contains("boot")),
                "the file it came from is left in /dev/shm: {dev:?}"
            );
        }
    );
}

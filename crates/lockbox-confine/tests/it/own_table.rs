//! Sandboxes started by a process that holds thousands of descriptors and reserved its
//! spawn slots ([`lockbox_confine::reserve_spawn_slots`], as `lockbox serve` does): the
//! init is cloned sharing the caller's table and takes a table of its own holding only what
//! it is given, instead of a copy of all of them to close one by one.

use lockbox_policy::Policy;
use std::fs::File;
use std::os::fd::AsRawFd;

/// The descriptors of this process that name `target` (`pipe:[N]`, say).
fn naming(target: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
        let entry = entry.unwrap();
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if std::fs::read_link(entry.path()).is_ok_and(|t| t.to_string_lossy() == target) {
            found.push(fd);
        }
    }
    found.sort_unstable();
    found
}

/// Runs `script` with `given` passed (at its number) and stdout to a pipe; its output.
fn run_passing(given: i32, script: &str) -> String {
    let policy = Policy {
        pass_fds: vec![given],
        ..Policy::default()
    };
    crate::stdout_of(&policy, script)
}

#[test]
fn a_caller_holding_thousands_of_descriptors_passes_only_what_it_gives_and_keeps_its_table() {
    as_root_and_nobody!(
        "a_caller_holding_thousands_of_descriptors_passes_only_what_it_gives_and_keeps_its_table",
        || {
            lockbox_confine::reserve_spawn_slots().unwrap();
            let held: Vec<File> = (0..3000)
                .map(|_| File::open("/dev/null").unwrap())
                .collect();
            // Made after the 3,000: numbered above them, as a busy server's new ones are.
            let (given, writer) = rustix::pipe::pipe().unwrap();
            let fd = given.as_raw_fd();
            assert!(fd > 3000);
            let pipe = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
            let pipe = pipe.to_string_lossy();
            for _ in 0..3 {
                let out = run_passing(
                    fd,
                    &format!("readlink /proc/self/fd/{fd}; ls /proc/self/fd | tr '\\n' ' '"),
                );
                // The same pipe at the same number; 0-2, the listing's own 3, and the passed
                // one: none of the 3,000.
                assert_eq!(out, format!("{pipe}\n0 1 2 3 {fd} "));
            }
            // Several spawns at once take turns with the slots.
            std::thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| {
                        for _ in 0..3 {
                            let out =
                                run_passing(fd, &format!("test -e /proc/self/fd/{fd} && echo ok"));
                            assert_eq!(out, "ok\n");
                        }
                    });
                }
            });
            // The slots are back on /dev/null: the pipe is named by its own two ends only.
            assert_eq!(naming(&pipe), [fd, writer.as_raw_fd()]);
            drop(held);
        },
    );
}

//! `/proc/PID/stat`, parsed once for everyone who walks process trees: the usage walk of
//! [`crate::tree_usage`] and the agent's whole-tree kill (`lockbox-agent`).

/// The fields of `/proc/PID/stat` that lockbox reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 3: `R`, `S`, `D`, `Z` (zombie), `X` (dead), ...
    pub state: u8,
    /// Field 4: the parent's pid.
    pub ppid: i32,
    /// Fields 14–17: utime + stime + cutime + cstime, in clock ticks.
    pub cpu_ticks: u64,
    /// Field 20: threads.
    pub threads: u32,
    /// Field 24: resident set size, in pages.
    pub rss_pages: u64,
}

impl ProcStat {
    /// Reads and parses `/proc/{pid}/stat`.
    pub fn read(pid: i32) -> std::io::Result<ProcStat> {
        let data = std::fs::read(format!("/proc/{pid}/stat"))?;
        ProcStat::parse(&data).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("/proc/{pid}/stat: unexpected format"),
            )
        })
    }

    /// Parses the contents of a stat file. The command name (field 2) may hold anything,
    /// spaces, `)` and bytes that are not UTF-8 included, so fields are counted from its
    /// last `)`.
    pub fn parse(data: &[u8]) -> Option<ProcStat> {
        let close = data.iter().rposition(|&b| b == b')')?;
        let rest = std::str::from_utf8(data.get(close + 1..)?).ok()?;
        // Fields from 3 (state) on: index = field number - 3.
        let f: Vec<&str> = rest.split_ascii_whitespace().collect();
        let num = |field: usize| f.get(field - 3)?.parse::<i64>().ok();
        let cpu = [14, 15, 16, 17]
            .into_iter()
            .map(|i| num(i).map(|v| v.max(0) as u64))
            .sum::<Option<u64>>()?;
        Some(ProcStat {
            state: *f.first()?.as_bytes().first()?,
            ppid: i32::try_from(num(4)?).ok()?,
            cpu_ticks: cpu,
            threads: u32::try_from(num(20)?.max(0)).ok()?,
            rss_pages: num(24)?.max(0) as u64,
        })
    }

    /// A zombie (`Z`) or dead (`X`) process: it has exited and only waits to be reaped.
    pub fn is_zombie(&self) -> bool {
        matches!(self.state, b'Z' | b'X')
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn fields_are_counted_from_the_last_parenthesis() {
        let line = b"42 (a) b (c)) S 7 42 42 0 -1 4194560 100 0 0 0 11 22 33 44 20 0 3 0 \
                    123 456789 99 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let stat = ProcStat::parse(line).unwrap();
        assert_eq!(
            stat,
            ProcStat {
                state: b'S',
                ppid: 7,
                cpu_ticks: 110,
                threads: 3,
                rss_pages: 99
            }
        );
        assert!(!stat.is_zombie());
        assert_eq!(ProcStat::parse(b"42 (no close paren"), None);
    }

    #[test]
    fn a_command_name_that_is_not_utf8_still_parses() {
        let mut line = b"9 (\xff\xfe) Z 1 9 9 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 5 0 0".to_vec();
        line.push(b'\n');
        let stat = ProcStat::parse(&line).unwrap();
        assert!(stat.is_zombie());
        assert_eq!(stat.ppid, 1);
    }

    #[test]
    fn this_process_reads_with_its_parent() {
        let stat = ProcStat::read(i32::try_from(std::process::id()).unwrap()).unwrap();
        assert_eq!(
            stat.ppid,
            i32::try_from(std::os::unix::process::parent_id()).unwrap()
        );
        assert!(stat.threads >= 1);
    }
}

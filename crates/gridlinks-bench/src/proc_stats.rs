//! CPU time and memory of the server process, and the generator's own fd limit, from
//! Linux `/proc`.
//!
//! CPU seconds are `utime + stime` of `/proc/PID/stat` (all threads of the process)
//! divided by the clock-tick rate (`getconf CLK_TCK`, 100 on every mainstream Linux).
//! Memory is `VmRSS` (resident now) and `VmHWM` (resident high-water mark over the
//! process's life) of `/proc/PID/status`, in KiB.

use std::io;
use std::process::Command;

/// Clock ticks per second assumed when `getconf` is unavailable (the value on every
/// Linux architecture with a 100 Hz USER_HZ, i.e. all mainstream ones).
const DEFAULT_CLK_TCK: u64 = 100;

/// Handle on the counters of the server's processes: one or more roots, each with every
/// process it started (a PostgreSQL server's backends), summed.
#[derive(Debug, Clone)]
pub struct ProcessStats {
    /// The observed processes (the first is the one reports name).
    pids: Vec<u32>,
    /// Divisor from clock ticks to seconds.
    ticks_per_second: u64,
    /// Whether the processes they started count too.
    descendants: bool,
}

/// Resident memory of a process, KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Memory {
    /// `VmRSS`: resident now.
    pub rss_kib: u64,
    /// `VmHWM`: highest resident size since the process started.
    pub hwm_kib: u64,
}

impl ProcessStats {
    /// Observes `pid`; fails if the process does not exist or /proc is unreadable.
    pub fn new(pid: u32) -> io::Result<Self> {
        Self::group(&[pid])
    }

    /// Observes `pids` and their descendants; fails if one does not exist.
    pub fn group(pids: &[u32]) -> io::Result<Self> {
        let stats = ProcessStats { pids: pids.to_vec(), ticks_per_second: clock_ticks_per_second(), descendants: true };
        for &pid in pids {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        }
        stats.cpu_seconds()?;
        Ok(stats)
    }

    /// This process alone, without the processes it started: the generator's own cost
    /// (`compare` starts the servers it measures as its children).
    pub fn own() -> io::Result<Self> {
        Ok(ProcessStats { descendants: false, ..Self::new(std::process::id())? })
    }

    /// The first observed pid.
    pub fn pid(&self) -> u32 {
        self.pids.first().copied().unwrap_or(0)
    }

    /// The observed processes now: the roots and every live descendant.
    fn members(&self) -> Vec<u32> {
        if !self.descendants || (self.pids.len() == 1 && !has_children(self.pids[0])) {
            return self.pids.clone();
        }
        let mut parent = Vec::new();
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for e in dir.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
                if let Some(ppid) =
                    std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|s| parse_stat_ppid(&s))
                {
                    parent.push((pid, ppid));
                }
            }
        }
        let mut members = self.pids.clone();
        let mut i = 0;
        while i < members.len() {
            let p = members[i];
            members.extend(parent.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
            i += 1;
        }
        members
    }

    /// User plus system CPU seconds used so far by all threads of the processes.
    pub fn cpu_seconds(&self) -> io::Result<f64> {
        let mut ticks = 0;
        for (n, pid) in self.members().into_iter().enumerate() {
            match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Ok(stat) => {
                    ticks += parse_stat_cpu_ticks(&stat)
                        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable /proc/PID/stat"))?
                }
                // A descendant may have ended since it was listed.
                Err(_) if n >= self.pids.len() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(ticks as f64 / self.ticks_per_second as f64)
    }

    /// Resident memory now and its high-water mark, summed over the processes.
    pub fn memory(&self) -> io::Result<Memory> {
        let mut total = Memory::default();
        for (n, pid) in self.members().into_iter().enumerate() {
            let status = match std::fs::read_to_string(format!("/proc/{pid}/status")) {
                Ok(s) => s,
                Err(_) if n >= self.pids.len() => continue,
                Err(e) => return Err(e),
            };
            let field = |key| {
                parse_status_kib(&status, key)
                    .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("no {key} in status")))
            };
            total.rss_kib += field("VmRSS")?;
            total.hwm_kib += field("VmHWM")?;
        }
        Ok(total)
    }

    /// One reading of both, for before/after comparisons.
    pub fn sample(&self) -> io::Result<Sample> {
        Ok(Sample { cpu_seconds: self.cpu_seconds()?, memory: self.memory()? })
    }
}

/// Whether `pid` has started a process that still runs (`/proc/PID/task/*/children`).
fn has_children(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return true };
    tasks.flatten().any(|t| std::fs::read_to_string(t.path().join("children")).map_or(true, |c| !c.trim().is_empty()))
}

/// CPU and memory at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    /// Cumulative CPU seconds.
    pub cpu_seconds: f64,
    /// Resident memory.
    pub memory: Memory,
}

/// `getconf CLK_TCK`, or 100 when it cannot be run.
pub fn clock_ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(DEFAULT_CLK_TCK)
}

/// `utime + stime` in clock ticks from the text of `/proc/PID/stat`. The command name
/// (field 2) is in parentheses and may itself contain spaces and parentheses, so the
/// fields are counted from the last `)`: utime and stime are fields 14 and 15.
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    // after_name starts at field 3 (state); utime is field 14, i.e. the 12th from here.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// The parent pid (field 4) from the text of `/proc/PID/stat`.
pub fn parse_stat_ppid(stat: &str) -> Option<u32> {
    stat[stat.rfind(')')? + 1..].split_whitespace().nth(1)?.parse().ok()
}

/// The value in KiB of a `Key:   1234 kB` line of `/proc/PID/status`.
pub fn parse_status_kib(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The soft limit on open files of this process ("Max open files" in /proc/self/limits);
/// `None` if unlimited or unreadable.
pub fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..].split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let stat = "4242 (my (odd) srv) S 1 4242 4242 0 -1 4194560 1000 0 0 0 \
                    250 75 0 0 20 0 9 0 12345 1000000 2500 18446744073709551615";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(325));
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
        assert_eq!(parse_stat_ppid(stat), Some(1));
    }

    #[test]
    fn status_lines_give_kib() {
        let status = "Name:\tmosquitto\nVmHWM:\t    8120 kB\nVmRSS:\t    7004 kB\n";
        assert_eq!(parse_status_kib(status, "VmRSS"), Some(7004));
        assert_eq!(parse_status_kib(status, "VmHWM"), Some(8120));
        assert_eq!(parse_status_kib(status, "VmSwap"), None);
    }

    #[test]
    fn own_leaves_out_the_processes_this_one_started() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let with = ProcessStats::new(std::process::id()).unwrap().members();
        let own = ProcessStats::own().unwrap().members();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(with.contains(&child.id()), "{with:?}");
        assert_eq!(own, vec![std::process::id()]);
    }

    #[test]
    fn own_process_is_readable() {
        let me = ProcessStats::new(std::process::id()).unwrap();
        let sample = me.sample().unwrap();
        assert!(sample.cpu_seconds >= 0.0);
        assert!(sample.memory.rss_kib > 0 && sample.memory.hwm_kib >= sample.memory.rss_kib);
    }
}

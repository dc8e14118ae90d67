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

/// Handle on one process's counters.
#[derive(Debug, Clone)]
pub struct ProcessStats {
    /// The observed process.
    pid: u32,
    /// Divisor from clock ticks to seconds.
    ticks_per_second: u64,
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
        let stats = ProcessStats { pid, ticks_per_second: clock_ticks_per_second() };
        stats.cpu_seconds()?;
        Ok(stats)
    }

    /// The observed pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// User plus system CPU seconds used so far by all threads of the process.
    pub fn cpu_seconds(&self) -> io::Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))?;
        let ticks = parse_stat_cpu_ticks(&stat)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable /proc/PID/stat"))?;
        Ok(ticks as f64 / self.ticks_per_second as f64)
    }

    /// Resident memory now and its high-water mark.
    pub fn memory(&self) -> io::Result<Memory> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        let field = |key| {
            parse_status_kib(&status, key)
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("no {key} in status")))
        };
        Ok(Memory { rss_kib: field("VmRSS")?, hwm_kib: field("VmHWM")? })
    }

    /// One reading of both, for before/after comparisons.
    pub fn sample(&self) -> io::Result<Sample> {
        Ok(Sample { cpu_seconds: self.cpu_seconds()?, memory: self.memory()? })
    }
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
    }

    #[test]
    fn status_lines_give_kib() {
        let status = "Name:\tmosquitto\nVmHWM:\t    8120 kB\nVmRSS:\t    7004 kB\n";
        assert_eq!(parse_status_kib(status, "VmRSS"), Some(7004));
        assert_eq!(parse_status_kib(status, "VmHWM"), Some(8120));
        assert_eq!(parse_status_kib(status, "VmSwap"), None);
    }

    #[test]
    fn own_process_is_readable() {
        let me = ProcessStats::new(std::process::id()).unwrap();
        let sample = me.sample().unwrap();
        assert!(sample.cpu_seconds >= 0.0);
        assert!(sample.memory.rss_kib > 0 && sample.memory.hwm_kib >= sample.memory.rss_kib);
    }
}

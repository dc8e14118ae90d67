//! Free space of the data directory's file system, as the writer sees it: read with
//! `statvfs` at most every [`REFRESH`], so a busy writer pays one syscall per 100 ms.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a reading is reused.
const REFRESH: Duration = Duration::from_millis(100);

/// The last reading.
pub(crate) struct Space {
    path: CString,
    read_at: Option<Instant>,
    free: Option<u64>,
}

impl Space {
    /// Watches the file system holding `dir`.
    pub fn new(dir: &Path) -> Self {
        Self { path: CString::new(dir.as_os_str().as_bytes()).unwrap_or_default(), read_at: None, free: None }
    }

    /// Bytes available to an unprivileged writer; `None` when the file system cannot be read.
    pub fn free(&mut self) -> Option<u64> {
        if self.read_at.is_none_or(|t| t.elapsed() >= REFRESH) {
            self.free = statvfs_free(&self.path);
            self.read_at = Some(Instant::now());
        }
        self.free
    }

    /// Forgets the last reading (after a failure, the next check must look again).
    pub fn invalidate(&mut self) {
        self.read_at = None;
    }
}

fn statvfs_free(path: &CString) -> Option<u64> {
    // SAFETY: an all-zero statvfs is a valid value; statvfs only writes into it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `st` is a valid, writable statvfs.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::Space;

    #[test]
    fn reads_the_free_space_of_a_real_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Space::new(dir.path());
        assert!(s.free().is_some_and(|f| f > 0));
        assert!(Space::new(std::path::Path::new("/no/such/dir")).free().is_none());
    }
}

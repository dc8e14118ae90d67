//! The JWT signing secret, in a file only the server's user may read (0600): by default
//! `{data_dir}/jwt.secret`, or `auth.jwt_secret_file`. `gridlinks admin rotate-secret`
//! writes a new one; the running server notices within [`WATCH_INTERVAL`] and every
//! session is logged out. (A secret given inline as `auth.jwt_secret` is used as is and
//! rotated by changing the configuration.)

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::Config;

/// How often the running server reads the secret file for a change.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(2);

/// Where the secret lives for `cfg`.
pub fn path(cfg: &Config) -> PathBuf {
    if cfg.auth.jwt_secret_file.as_os_str().is_empty() {
        cfg.data_dir.join("jwt.secret")
    } else {
        cfg.auth.jwt_secret_file.clone()
    }
}

/// A fresh random secret (248 random bits as 48 alphanumeric characters).
pub fn generate() -> Vec<u8> {
    let mut secret: Vec<u8> = (0..3).flat_map(|_| gridlinks_storage::generate_token().into_bytes()).collect();
    secret.truncate(48);
    secret
}

/// Reads the secret file.
pub fn read(path: &Path) -> std::io::Result<Vec<u8>> {
    let s = std::fs::read(path)?;
    let trimmed = s.trim_ascii();
    if trimmed.len() < 16 {
        return Err(std::io::Error::other(format!("{}: a JWT secret must be at least 16 bytes", path.display())));
    }
    Ok(trimmed.to_vec())
}

/// Writes `secret` to `path` atomically (a 0600 temporary file, synced, renamed over it).
pub fn write(path: &Path, secret: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    // An existing file keeps the mode it had; make sure it is ours alone.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(secret)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// The secret at `path`, created if missing: from `legacy` (a secret an older version kept
/// in the store) when given, else fresh.
pub fn load_or_create(path: &Path, legacy: Option<Vec<u8>>) -> std::io::Result<Vec<u8>> {
    match read(path) {
        Ok(s) => Ok(s),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let secret = legacy.unwrap_or_else(generate);
            write(path, &secret)?;
            Ok(secret)
        }
        Err(e) => Err(e),
    }
}

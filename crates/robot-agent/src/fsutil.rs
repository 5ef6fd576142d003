//! Small file helpers: atomic replacement and private (0600) files.
//!
//! Everything the agent persists (locations, settings, keys) goes through
//! here so that a power cut never leaves a half-written file behind and
//! secrets are never readable by other users, not even for a moment.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of every file the agent writes: the data is either secret (keys) or
/// robot state that only the agent's user has any business reading.
pub const PRIVATE_MODE: u32 = 0o600;

/// Replaces `path` with `bytes` atomically: the data goes to a temporary
/// file in the same directory, is flushed to disk, and is then renamed over
/// the target, so readers see either the old or the new content, never a mix.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = parent_dir(path);
    fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        uuid::Uuid::new_v4().simple()
    ));
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(PRIVATE_MODE)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        // The rename is only durable once the directory entry is on disk.
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Creates `path` with mode 0600, failing if it exists: keys are never
/// overwritten by accident.
pub fn write_new_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    fs::create_dir_all(parent_dir(path))?;
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(PRIVATE_MODE)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// Tightens an existing file to 0600 (a key copied in by hand may be 0644).
pub fn make_private(path: &Path) -> io::Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(PRIVATE_MODE))
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_is_private() {
        let dir = crate::testutil::temp_dir("fsutil");
        let path = dir.join("state.json");
        write_atomic(&path, b"one").expect("first write");
        write_atomic(&path, b"two").expect("second write");
        assert_eq!(fs::read(&path).expect("read"), b"two");
        let mode = fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // No temporary files are left behind.
        let leftovers: Vec<_> = fs::read_dir(&dir)
            .expect("list")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn new_private_refuses_to_overwrite() {
        let dir = crate::testutil::temp_dir("fsutil-new");
        let path = dir.join("agent.key");
        write_new_private(&path, b"secret").expect("create");
        assert!(write_new_private(&path, b"other").is_err());
        assert_eq!(fs::read(&path).expect("read"), b"secret");
    }
}

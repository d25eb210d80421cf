//! Atomic file I/O for the data directory's files: a write goes to a temporary file, is
//! fsync'd, renamed over the old file, and the directory is fsync'd, so a crash leaves
//! either the old or the new file, never a torn one.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

/// Reads `data_dir/name` as JSON (`what` names it in errors). `Ok(None)` when it does not
/// exist; any other read error, or contents that do not parse, is an error.
pub(crate) fn read_json<T: DeserializeOwned>(
    data_dir: &Path,
    name: &str,
    what: &str,
) -> io::Result<Option<T>> {
    let path = data_dir.join(name);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    serde_json::from_slice(&bytes).map(Some).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("\"{}\" is not a valid {what}: {e}", path.display()),
        )
    })
}

/// Writes `value` as JSON to `data_dir/name`: a temporary file, fsync, rename, fsync of the
/// directory. A crash leaves the old file or the new one, never a torn one.
pub(crate) fn write_json<T: Serialize>(data_dir: &Path, name: &str, value: &T) -> io::Result<()> {
    let mut body = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    body.push(b'\n');
    write_atomically(data_dir, name, &body)
}

/// Replaces `data_dir/name` with `body`: a temporary file, fsync, rename, fsync of the
/// directory. A crash leaves the old file or the new one, never a torn one.
pub(crate) fn write_atomically(data_dir: &Path, name: &str, body: &[u8]) -> io::Result<()> {
    let tmp = data_dir.join(format!("{name}.tmp"));
    {
        let mut f = File::create(&tmp)?;
        f.write_all(body)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, data_dir.join(name))?;
    File::open(data_dir)?.sync_all()
}

/// A fresh, empty directory under the system's temporary directory, for a test's files.
#[cfg(test)]
pub(crate) fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("snowflake-durable-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

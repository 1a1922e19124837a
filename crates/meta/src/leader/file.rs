//! [`FileLease`]: the lease as an exclusive `flock` on one file beside the
//! embedded index. The kernel drops the lock when its holder exits, however
//! it exits, so the lease has no TTL: it lasts while the holder lives. The
//! file holds the last holder's `<epoch>|<node>`, so epochs keep growing
//! across holders and restarts.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use parking_lot::Mutex;
use rustix::fs::{FlockOperation, flock};

use super::store::{Holder, LeaseError, LeaseResult, LeaseStore, decode, encode};

/// Bytes of the lock file's record (longer node ids make it longer).
const RECORD_WIDTH: usize = 256;

/// Mode of a lock file this process creates.
const LOCK_FILE_MODE: u32 = 0o600;

/// The leader lease as a lock file.
#[derive(Debug)]
pub struct FileLease {
    path: PathBuf,
    /// The locked file and the epoch it was taken under, while held.
    held: Mutex<Option<(File, String, u64)>>,
}

impl FileLease {
    /// The lease of lock file `path` (created on first use).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FileLease {
            path: path.into(),
            held: Mutex::new(None),
        }
    }

    fn err(&self, source: std::io::Error) -> LeaseError {
        LeaseError::File {
            path: self.path.clone(),
            source,
        }
    }

    /// Opens the lock file, made mode 0600 (its owner's user only) if
    /// missing. One of ours with a wider mode (an older build's 0644) is
    /// narrowed; another user's is left as its owner made it.
    fn open(&self) -> LeaseResult<File> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(LOCK_FILE_MODE)
            .open(&self.path)
            .map_err(|e| self.err(e))?;
        let meta = f.metadata().map_err(|e| self.err(e))?;
        if meta.uid() == rustix::process::geteuid().as_raw()
            && meta.mode() & 0o7777 != LOCK_FILE_MODE
        {
            f.set_permissions(std::fs::Permissions::from_mode(LOCK_FILE_MODE))
                .map_err(|e| self.err(e))?;
        }
        Ok(f)
    }

    /// The file's `<epoch>|<node>`, if it has one.
    fn stored(&self, f: &mut File) -> LeaseResult<Option<(u64, String)>> {
        let mut s = String::new();
        f.seek(SeekFrom::Start(0)).map_err(|e| self.err(e))?;
        f.read_to_string(&mut s).map_err(|e| self.err(e))?;
        let s = s.trim();
        if s.is_empty() {
            return Ok(None);
        }
        decode(s).map(Some)
    }

    /// Takes the lock without waiting; `false` if another holder has it.
    fn lock(&self, f: &File, op: FlockOperation) -> LeaseResult<bool> {
        match flock(f, op) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
            Err(e) => Err(self.err(e.into())),
        }
    }

    /// Records the new holder durably: the next one must see this epoch.
    /// One write of a fixed width (space-padded) over the old value, never
    /// a truncation first, so a reader sees the old value or the new one.
    fn record(&self, f: &mut File, epoch: u64, node: &str) -> LeaseResult<()> {
        let value = encode(epoch, node);
        let line = format!("{value:<width$}\n", width = RECORD_WIDTH.max(value.len()));
        f.seek(SeekFrom::Start(0)).map_err(|e| self.err(e))?;
        f.write_all(line.as_bytes()).map_err(|e| self.err(e))?;
        f.set_len(line.len() as u64).map_err(|e| self.err(e))?;
        f.sync_data().map_err(|e| self.err(e))
    }
}

/// The path of the lock file next to `dir`'s embedded index.
pub fn lock_path(dir: &Path) -> PathBuf {
    dir.join("meta.leader.lock")
}

impl LeaseStore for FileLease {
    fn try_acquire(&self, node: &str, _ttl: Duration) -> LeaseResult<Option<u64>> {
        let mut held = self.held.lock();
        if let Some((_, n, e)) = held.as_ref() {
            return Ok((n == node).then_some(*e));
        }
        let mut f = self.open()?;
        if !self.lock(&f, FlockOperation::NonBlockingLockExclusive)? {
            return Ok(None);
        }
        let epoch = self.stored(&mut f)?.map_or(0, |(e, _)| e) + 1;
        self.record(&mut f, epoch, node)?;
        *held = Some((f, node.to_owned(), epoch));
        Ok(Some(epoch))
    }

    fn renew(&self, node: &str, epoch: u64, _ttl: Duration) -> LeaseResult<bool> {
        let held = self.held.lock();
        Ok(matches!(held.as_ref(), Some((_, n, e)) if n == node && *e == epoch))
    }

    fn release(&self, node: &str, epoch: u64) -> LeaseResult<()> {
        let mut held = self.held.lock();
        if matches!(held.as_ref(), Some((_, n, e)) if n == node && *e == epoch) {
            // Closing the file drops the lock.
            *held = None;
        }
        Ok(())
    }

    fn holder(&self) -> LeaseResult<Option<Holder>> {
        if let Some((_, n, e)) = self.held.lock().as_ref() {
            return Ok(Some(Holder {
                node: n.clone(),
                epoch: *e,
            }));
        }
        let mut f = self.open()?;
        // A shared lock is refused only while someone holds the exclusive
        // one; taken, it is dropped again when `f` closes.
        if self.lock(&f, FlockOperation::NonBlockingLockShared)? {
            return Ok(None);
        }
        Ok(self
            .stored(&mut f)?
            .map(|(epoch, node)| Holder { node, epoch }))
    }
}

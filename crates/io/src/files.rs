//! [`FileTable`]: the files an engine owns, by [`FileId`].

use std::fs::File;
use std::io;

use parking_lot::RwLock;

use crate::FileId;

/// Files registered with an engine. Files are only ever added, never removed
/// or replaced, so a descriptor looked up once stays valid for as long as the
/// table lives; engines rely on that to use raw descriptors in flight.
#[derive(Debug, Default)]
pub(crate) struct FileTable {
    files: RwLock<Vec<File>>,
}

impl FileTable {
    /// Adds `file`; its id is its index.
    pub(crate) fn add(&self, file: File) -> io::Result<FileId> {
        let mut files = self.files.write();
        let id = u32::try_from(files.len())
            .map_err(|_| io::Error::other("too many files registered"))?;
        files.push(file);
        Ok(FileId(id))
    }

    /// Runs `f` with the table read-locked, for looking up many ids at once.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&[File]) -> R) -> R {
        f(&self.files.read())
    }
}

/// The error an operation on an unregistered [`FileId`] completes with.
pub(crate) fn bad_file() -> io::Error {
    io::Error::from_raw_os_error(libc::EBADF)
}

//! [`FileTable`]: the files an engine owns, by [`FileId`].

use std::fs::File;
use std::io;

use parking_lot::RwLock;

use crate::FileId;

/// Files registered with an engine, by id (an index; a closed file's index
/// is reused by the next registration). A file is removed only by
/// [`IoEngine::close_file`](crate::IoEngine::close_file), whose caller has
/// waited for every operation on it, so a descriptor looked up at
/// submission stays valid while its operation is in flight; engines rely on
/// that to use raw descriptors.
#[derive(Debug, Default)]
pub(crate) struct FileTable {
    files: RwLock<Vec<Option<File>>>,
}

impl FileTable {
    /// Adds `file` at the lowest free index, which is its id.
    pub(crate) fn add(&self, file: File) -> io::Result<FileId> {
        let mut files = self.files.write();
        let index = match files.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                files.push(None);
                files.len() - 1
            }
        };
        let id = u32::try_from(index).map_err(|_| io::Error::other("too many files registered"))?;
        files[index] = Some(file);
        Ok(FileId(id))
    }

    /// Removes and returns file `id`; `None` if it is not registered.
    pub(crate) fn remove(&self, id: FileId) -> Option<File> {
        self.files.write().get_mut(id.0 as usize)?.take()
    }

    /// Runs `f` with the table read-locked, for looking up many ids at once.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&[Option<File>]) -> R) -> R {
        f(&self.files.read())
    }
}

/// The error an operation on an unregistered [`FileId`] completes with.
pub(crate) fn bad_file() -> io::Error {
    io::Error::from_raw_os_error(libc::EBADF)
}

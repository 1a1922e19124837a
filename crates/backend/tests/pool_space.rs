//! FilePool space reservation on a real, small file system (a tmpfs mounted
//! for the test): a pool that does not fit is refused with the sizes named
//! and no file created; one that fits is reserved block for block and opens
//! again after a restart.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kvtier_backend::{FilePool, FilePoolOptions, PoolSpaceError};
use kvtier_meta::test_support::Tmpfs;

/// An 8 MiB tmpfs.
fn small_fs() -> Tmpfs {
    Tmpfs::mount(8 << 20).expect("a tmpfs to run out of space on (this test needs root)")
}

fn opts(file_size: u64, files: u32) -> FilePoolOptions {
    FilePoolOptions {
        file_size,
        files,
        preallocate: true,
        probe_timeout: Duration::from_secs(5),
    }
}

fn pool_files(dir: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries.map_while(Result::ok).map(|e| e.path()).collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn a_pool_larger_than_its_file_system_is_refused_and_creates_nothing() {
    let fs = small_fs();
    let dir = fs.path().join("pool");
    let err = FilePool::open(&dir, &opts(4 << 20, 4)).expect_err("16 MiB pool on 8 MiB");
    let space = PoolSpaceError::find(&err).unwrap_or_else(|| panic!("not a space error: {err}"));
    assert_eq!(space.wanted, 16 << 20);
    assert_eq!(space.missing, 16 << 20);
    assert!(space.available <= 8 << 20, "{space:?}");
    assert_eq!(space.dir, dir);
    let msg = err.to_string();
    for part in [
        (16u64 << 20).to_string(),
        space.available.to_string(),
        dir.display().to_string(),
    ] {
        assert!(msg.contains(&part), "{msg:?} does not name {part}");
    }
    assert_eq!(pool_files(&dir), Vec::<PathBuf>::new(), "files left behind");
}

#[test]
fn sparse_files_left_by_older_builds_count_as_unreserved() {
    let fs = small_fs();
    let dir = fs.path().join("pool");
    std::fs::create_dir(&dir).unwrap();
    // Full length, no blocks: what a build that ignored ENOSPC left.
    for i in 0..4 {
        let f = std::fs::File::create(dir.join(format!("pool-{i:04}.kv"))).unwrap();
        f.set_len(4 << 20).unwrap();
    }
    let err = FilePool::open(&dir, &opts(4 << 20, 4)).expect_err("sparse 16 MiB on 8 MiB");
    assert!(PoolSpaceError::find(&err).is_some(), "{err}");
}

#[test]
fn a_pool_that_fits_is_reserved_and_reopens() {
    let fs = small_fs();
    let dir = fs.path().join("pool");
    let file_size = 1536 << 10;
    let pool = FilePool::open(&dir, &opts(file_size, 4)).expect("6 MiB pool on 8 MiB");
    for i in 0..4 {
        let m = std::fs::metadata(pool.file_path(i)).unwrap();
        assert_eq!(m.len(), file_size);
        assert!(m.blocks() * 512 >= file_size, "file {i} is sparse");
    }
    drop(pool);
    // A restart: less is free now than the pool's size, but the pool's own
    // reserved blocks count.
    FilePool::open(&dir, &opts(file_size, 4)).expect("reopen the reserved pool");
}

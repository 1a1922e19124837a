//! The directory lock: held while a tier lives, released the moment its
//! last handle is dropped, whatever else the process is doing meanwhile.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;

use kvtier_disk::DiskTier;

use crate::common::*;

/// A child process forked while a tier is open gets a copy of every
/// descriptor, the lock file's included, and keeps it until it execs
/// (close-on-exec closes it only then). Any thread may fork at any time:
/// the test harness runs tests in parallel and `crash` spawns children, so
/// once a full-suite run caught a re-open between another test's fork and
/// its exec and failed with `Locked`. Here the child is held in that window
/// on purpose, and the directory must still be free once the tier is
/// closed and dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_tier_frees_its_directory_while_a_child_is_between_fork_and_exec() {
    let (_t, d) = dirs(1);
    let g = geometry();
    let blocks = Blocks::range(&g, 7, 0..20);
    let tier = DiskTier::open(config(d.clone(), 4 * REGION), Kind::Psync.engine()).unwrap();
    put_all(&tier, &blocks, 20).await;
    tier.close().await.unwrap();

    // `forked` tells us the child exists; `go` lets it exec. Both are
    // close-on-exec, like the lock file: a fork copies them, the exec
    // closes them.
    let (mut forked_rx, forked_tx) = std::io::pipe().unwrap();
    let (go_rx, mut go_tx) = std::io::pipe().unwrap();
    let spawner = std::thread::spawn(move || {
        let (signal, wait) = (forked_tx.as_raw_fd(), go_rx.as_raw_fd());
        let mut cmd = Command::new("true");
        // SAFETY: between fork and exec the hook calls only write(2) and
        // read(2), which are async-signal-safe, on descriptors this thread
        // keeps open until `spawn` returns.
        unsafe {
            cmd.pre_exec(move || {
                let mut byte = 0u8;
                libc::write(signal, (&raw const byte).cast(), 1);
                libc::read(wait, (&raw mut byte).cast(), 1);
                Ok(())
            });
        }
        // Returns once the child has exec'd (or failed to); dropping the
        // pipe ends afterwards turns a failed spawn into EOF for the reader.
        let status = cmd.spawn().and_then(|mut c| c.wait());
        drop((forked_tx, go_rx));
        status
    });
    let mut byte = [0u8];
    forked_rx
        .read_exact(&mut byte)
        .expect("the child never reached its pre-exec hook");

    drop(tier);
    let reopened = DiskTier::open(config(d.clone(), 4 * REGION), Kind::Psync.engine());

    // Let the child go before judging, so a failure does not leave it hanging.
    std::io::Write::write_all(&mut go_tx, &[1]).unwrap();
    let status = spawner.join().unwrap().expect("spawn true");
    assert!(status.success(), "{status}");
    let tier = reopened.expect("re-open right after close and drop");
    check_all_hit(&tier, &blocks.keys).await;
}

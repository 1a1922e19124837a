//! `kvtier serve` out of file descriptors (docs/node-protocol.md §7, I23):
//! with its descriptor limit lowered to a few more than it uses, clients
//! past the limit get a clear `BUSY` refusal, connections that wait in the
//! socket's queue do not make the daemon spin (its CPU time over an
//! interval stays far below one busy core), the log gets a handful of
//! lines about it rather than one per attempt, and once descriptors are
//! free again new clients are served.

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use kvtier_client::{Client, ClientError, ErrorCode};
use support::node::{Daemon, shm_name, wait_until};

mod support;

/// Descriptors the daemon may open beyond those it holds once started.
const HEADROOM: u64 = 16;
/// Clients tried: well past the headroom.
const CLIENTS: usize = 40;
/// Connections left waiting in the queue while CPU time is measured.
const QUEUED: usize = 8;
/// How long the daemon's CPU time is measured for.
const INTERVAL: Duration = Duration::from_secs(2);

/// Descriptors `pid` holds now.
fn open_fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("list the daemon's descriptors")
        .count() as u64
}

/// Lowers `pid`'s descriptor limit (soft and hard) to `n`.
fn limit_fds(pid: u32, n: u64) {
    let limit = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    let pid = libc::pid_t::try_from(pid).expect("a pid");
    // SAFETY: prlimit reads `limit` and writes nothing (no old limit).
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &limit, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
}

/// CPU time `pid` has used (user and system), from /proc/<pid>/stat.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    // Fields after the command name (which may hold spaces) start at 3.
    let rest = &stat[stat.rfind(')').expect("a command name") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf has no memory effects.
    let per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / per_sec)
}

/// Log lines about failing accepts and refused connections.
fn trouble_lines(daemon: &Daemon) -> usize {
    daemon
        .log()
        .iter()
        .filter(|l| l.contains("accepting node connections") || l.contains("refusing node"))
        .count()
}

#[test]
fn out_of_descriptors_clients_are_refused_busy_without_a_spin_or_a_flood() {
    let data = tempfile::tempdir().expect("data dir");
    let daemon = Daemon::start(data.path(), &shm_name("fds"), &[]);
    let pid = daemon.pid();
    limit_fds(pid, open_fds(pid) + HEADROOM);

    let mut served = Vec::new();
    let mut refusals = 0;
    // A client that waits in the queue gives up sooner than by default.
    let config = daemon.client_config().with_timeout(Duration::from_secs(3));
    for _ in 0..CLIENTS {
        match Client::connect(config.clone()) {
            Ok(c) => served.push(c),
            Err(ClientError::Refused { code, message }) if code == ErrorCode::BUSY => {
                assert!(message.contains("file descriptors"), "{message}");
                refusals += 1;
            }
            // The spare descriptor is busy with the last refusal: this one
            // waited in the queue and gave up, or was closed unanswered.
            Err(ClientError::Timeout(_) | ClientError::Disconnected) => {}
            Err(e) => panic!("a client past the descriptor limit: {e}"),
        }
    }
    assert!(
        !served.is_empty() && served.len() < CLIENTS,
        "{} served",
        served.len()
    );
    assert!(refusals > 0, "no client was told why it was refused");

    // Connections that say nothing wait in the queue while the daemon has
    // no descriptor for them: it must not spin on them.
    let queued: Vec<UnixStream> = (0..QUEUED)
        .map(|_| UnixStream::connect(daemon.socket()).expect("queue a connection"))
        .collect();
    let (cpu0, t0) = (cpu_time(pid), Instant::now());
    std::thread::sleep(INTERVAL);
    let (cpu, wall) = (cpu_time(pid) - cpu0, t0.elapsed());
    assert!(
        cpu.as_secs_f64() < 0.3 * wall.as_secs_f64(),
        "the daemon used {cpu:?} of CPU in {wall:?} while out of descriptors"
    );
    let lines = trouble_lines(&daemon);
    assert!(
        (1..=10).contains(&lines),
        "{lines} log lines about accepts and refusals"
    );

    drop(queued);
    drop(served);
    let mut again = wait_until("a client to be served again", || {
        Client::connect(daemon.client_config()).ok()
    });
    again.stats().expect("stats");
    assert!(trouble_lines(&daemon) <= 10);
}

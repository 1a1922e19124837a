//! A small blocking connection pool, so concurrent callers do not queue on
//! one socket. Connections open lazily up to the pool size; a connection
//! that saw a connection-level error is dropped together with every idle
//! one (they most likely point at the same dead server), so the first call
//! after the server comes back opens a fresh connection instead of failing
//! on a stale one.

use std::time::Instant;

use ::redis::{Client, Connection, ConnectionLike, RedisError};
use parking_lot::{Condvar, Mutex};

use super::RedisTimeouts;
use super::error::RedisIndexError;

#[derive(Default)]
struct State {
    idle: Vec<Connection>,
    open: usize,
}

/// Up to `size` connections to one server.
pub(super) struct Pool {
    client: Client,
    size: usize,
    timeouts: RedisTimeouts,
    state: Mutex<State>,
    returned: Condvar,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state.lock();
        f.debug_struct("Pool")
            .field("server", &self.client.get_connection_info().addr())
            .field("size", &self.size)
            .field("open", &st.open)
            .field("idle", &st.idle.len())
            .finish()
    }
}

impl Pool {
    pub(super) fn new(client: Client, size: usize, timeouts: RedisTimeouts) -> Self {
        Pool {
            client,
            size: size.max(1),
            timeouts,
            state: Mutex::new(State::default()),
            returned: Condvar::new(),
        }
    }

    /// An idle connection, a new one while fewer than `size` are open, or
    /// the first one given back within `lock_wait`.
    pub(super) fn get(&self) -> Result<Pooled<'_>, RedisIndexError> {
        let wait = self.timeouts.lock_wait;
        let deadline = Instant::now() + wait;
        let mut st = self.state.lock();
        loop {
            if let Some(conn) = st.idle.pop() {
                return Ok(Pooled::new(self, conn));
            }
            if st.open < self.size {
                st.open += 1;
                drop(st);
                return match self.connect() {
                    Ok(conn) => Ok(Pooled::new(self, conn)),
                    Err(e) => {
                        self.forget_one();
                        Err(e.into())
                    }
                };
            }
            if self.returned.wait_until(&mut st, deadline).timed_out() {
                return Err(RedisIndexError::PoolExhausted(wait));
            }
        }
    }

    fn connect(&self) -> Result<Connection, RedisError> {
        let conn = self
            .client
            .get_connection_with_timeout(self.timeouts.connect)?;
        conn.set_read_timeout(Some(self.timeouts.response))?;
        conn.set_write_timeout(Some(self.timeouts.response))?;
        Ok(conn)
    }

    /// One connection closed: make room for a new one.
    fn forget_one(&self) {
        let mut st = self.state.lock();
        st.open = st.open.saturating_sub(1);
        drop(st);
        self.returned.notify_one();
    }

    fn give_back(&self, conn: Connection) {
        self.state.lock().idle.push(conn);
        self.returned.notify_one();
    }

    /// Closes every idle connection (the server they reach went away).
    fn drop_idle(&self) {
        let mut st = self.state.lock();
        let n = st.idle.len();
        st.idle.clear();
        st.open = st.open.saturating_sub(n);
        drop(st);
        self.returned.notify_all();
    }
}

/// A checked-out connection; it goes back to the pool on drop unless a call
/// on it failed.
pub(super) struct Pooled<'a> {
    pool: &'a Pool,
    conn: Option<Connection>,
    healthy: bool,
}

impl<'a> Pooled<'a> {
    fn new(pool: &'a Pool, conn: Connection) -> Self {
        Pooled {
            pool,
            conn: Some(conn),
            healthy: true,
        }
    }

    /// Runs `f` on the connection. Any error retires the connection (it may
    /// hold a half-read reply or a `WATCH`); a connection-level error also
    /// retires every idle one.
    pub(super) fn run<T>(
        &mut self,
        f: impl FnOnce(&mut Connection) -> Result<T, RedisError>,
    ) -> Result<T, RedisIndexError> {
        let Some(conn) = self.conn.as_mut() else {
            return Err(RedisIndexError::Unexpected(
                "connection already returned".into(),
            ));
        };
        let result = f(conn);
        if let Err(e) = &result {
            self.retire();
            if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
                self.pool.drop_idle();
            }
        }
        result.map_err(RedisIndexError::from)
    }

    /// Do not reuse this connection (it may be in an unknown state).
    pub(super) fn retire(&mut self) {
        self.healthy = false;
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        match self.conn.take() {
            // A panic (say, in a modifier) can leave a WATCH behind.
            Some(conn) if self.healthy && conn.is_open() && !std::thread::panicking() => {
                self.pool.give_back(conn)
            }
            _ => self.pool.forget_one(),
        }
    }
}

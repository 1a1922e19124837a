//! The client's timeout, against a socket that accepts and never answers
//! (no node needed; the client's tests against a real node are in
//! `crates/node/tests/client.rs`).

use kvtier_client::{AsyncClient, ClientConfig, ClientError, Namespace, WireGeometry};

fn namespace() -> Namespace {
    Namespace {
        model: "test".into(),
        dtype: "f32".into(),
        layout_version: 1,
        block_size_tokens: 16,
        tp_rank: 0,
        tp_size: 1,
        tenant_salt: None,
    }
}

/// A daemon that accepts and never answers: the call fails with `Timeout`
/// (on a paused clock, so nothing waits for real).
#[test]
fn a_silent_daemon_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("silent.sock");
    // Connections queue in the backlog; nobody reads them.
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let geometry = WireGeometry {
        layers: 2,
        block_bytes: 16 << 10,
        layer_bytes: 8 << 10,
    };
    let mut config = ClientConfig::new(socket, namespace(), geometry);
    config.timeout = std::time::Duration::from_secs(30);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let err = rt.block_on(AsyncClient::connect(config)).unwrap_err();
    assert!(
        matches!(err, ClientError::Timeout(t) if t.as_secs() == 30),
        "{err}"
    );
    assert!(err.is_fatal());
}

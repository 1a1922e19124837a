//! The service's deletes through an attached backend: failed deletes are
//! retried, then given up and counted. (The service with real file pools
//! attached: `crates/backend/tests/service.rs`.)

use std::sync::Arc;

use kvtier_meta::test_support::world::{keys, service, uris};
use kvtier_meta::*;

const SPEC: u64 = 5000;

/// A backend whose deletes fail `fail_deletes` times before they work.
#[derive(Debug, Default)]
struct FlakyDeletes {
    fail_deletes: std::sync::atomic::AtomicU32,
    deleted: parking_lot::Mutex<Vec<String>>,
}

impl StorageBackend for FlakyDeletes {
    fn create<'a>(
        &'a self,
        requests: &'a [CreateRequest],
    ) -> BackendFuture<'a, Result<Vec<String>, BackendError>> {
        Box::pin(async move {
            Ok(requests
                .iter()
                .map(|r| format!("mem://{}/{:x}/{}", r.instance, r.location.0, r.spec))
                .collect())
        })
    }

    fn delete<'a>(
        &'a self,
        uris: &'a [String],
    ) -> BackendFuture<'a, Vec<Result<(), BackendError>>> {
        Box::pin(async move {
            let left = &self.fail_deletes;
            let fail = left
                .fetch_update(
                    std::sync::atomic::Ordering::AcqRel,
                    std::sync::atomic::Ordering::Acquire,
                    |n| n.checked_sub(1),
                )
                .is_ok();
            if fail {
                return uris
                    .iter()
                    .map(|_| Err(BackendError::Unavailable("flaky".into())))
                    .collect();
            }
            self.deleted.lock().extend(uris.iter().cloned());
            uris.iter().map(|_| Ok(())).collect()
        })
    }

    fn exist<'a>(
        &'a self,
        uris: &'a [String],
    ) -> BackendFuture<'a, Result<Vec<bool>, BackendError>> {
        Box::pin(async move { Ok(vec![false; uris.len()]) })
    }

    fn usage(&self) -> BackendFuture<'_, Result<BackendUsage, BackendError>> {
        Box::pin(async { Ok(BackendUsage::default()) })
    }

    fn health(&self) -> BackendFuture<'_, Result<(), BackendError>> {
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test(start_paused = true)]
async fn failed_deletes_are_retried_then_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let svc = service(
        Arc::new(MemoryIndex::new()),
        tmp.path(),
        &["plain"],
        MetaConfig::default(),
        SPEC,
    )
    .await;
    let backend = Arc::new(FlakyDeletes::default());
    svc.attach_backend("plain", backend.clone()).unwrap();
    let write = |r| {
        let svc = svc.clone();
        async move {
            let g = svc.start_write_cache("i", &keys(r)).await.unwrap();
            svc.finish_write_cache("i", g.session, &vec![true; g.blocks.len()])
                .await
                .unwrap();
            uris(&g)
        }
    };

    // Two failures, then the third attempt frees both parts.
    let first = write(0..1).await;
    assert!(first[0].starts_with("mem://i/"), "{first:?}");
    backend
        .fail_deletes
        .store(2, std::sync::atomic::Ordering::Release);
    svc.remove_cache("i", &keys(0..1)).await.unwrap();
    svc.wait_released().await;
    assert_eq!(*backend.deleted.lock(), first);
    let st = svc.backend_stats();
    assert_eq!(
        (st.deleted, st.delete_retries, st.delete_failures),
        (2, 4, 0)
    );

    // Failing every attempt: given up and counted, not retried forever.
    write(1..2).await;
    backend
        .fail_deletes
        .store(100, std::sync::atomic::Ordering::Release);
    svc.remove_cache("i", &keys(1..2)).await.unwrap();
    svc.wait_released().await;
    let st = svc.backend_stats();
    assert_eq!((st.deleted, st.delete_failures), (2, 2));
    assert_eq!(backend.deleted.lock().len(), 2);
    assert!(svc.detach_backend("plain").is_some());
}

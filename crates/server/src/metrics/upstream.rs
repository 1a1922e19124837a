//! `GetMetrics` entries under Tair KVCM's names and tags (docs/server.md
//! §7.1), from the same figures as kvtier's own entries.
//!
//! Per API (`api_name` tag, the RPC name; an RPC served on both the meta
//! and the admin service, and over both transports, is one series, as
//! upstream's collectors are shared): `service.query_counter` (int, calls),
//! `service.query_rt_us` (float, the last call's handling time in µs),
//! `service.error_counter` (int, calls answered with a code other than OK;
//! upstream never increments it) and `service.error_code` (float, the last
//! call's code). Service-wide: `meta_indexer.total_key_count`,
//! `cache_manager.write_location_expire_size` (open write sessions),
//! `cache_manager_group.usage_ratio{instance_group}`,
//! `cache_manager_instance.key_count{instance_group, instance_id}` and
//! `data_storage.healthy_status{type, unique_name}`. Upstream's other
//! gauges (its indexer's and searcher's internals) have no kvtier figure
//! and are left out rather than reported as zeros. Entries are sorted by
//! name, then tags, as upstream's registry is.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use kvtier_meta::proto::admin as pb;
use kvtier_meta::{MetaService, MetaStats, StorageKind};

use super::{MethodStats, clamp};

/// An entry before it is put on the wire: name, tags, value.
type Entry = (
    &'static str,
    Vec<(&'static str, String)>,
    pb::metric_value::Value,
);

/// One API's figures, merged over the methods that serve it.
#[derive(Default)]
struct Api {
    calls: u64,
    errors: u64,
    /// (ended at, handling time µs, code) of the latest call.
    last: (u64, f64, i64),
}

/// The upstream-named entries for `methods` (kvtier method names, the
/// admin service's prefixed with `admin.`) and the service's figures.
pub(super) fn entries(
    methods: &[(&'static str, Arc<MethodStats>)],
    stats: &MetaStats,
    svc: &MetaService,
) -> Vec<pb::MetricsData> {
    let mut all = per_api(methods);
    all.extend(service_wide(stats, svc));
    all.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    all.into_iter().map(to_wire).collect()
}

fn per_api(methods: &[(&'static str, Arc<MethodStats>)]) -> Vec<Entry> {
    use pb::metric_value::Value::{FloatValue, IntValue};
    let mut apis: BTreeMap<&'static str, Api> = BTreeMap::new();
    for (method, m) in methods {
        let name = method.strip_prefix("admin.").unwrap_or(method);
        let api = apis.entry(name).or_default();
        api.calls += m.calls.load(Ordering::Relaxed);
        api.errors += m.errors.load(Ordering::Relaxed);
        let at = m.last_at_ns.load(Ordering::Relaxed);
        if at >= api.last.0 {
            let us = f64::from_bits(m.last_us_bits.load(Ordering::Relaxed));
            api.last = (at, us, m.last_code.load(Ordering::Relaxed));
        }
    }
    let mut out = Vec::with_capacity(apis.len() * 4);
    for (name, a) in apis {
        let tags = || vec![("api_name", name.to_owned())];
        out.push(("service.query_counter", tags(), IntValue(clamp(a.calls))));
        out.push(("service.query_rt_us", tags(), FloatValue(a.last.1)));
        out.push(("service.error_counter", tags(), IntValue(clamp(a.errors))));
        out.push(("service.error_code", tags(), FloatValue(a.last.2 as f64)));
    }
    out
}

fn service_wide(stats: &MetaStats, svc: &MetaService) -> Vec<Entry> {
    use pb::metric_value::Value::FloatValue;
    let total_keys: u64 = stats.blocks_per_instance.values().sum();
    let mut out: Vec<Entry> = vec![
        (
            "meta_indexer.total_key_count",
            vec![],
            FloatValue(total_keys as f64),
        ),
        (
            "cache_manager.write_location_expire_size",
            vec![],
            FloatValue(stats.open_sessions as f64),
        ),
    ];
    for (group, g) in &stats.groups {
        // Upstream reports 0 for a group without a capacity.
        let ratio = match g.quota_bytes {
            0 | u64::MAX => 0.0,
            q => g.usage.total as f64 / q as f64,
        };
        let tags = vec![("instance_group", group.clone())];
        out.push(("cache_manager_group.usage_ratio", tags, FloatValue(ratio)));
    }
    for inst in svc.list_instances(None) {
        let keys = stats.blocks_per_instance.get(&inst.id).copied();
        let tags = vec![("instance_group", inst.group), ("instance_id", inst.id)];
        let value = FloatValue(keys.unwrap_or(0) as f64);
        out.push(("cache_manager_instance.key_count", tags, value));
    }
    for s in svc.list_storages() {
        // Disabled, failing, full or without a backend: not a storage
        // writes can use.
        let healthy = s.writable();
        let tags = vec![
            ("type", kind_name(s.kind).to_owned()),
            ("unique_name", s.name),
        ];
        let value = FloatValue(if healthy { 1.0 } else { 0.0 });
        out.push(("data_storage.healthy_status", tags, value));
    }
    out
}

/// The `type` tag of a storage: upstream's `file` for file pools, kvtier's
/// own words for the kinds upstream does not have, and upstream's names
/// for its memory stores (`pace` is its tair_mem_pool,
/// `data_storage/storage_config.cc`).
fn kind_name(kind: StorageKind) -> &'static str {
    match kind {
        StorageKind::FilePool => "file",
        StorageKind::S3 => "s3",
        StorageKind::KvtierNode => "kvtier_node",
        StorageKind::Mooncake => "mooncake",
        StorageKind::TairMemPool => "pace",
        StorageKind::FileObjects => "file_objects",
    }
}

fn to_wire((name, tags, value): Entry) -> pb::MetricsData {
    pb::MetricsData {
        metric_name: name.to_owned(),
        metric_value: Some(pb::MetricValue { value: Some(value) }),
        metric_tags: tags
            .into_iter()
            .map(|(k, v)| pb::MetricsTag {
                tag_key: k.to_owned(),
                tag_value: v,
            })
            .collect(),
    }
}

//! [`Metrics`]: request counters and latencies of both transports, plus the
//! service's own figures (`MetaService::stats`) refreshed at each read.
//! One instance per server, shared by every handler; exported as
//! Prometheus text at `GET /metrics` (admin HTTP) and as messages by the
//! `GetMetrics` admin call, from the same numbers: Tair KVCM's names first
//! (module `upstream`), then kvtier's own.
//!
//! Recording a request allocates nothing and takes only a shared read lock
//! once its method has been seen: each method's figures are atomics (and
//! the Prometheus handles cloned out of their families) behind a
//! read-mostly map.

mod upstream;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use kvtier_meta::MetaService;
use kvtier_meta::leader::Elector;
use kvtier_meta::proto::admin as pb;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InstanceLabels {
    instance: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupLabels {
    group: String,
}

/// The wire code of success.
const OK: i32 = kvtier_meta::proto::meta::ErrorCode::Ok as i32;

/// Wire result codes with a counter slot of their own; larger ones share
/// the last slot.
const CODE_SLOTS: usize = 64;

/// One method's figures, kept beside the Prometheus families because those
/// cannot be iterated (the `GetMetrics` call needs the values).
#[derive(Debug)]
struct MethodStats {
    calls: AtomicU64,
    /// Calls answered with a code other than `OK`.
    errors: AtomicU64,
    /// Total handling time, nanoseconds.
    sum_ns: AtomicU64,
    /// The last call: its handling time (µs, `f64` bits), its code, and
    /// when it ended (ns after the metrics were created), so the admin and
    /// meta entries of one RPC merge into upstream's single series.
    last_us_bits: AtomicU64,
    last_code: AtomicI64,
    last_at_ns: AtomicU64,
    latency: Histogram,
    /// `requests{method, code}` counters, created on a code's first use.
    by_code: [OnceLock<Counter>; CODE_SLOTS],
}

impl MethodStats {
    fn new(latency: Histogram) -> Self {
        MethodStats {
            calls: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
            last_us_bits: AtomicU64::new(0),
            last_code: AtomicI64::new(0),
            last_at_ns: AtomicU64::new(0),
            latency,
            by_code: std::array::from_fn(|_| OnceLock::new()),
        }
    }
}

/// The slot of wire code `code`.
fn code_slot(code: i32) -> usize {
    usize::try_from(code).map_or(CODE_SLOTS - 1, |c| c.min(CODE_SLOTS - 1))
}

/// The server's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<MethodLabels, Histogram>,
    in_flight: Gauge,
    in_flight_now: AtomicI64,
    blocks: Family<InstanceLabels, Gauge>,
    group_used: Family<GroupLabels, Gauge>,
    group_quota: Family<GroupLabels, Gauge>,
    group_instances: Family<GroupLabels, Gauge>,
    open_sessions: Gauge,
    leader: Gauge,
    leader_epoch: Gauge,
    reclaim_passes: Gauge,
    /// Per method name; written once per method, read on every request.
    methods: parking_lot::RwLock<HashMap<&'static str, Arc<MethodStats>>>,
    /// Zero of `MethodStats::last_at_ns`.
    born: Instant,
    /// The embedder's families, rendered at each scrape.
    extra: Extra,
}

/// [`ExtraMetrics`](crate::config::ExtraMetrics), shown by presence only.
struct Extra(Option<crate::config::ExtraMetrics>);

impl std::fmt::Debug for Extra {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Some(..)" } else { "None" })
    }
}

/// Decrements the in-flight gauge when the request ends, however it ends.
#[derive(Debug)]
pub struct InFlight<'a>(&'a Metrics);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.dec();
        self.0.in_flight_now.fetch_sub(1, Ordering::Relaxed);
    }
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric under the `kvtier_meta` prefix.
    pub fn new() -> Self {
        Self::with_extra(None)
    }

    /// Metrics whose text also carries `extra`'s families.
    pub fn with_extra(extra: Option<crate::config::ExtraMetrics>) -> Self {
        let mut registry = Registry::with_prefix("kvtier_meta");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<MethodLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.000_05, 2.0, 18))) as fn() -> Histogram,
        );
        let in_flight = Gauge::default();
        let blocks = Family::<InstanceLabels, Gauge>::default();
        let group_used = Family::<GroupLabels, Gauge>::default();
        let group_quota = Family::<GroupLabels, Gauge>::default();
        let group_instances = Family::<GroupLabels, Gauge>::default();
        let open_sessions = Gauge::default();
        let (leader, leader_epoch, reclaim_passes) =
            (Gauge::default(), Gauge::default(), Gauge::default());
        registry.register(
            "requests",
            "Requests by method and wire result code",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Request handling time by method",
            latency.clone(),
        );
        registry.register(
            "in_flight_requests",
            "Requests being handled",
            in_flight.clone(),
        );
        registry.register("blocks", "Block records per instance", blocks.clone());
        registry.register(
            "group_used_bytes",
            "Bytes charged to each instance group (writing + serving)",
            group_used.clone(),
        );
        registry.register(
            "group_quota_bytes",
            "Hard quota of each instance group (absent when unlimited)",
            group_quota.clone(),
        );
        registry.register(
            "group_instances",
            "Registered instances per group",
            group_instances.clone(),
        );
        registry.register(
            "open_write_sessions",
            "Open write sessions",
            open_sessions.clone(),
        );
        registry.register(
            "leader",
            "1 while this frontend is the elected leader, else 0",
            leader.clone(),
        );
        registry.register(
            "leader_epoch",
            "Epoch of the lease this frontend leads under (0 when it does not lead)",
            leader_epoch.clone(),
        );
        registry.register(
            "reclaim_passes",
            "Watermark reclaimer passes this frontend has run (the leader runs them)",
            reclaim_passes.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            in_flight,
            in_flight_now: AtomicI64::new(0),
            blocks,
            group_used,
            group_quota,
            group_instances,
            open_sessions,
            leader,
            leader_epoch,
            reclaim_passes,
            methods: Default::default(),
            born: Instant::now(),
            extra: Extra(extra),
        }
    }

    /// Counts a request as in flight until the guard drops.
    pub fn enter(&self) -> InFlight<'_> {
        self.in_flight.inc();
        self.in_flight_now.fetch_add(1, Ordering::Relaxed);
        InFlight(self)
    }

    /// Records one finished request of `method` with wire result `code`.
    pub fn observe(&self, method: &'static str, code: i32, took: Duration) {
        let m = self.method(method);
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        m.calls.fetch_add(1, Ordering::Relaxed);
        m.sum_ns.fetch_add(ns, Ordering::Relaxed);
        if code != OK {
            m.errors.fetch_add(1, Ordering::Relaxed);
        }
        let secs = took.as_secs_f64();
        m.last_us_bits
            .store((secs * 1e6).to_bits(), Ordering::Relaxed);
        m.last_code.store(i64::from(code), Ordering::Relaxed);
        let at = u64::try_from(self.born.elapsed().as_nanos()).unwrap_or(u64::MAX);
        m.last_at_ns.store(at, Ordering::Relaxed);
        m.latency.observe(secs);
        m.by_code[code_slot(code)]
            .get_or_init(|| {
                self.requests
                    .get_or_create(&RequestLabels {
                        method: method.to_owned(),
                        code: crate::api::code_name(code).to_owned(),
                    })
                    .clone()
            })
            .inc();
    }

    /// `method`'s figures, created on its first request.
    fn method(&self, method: &'static str) -> Arc<MethodStats> {
        if let Some(m) = self.methods.read().get(method) {
            return m.clone();
        }
        let latency = self
            .latency
            .get_or_create(&MethodLabels {
                method: method.to_owned(),
            })
            .clone();
        self.methods
            .write()
            .entry(method)
            .or_insert_with(|| Arc::new(MethodStats::new(latency)))
            .clone()
    }

    /// Every method seen, sorted by name.
    fn methods(&self) -> Vec<(&'static str, Arc<MethodStats>)> {
        let mut all: Vec<_> = self
            .methods
            .read()
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        all.sort_unstable_by_key(|(k, _)| *k);
        all
    }

    /// Reloads the service gauges from `MetaService::stats` and the
    /// elector.
    fn refresh(&self, svc: &MetaService, elector: &Elector) -> kvtier_meta::MetaStats {
        let epoch = elector.leader_epoch();
        self.leader.set(i64::from(epoch.is_some()));
        self.leader_epoch.set(clamp(epoch.unwrap_or(0)));
        self.reclaim_passes.set(clamp(svc.reclaim_stats().passes));
        let stats = svc.stats();
        self.blocks.clear();
        self.group_used.clear();
        self.group_quota.clear();
        self.group_instances.clear();
        for (instance, n) in &stats.blocks_per_instance {
            self.blocks
                .get_or_create(&InstanceLabels {
                    instance: instance.clone(),
                })
                .set(clamp(*n));
        }
        for (group, g) in &stats.groups {
            let l = GroupLabels {
                group: group.clone(),
            };
            self.group_used.get_or_create(&l).set(clamp(g.usage.total));
            self.group_instances
                .get_or_create(&l)
                .set(clamp(g.instances as u64));
            if g.quota_bytes != u64::MAX {
                self.group_quota.get_or_create(&l).set(clamp(g.quota_bytes));
            }
        }
        self.open_sessions.set(clamp(stats.open_sessions as u64));
        stats
    }

    /// The Prometheus text exposition, with fresh service gauges.
    pub fn render(&self, svc: &MetaService, elector: &Elector) -> String {
        self.refresh(svc, elector);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        if let Some(extra) = &self.extra.0 {
            // The embedder's families go before the closing `# EOF`.
            let end = out.rfind("# EOF").unwrap_or(out.len());
            out.insert_str(end, &extra());
        }
        out
    }

    /// The same figures as [`Metrics::render`], as `GetMetrics` entries.
    pub fn to_wire(&self, svc: &MetaService, elector: &Elector) -> Vec<pb::MetricsData> {
        let stats = self.refresh(svc, elector);
        let int = |name: &str, v: i64, tags: &[(&str, &str)]| pb::MetricsData {
            metric_name: format!("kvtier_meta_{name}"),
            metric_value: Some(pb::MetricValue {
                value: Some(pb::metric_value::Value::IntValue(v)),
            }),
            metric_tags: tags
                .iter()
                .map(|(k, v)| pb::MetricsTag {
                    tag_key: (*k).to_owned(),
                    tag_value: (*v).to_owned(),
                })
                .collect(),
        };
        let methods = self.methods();
        let mut out = upstream::entries(&methods, &stats, svc);
        for (method, m) in &methods {
            for (slot, counter) in m.by_code.iter().enumerate() {
                let Some(counter) = counter.get() else {
                    continue;
                };
                let code = i32::try_from(slot).unwrap_or(i32::MAX);
                out.push(int(
                    "requests_total",
                    clamp(counter.get()),
                    &[("method", method), ("code", crate::api::code_name(code))],
                ));
            }
        }
        for (method, m) in &methods {
            out.push(int(
                "request_duration_seconds_count",
                clamp(m.calls.load(Ordering::Relaxed)),
                &[("method", method)],
            ));
            let sum = m.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
            out.push(pb::MetricsData {
                metric_name: "kvtier_meta_request_duration_seconds_sum".into(),
                metric_value: Some(pb::MetricValue {
                    value: Some(pb::metric_value::Value::FloatValue(sum)),
                }),
                metric_tags: vec![pb::MetricsTag {
                    tag_key: "method".into(),
                    tag_value: (*method).to_owned(),
                }],
            });
        }
        out.push(int(
            "in_flight_requests",
            self.in_flight_now.load(Ordering::Relaxed),
            &[],
        ));
        for (instance, n) in &stats.blocks_per_instance {
            out.push(int("blocks", clamp(*n), &[("instance", instance)]));
        }
        for (group, g) in &stats.groups {
            out.push(int(
                "group_used_bytes",
                clamp(g.usage.total),
                &[("group", group)],
            ));
            out.push(int(
                "group_instances",
                clamp(g.instances as u64),
                &[("group", group)],
            ));
            if g.quota_bytes != u64::MAX {
                out.push(int(
                    "group_quota_bytes",
                    clamp(g.quota_bytes),
                    &[("group", group)],
                ));
            }
        }
        out.push(int(
            "open_write_sessions",
            clamp(stats.open_sessions as u64),
            &[],
        ));
        out.push(int("leader", self.leader.get(), &[]));
        out.push(int("leader_epoch", self.leader_epoch.get(), &[]));
        out.push(int("reclaim_passes", self.reclaim_passes.get(), &[]));
        out
    }
}

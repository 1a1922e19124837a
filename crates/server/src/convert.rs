//! Mapping between the wire messages (`kvtier_meta::proto`) and the service
//! model (`kvtier_meta::model`), plus `MetaError -> ErrorCode`.
//!
//! Everything here is a pure function, so both transports share it and it
//! can be tested without a server.

pub mod admin;

use kvtier_meta::proto::meta as pb;
use kvtier_meta::{
    BlockKey, BlockMask, BlockMeta, CacheLocation, Instance, LocationSpecInfo, MatchMode,
    MetaError, SpecGroup, StorageKind,
};

/// Converts a message to another with the same field numbers (the meta and
/// admin packages repeat several messages). Fields the target lacks are
/// dropped, as protobuf does for unknown fields.
pub fn recode<A: prost::Message, B: prost::Message + Default>(a: &A) -> B {
    // Decoding bytes we just encoded from a message with the same numbers
    // cannot fail; fall back to the default rather than panic.
    B::decode(a.encode_to_vec().as_slice()).unwrap_or_default()
}

/// A refused or failed request: the wire code and the message for
/// `header.status`. Handlers return it; both transports write it the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fail {
    /// Wire code.
    pub code: pb::ErrorCode,
    /// Human-readable reason.
    pub message: String,
}

impl Fail {
    /// `INVALID_ARGUMENT` with `message`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Fail {
            code: pb::ErrorCode::InvalidArgument,
            message: message.into(),
        }
    }

    /// `UNSUPPORTED` with `message`.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Fail {
            code: pb::ErrorCode::Unsupported,
            message: message.into(),
        }
    }

    /// `SERVER_NOT_LEADER`, "Server is not leader": a follower's answer to
    /// a call only the leader serves.
    pub fn not_leader() -> Self {
        Fail {
            code: pb::ErrorCode::ServerNotLeader,
            message: crate::api::NOT_LEADER_MESSAGE.into(),
        }
    }

    /// The wire status.
    pub fn status(&self) -> pb::Status {
        status(self.code, self.message.clone())
    }
}

impl From<MetaError> for Fail {
    fn from(e: MetaError) -> Self {
        Fail {
            code: error_code(&e),
            message: e.to_string(),
        }
    }
}

/// The wire code and message of a service error.
pub fn error_status(e: &MetaError) -> pb::Status {
    pb::Status {
        code: error_code(e) as i32,
        message: e.to_string(),
    }
}

/// The wire code of a service error. Matched on [`MetaError::code`]'s
/// stable names rather than the variants, so a variant added to the service
/// maps to `UNKNOWN_ERROR` until it is listed here instead of breaking the
/// build of the transport.
pub fn error_code(e: &MetaError) -> pb::ErrorCode {
    use pb::ErrorCode as C;
    match e.code() {
        "INVALID_ARGUMENT" | "GROUP_NOT_FOUND" | "STORAGE_NOT_FOUND" | "ACCOUNT_NOT_FOUND"
        | "SESSION_NOT_FOUND" => C::InvalidArgument,
        "INSTANCE_NOT_FOUND" => C::InstanceNotExist,
        "INSTANCE_CONFLICT" | "ALREADY_EXISTS" => C::DuplicateEntity,
        "GROUP_FULL" | "QUOTA_EXCEEDED" | "NO_AVAILABLE_STORAGE" | "KEY_COUNT_EXCEEDED" => {
            C::ReachMaxEntityCapacity
        }
        "CORRUPT" | "BACKEND" => C::IoError,
        // Transient: the store refuses writes until its disk has room again.
        "STORE_UNWRITABLE" => C::ServiceNotReady,
        // The wire enum has no permission or in-use code; the message says
        // which (docs/server.md, "Error codes").
        // A stale version too (upstream answers INTERNAL_ERROR for every
        // failed UpdateInstanceGroup; the caller's request is what is wrong).
        "IN_USE" | "PERMISSION_DENIED" | "UNAUTHENTICATED" | "VERSION_MISMATCH" => {
            C::InvalidArgument
        }
        "UNSUPPORTED" => C::Unsupported,
        "NOT_LEADER" => C::ServerNotLeader,
        _ => C::UnknownError,
    }
}

/// A header saying OK.
pub fn ok_header(trace_id: &str) -> pb::CommonResponseHeader {
    header(
        pb::Status {
            code: pb::ErrorCode::Ok as i32,
            message: String::new(),
        },
        trace_id,
    )
}

/// A header carrying `status`; the request id echoes the caller's trace id.
pub fn header(status: pb::Status, trace_id: &str) -> pb::CommonResponseHeader {
    pb::CommonResponseHeader {
        status: Some(status),
        request_id: trace_id.to_owned(),
        tracer_result: String::new(),
    }
}

/// A status with `code` and `message`.
pub fn status(code: pb::ErrorCode, message: impl Into<String>) -> pb::Status {
    pb::Status {
        code: code as i32,
        message: message.into(),
    }
}

fn invalid(msg: impl Into<String>) -> MetaError {
    MetaError::InvalidArgument(msg.into())
}

/// The block keys of a request: `block_keys` when non-empty, else
/// `token_ids` chained with the instance's block size (docs/meta-api.md §2).
/// Token ids that make no full block give no keys, as upstream (lookups
/// find nothing, a write opens an empty session); an instance registered
/// without a block size takes `block_keys` only.
pub fn request_keys(
    block_keys: &[i64],
    token_ids: &[i64],
    block_size: u32,
) -> Result<Vec<BlockKey>, MetaError> {
    if !block_keys.is_empty() {
        return Ok(block_keys.iter().map(|&k| BlockKey::from_wire(k)).collect());
    }
    if token_ids.is_empty() {
        return Err(invalid("neither block_keys nor token_ids given"));
    }
    if block_size == 0 {
        return Err(invalid(
            "the instance was registered without a block size, so token_ids cannot be cut into blocks; send block_keys",
        ));
    }
    Ok(BlockKey::chain_tokens(token_ids, block_size as usize))
}

/// A wire mask as the model's mask.
pub fn mask_from_wire(m: Option<&pb::BlockMask>) -> Result<BlockMask, MetaError> {
    match m.and_then(|m| m.info.as_ref()) {
        None => Ok(BlockMask::None),
        Some(pb::block_mask::Info::Offset(o)) if *o < 0 => {
            Err(invalid(format!("negative mask offset {o}")))
        }
        Some(pb::block_mask::Info::Offset(o)) => Ok(BlockMask::Offset(*o as usize)),
        Some(pb::block_mask::Info::BoolMasks(b)) => Ok(BlockMask::Bits(b.values.clone())),
    }
}

/// The mask over `n` positions with `marked` set: an offset when the marks
/// form a prefix (including the empty one), else a bool list.
pub fn mask_to_wire(marked: &[bool]) -> pb::BlockMask {
    let k = marked.iter().take_while(|&&m| m).count();
    let info = if marked[k..].iter().all(|&m| !m) {
        pb::block_mask::Info::Offset(k as i32)
    } else {
        pb::block_mask::Info::BoolMasks(pb::BoolMasksType {
            values: marked.to_vec(),
        })
    };
    pb::BlockMask { info: Some(info) }
}

/// The marks of a mask over `n` positions; a bool list must have `n` flags.
pub fn mask_flags(mask: &BlockMask, n: usize) -> Result<Vec<bool>, MetaError> {
    mask.validate(n)?;
    Ok((0..n).map(|i| mask.is_masked(i)).collect())
}

/// The keys a wire mask leaves in (the unmarked ones), in order.
pub fn unmasked_keys(
    keys: &[BlockKey],
    mask: Option<&pb::BlockMask>,
) -> Result<Vec<BlockKey>, MetaError> {
    let mask = mask_from_wire(mask)?;
    mask.validate(keys.len())?;
    Ok(keys
        .iter()
        .enumerate()
        .filter(|(i, _)| !mask.is_masked(*i))
        .map(|(_, k)| *k)
        .collect())
}

/// The matching mode of a query type. `sw_size` is checked against the
/// number of keys for the sliding window.
pub fn match_mode(qt: pb::QueryType, sw_size: i32, n_keys: usize) -> Result<MatchMode, Fail> {
    match qt {
        pb::QueryType::QtBatchGet => Ok(MatchMode::Keys),
        pb::QueryType::QtPrefixMatch => Ok(MatchMode::Prefix),
        pb::QueryType::QtReverseRollSwMatch => {
            if sw_size <= 0 || sw_size as usize > n_keys {
                return Err(Fail::invalid(format!(
                    "sw_size {sw_size} outside 1..={n_keys} for QT_REVERSE_ROLL_SW_MATCH"
                )));
            }
            Ok(MatchMode::ReverseSlidingWindow {
                window: sw_size as usize,
            })
        }
        pb::QueryType::QtPrefixMatchWithMamba => Err(Fail::unsupported(
            "QT_PREFIX_MATCH_WITH_MAMBA is not implemented",
        )),
        pb::QueryType::QtUnspecified => Err(Fail::invalid("query_type is QT_UNSPECIFIED")),
    }
}

/// The wire storage type of a model storage kind. kvtier's tiers have no
/// upstream number yet and are exposed as `ST_NFS` (docs/meta-api.md §7);
/// upstream's own kinds keep their numbers.
pub fn storage_type(kind: StorageKind) -> pb::StorageType {
    match kind {
        StorageKind::KvtierNode
        | StorageKind::FilePool
        | StorageKind::S3
        | StorageKind::FileObjects => pb::StorageType::StNfs,
        StorageKind::Mooncake => pb::StorageType::StMooncake,
        StorageKind::TairMemPool => pb::StorageType::StTairmempool,
    }
}

/// A model location on the wire; `only` keeps just the named specs (all
/// when empty).
pub fn location_to_wire(l: &CacheLocation, only: &[String]) -> pb::CacheLocation {
    let specs: Vec<pb::LocationSpec> = l
        .specs
        .iter()
        .filter(|s| only.is_empty() || only.contains(&s.name))
        .map(|s| pb::LocationSpec {
            name: s.name.clone(),
            uri: s.uri.clone(),
        })
        .collect();
    pb::CacheLocation {
        r#type: storage_type(l.kind) as i32,
        spec_size: specs.len() as i32,
        location_specs: specs,
    }
}

/// The empty location: "no copy".
pub fn empty_location() -> pb::CacheLocation {
    pb::CacheLocation::default()
}

/// `GetCacheMeta`'s location of a record: the serving copy if any, else
/// the first one in any state.
pub fn meta_location(m: Option<&BlockMeta>) -> pb::CacheLocation {
    m.and_then(|m| m.serving().or_else(|| m.locations.first()))
        .map_or_else(empty_location, |l| location_to_wire(l, &[]))
}

/// `GetCacheMeta`'s JSON text of a record (docs/meta-api.md §4.9).
pub fn meta_json(key: BlockKey, m: Option<&BlockMeta>, detail_level: i32) -> String {
    let Some(m) = m else {
        return serde_json::json!({"id": key.to_wire().to_string(), "status": "not_found"})
            .to_string();
    };
    let loc = m.serving().or_else(|| m.locations.first());
    let status = loc.map_or("not_found", |l| match l.status {
        kvtier_meta::LocationStatus::Writing => "writing",
        kvtier_meta::LocationStatus::Serving => "serving",
        kvtier_meta::LocationStatus::Deleting => "deleting",
    });
    let mut v = serde_json::json!({"id": key.to_wire().to_string(), "status": status});
    if detail_level > 0 {
        v["last_access_ms"] = m.last_access_ms.into();
        v["access_count"] = m.access_count.into();
        v["locations"] = m.locations.len().into();
        if let Some(l) = loc {
            v["storage"] = l.storage.clone().into();
        }
    }
    v.to_string()
}

/// What the model keeps of a registration beyond its plain fields: the
/// model deployment (without `user_data`, which is not identity) and the
/// default query type. Kept as JSON in `Instance::model`, so the service's
/// equality check is exactly the identity check of docs/meta-api.md §4.1.
#[derive(serde::Serialize, serde::Deserialize)]
struct WireIdentity {
    model_deployment: pb::ModelDeployment,
    default_query_type: i32,
}

/// The model instance of a registration.
pub fn instance_from_wire(
    group: &str,
    id: &str,
    block_size: i32,
    specs: &[pb::LocationSpecInfo],
    deployment: Option<&pb::ModelDeployment>,
    spec_groups: &[pb::LocationSpecGroup],
    default_query_type: i32,
) -> Result<Instance, MetaError> {
    // As upstream, an instance may have no block size (0 or negative):
    // it then takes block keys only (`request_keys`).
    let block_size = u32::try_from(block_size).unwrap_or(0);
    let location_specs = specs
        .iter()
        .map(|s| {
            u64::try_from(s.size)
                .map(|size| LocationSpecInfo {
                    name: s.name.clone(),
                    size,
                })
                .map_err(|_| invalid(format!("spec {:?} has negative size", s.name)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut deployment = deployment.cloned().unwrap_or_default();
    deployment.user_data.clear();
    let plain = deployment
        == pb::ModelDeployment {
            model_name: deployment.model_name.clone(),
            ..Default::default()
        }
        && default_query_type == 0;
    let model = if plain {
        deployment.model_name
    } else {
        serde_json::to_string(&WireIdentity {
            model_deployment: deployment,
            default_query_type,
        })
        .map_err(|e| invalid(format!("model_deployment: {e}")))?
    };
    Ok(Instance {
        id: id.to_owned(),
        group: group.to_owned(),
        model,
        block_size,
        location_specs,
        spec_groups: spec_groups
            .iter()
            .map(|g| SpecGroup {
                name: g.name.clone(),
                specs: g.spec_names.clone(),
            })
            .collect(),
    })
}

/// The model deployment and default query type stored with an instance.
pub fn instance_identity(inst: &Instance) -> (pb::ModelDeployment, i32) {
    if inst.model.starts_with('{')
        && let Ok(w) = serde_json::from_str::<WireIdentity>(&inst.model)
    {
        return (w.model_deployment, w.default_query_type);
    }
    (
        pb::ModelDeployment {
            model_name: inst.model.clone(),
            ..Default::default()
        },
        0,
    )
}

/// The wire description of an instance.
pub fn instance_info(inst: &Instance) -> pb::InstanceInfo {
    let (deployment, qt) = instance_identity(inst);
    pb::InstanceInfo {
        quota_group_name: inst.group.clone(),
        instance_group_name: inst.group.clone(),
        instance_id: inst.id.clone(),
        block_size: inst.block_size as i32,
        location_spec_infos: inst
            .location_specs
            .iter()
            .map(|s| pb::LocationSpecInfo {
                name: s.name.clone(),
                size: s.size as i64,
            })
            .collect(),
        model_deployment: Some(deployment),
        location_spec_groups: inst
            .spec_groups
            .iter()
            .map(|g| pb::LocationSpecGroup {
                name: g.name.clone(),
                spec_names: g.specs.clone(),
            })
            .collect(),
        default_query_type: qt,
    }
}

/// A write session id on the wire: `<session hex>-<number of blocks>`. The
/// count lets `FinishWriteCache` expand an offset mask without server-side
/// state; the service still checks it against the session.
pub fn session_to_wire(id: kvtier_meta::SessionId, blocks: usize) -> String {
    format!("{id}-{blocks}")
}

/// Inverse of [`session_to_wire`].
pub fn session_from_wire(s: &str) -> Result<(kvtier_meta::SessionId, usize), MetaError> {
    let bad = || {
        invalid(format!(
            "write session {s:?} not found (expected <hex id>-<blocks>)"
        ))
    };
    let (id, n) = s.split_once('-').ok_or_else(bad)?;
    let id = u64::from_str_radix(id, 16).map_err(|_| bad())?;
    let n = n.parse::<usize>().map_err(|_| bad())?;
    Ok((kvtier_meta::SessionId(id), n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_round_trip_and_prefer_offsets() {
        assert_eq!(
            mask_to_wire(&[true, true, false]).info,
            Some(pb::block_mask::Info::Offset(2))
        );
        assert_eq!(
            mask_to_wire(&[false, false]).info,
            Some(pb::block_mask::Info::Offset(0))
        );
        let bits = [false, true, false];
        let wire = mask_to_wire(&bits);
        let back = mask_from_wire(Some(&wire)).unwrap();
        assert_eq!(mask_flags(&back, 3).unwrap(), bits);
        assert!(mask_flags(&back, 4).is_err());
    }

    #[test]
    fn keys_come_from_block_keys_then_tokens() {
        assert_eq!(
            request_keys(&[-1, 5], &[1, 2], 1).unwrap(),
            [BlockKey::from_wire(-1), BlockKey(5)]
        );
        let k = request_keys(&[], &[1, 2, 3, 4, 5], 2).unwrap();
        assert_eq!(
            k.iter().map(|k| k.to_wire()).collect::<Vec<_>>(),
            [-8366447769517741626, 455111481605203084]
        );
        assert!(request_keys(&[], &[], 2).is_err());
        // Short of a block: no keys (upstream's empty answer).
        assert!(request_keys(&[], &[1], 2).unwrap().is_empty());
        // No block size: block keys only.
        assert!(request_keys(&[], &[1, 2], 0).is_err());
        assert_eq!(request_keys(&[7], &[], 0).unwrap(), [BlockKey(7)]);
    }

    #[test]
    fn identity_survives_the_model() {
        let dep = pb::ModelDeployment {
            model_name: "m".into(),
            dtype: "bf16".into(),
            tp_size: 2,
            user_data: "not identity".into(),
            ..Default::default()
        };
        let spec = [pb::LocationSpecInfo {
            name: "tp0".into(),
            size: 10,
        }];
        let inst = instance_from_wire("g", "i", 4, &spec, Some(&dep), &[], 2).unwrap();
        let info = instance_info(&inst);
        assert_eq!(info.default_query_type, 2);
        let got = info.model_deployment.unwrap();
        assert_eq!(got.dtype, "bf16");
        assert_eq!(got.user_data, "");
        let plain = pb::ModelDeployment {
            model_name: "m".into(),
            ..Default::default()
        };
        let inst = instance_from_wire("g", "i", 4, &spec, Some(&plain), &[], 0).unwrap();
        assert_eq!(inst.model, "m");
        for no_size in [0, -5] {
            let inst = instance_from_wire("g", "i", no_size, &spec, None, &[], 0).unwrap();
            assert_eq!(inst.block_size, 0);
        }
    }

    #[test]
    fn service_errors_map_to_the_documented_codes() {
        use pb::ErrorCode as C;
        let cases = [
            (MetaError::InvalidArgument("x".into()), C::InvalidArgument),
            (MetaError::InstanceNotFound("i".into()), C::InstanceNotExist),
            (MetaError::InstanceConflict("i".into()), C::DuplicateEntity),
            (MetaError::AlreadyExists("s".into()), C::DuplicateEntity),
            (MetaError::GroupFull("g".into()), C::ReachMaxEntityCapacity),
            (
                MetaError::QuotaExceeded {
                    group: "g".into(),
                    requested: 1,
                    used: 1,
                    limit: 1,
                },
                C::ReachMaxEntityCapacity,
            ),
            (MetaError::SessionNotFound(1), C::InvalidArgument),
            (MetaError::PermissionDenied("p".into()), C::InvalidArgument),
            (MetaError::InUse("g".into()), C::InvalidArgument),
            (
                MetaError::VersionMismatch {
                    group: "g".into(),
                    expected: 1,
                    requested: 2,
                    stored: 3,
                },
                C::InvalidArgument,
            ),
            (
                MetaError::KeyCountExceeded {
                    instance: "i".into(),
                    count: 16,
                    adding: 1,
                    limit: 16,
                },
                C::ReachMaxEntityCapacity,
            ),
        ];
        for (e, want) in cases {
            let f = Fail::from(e);
            assert_eq!(f.code, want, "{}", f.message);
            assert!(!f.message.is_empty());
        }
    }

    #[test]
    fn session_ids_round_trip() {
        let s = session_to_wire(kvtier_meta::SessionId(0xabc), 7);
        assert_eq!(
            session_from_wire(&s).unwrap(),
            (kvtier_meta::SessionId(0xabc), 7)
        );
        assert!(session_from_wire("zz").is_err());
        assert!(session_from_wire("12-x").is_err());
    }
}

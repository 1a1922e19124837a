//! The generated wire types speak Tair KVCM's JSON (docs/meta-api.md):
//! snake_case field names (lowerCamel accepted on input), enums by name
//! (numbers accepted), 64-bit integers as strings (numbers accepted), oneofs
//! flattened into their parent object, unknown fields ignored, defaults
//! written out.

use kvtier_meta::proto::meta::{
    BlockMask, CommonResponseHeader, ErrorCode, GetCacheLocationRequest, QueryType, Status,
    block_mask,
};

#[test]
fn requests_parse_the_way_tair_kvcm_clients_send_them() {
    let body = r#"{
        "trace_id": "t-1",
        "instance_id": "llama",
        "query_type": "QT_PREFIX_MATCH",
        "block_keys": ["1", "-2", 3],
        "block_mask": {"offset": 1},
        "some_future_field": {"ignored": true}
    }"#;
    let req: GetCacheLocationRequest = serde_json::from_str(body).unwrap();
    assert_eq!(req.instance_id, "llama");
    assert_eq!(req.query_type(), QueryType::QtPrefixMatch);
    assert_eq!(req.block_keys, [1, -2, 3]);
    assert_eq!(
        req.block_mask,
        Some(BlockMask {
            info: Some(block_mask::Info::Offset(1))
        })
    );

    // lowerCamel names and enum numbers are accepted too.
    let camel = r#"{"instanceId": "llama", "queryType": 1, "blockKeys": [7]}"#;
    let req: GetCacheLocationRequest = serde_json::from_str(camel).unwrap();
    assert_eq!(req.instance_id, "llama");
    assert_eq!(req.query_type(), QueryType::QtBatchGet);
    assert_eq!(req.block_keys, [7]);

    // A malformed body is an error, not a default request.
    assert!(serde_json::from_str::<GetCacheLocationRequest>(r#"{"block_keys": ["x"]}"#).is_err());
}

#[test]
fn responses_are_written_the_way_tair_kvcm_clients_read_them() {
    let req = GetCacheLocationRequest {
        instance_id: "llama".into(),
        block_keys: vec![-8366447769517741626],
        ..Default::default()
    };
    let v: serde_json::Value = serde_json::to_value(&req).unwrap();
    // 64-bit integers as strings, enums by name, defaults written.
    assert_eq!(v["block_keys"][0], "-8366447769517741626");
    assert_eq!(v["query_type"], "QT_UNSPECIFIED");
    assert_eq!(v["trace_id"], "");

    let header = CommonResponseHeader {
        status: Some(Status {
            code: ErrorCode::Ok as i32,
            message: String::new(),
        }),
        request_id: "r".into(),
        tracer_result: String::new(),
    };
    let v = serde_json::to_value(&header).unwrap();
    assert_eq!(v["status"]["code"], "OK");
}

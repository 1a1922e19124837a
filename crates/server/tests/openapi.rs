//! The checked-in OpenAPI documents (`docs/openapi.json` for the meta
//! service, `docs/openapi-admin.json` for the admin service) must equal
//! what the server generates from the proto descriptors.
//!
//! To regenerate after changing a .proto file or the generator:
//! `KVTIER_WRITE_OPENAPI=1 cargo test -p kvtier-server --test openapi`

use std::path::PathBuf;

use kvtier_server::openapi::{admin_document, meta_document, render};
use serde_json::Value;

fn docs_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs")
}

fn check(file: &str, generated: &str) {
    let path = docs_dir().join(file);
    if std::env::var_os("KVTIER_WRITE_OPENAPI").is_some() {
        std::fs::write(&path, generated).expect("write the OpenAPI document");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "docs/{file} is out of date with crates/meta/proto.\n\
         Regenerate it with:\n    KVTIER_WRITE_OPENAPI=1 cargo test -p kvtier-server --test openapi\n\
         and commit the result."
    );
}

#[test]
fn checked_in_documents_match_the_descriptors() {
    check("openapi.json", &render(&meta_document()));
    check("openapi-admin.json", &render(&admin_document()));
}

#[test]
fn documents_follow_the_json_conventions() {
    let meta = meta_document();
    let paths = meta["paths"].as_object().unwrap();
    for rpc in [
        "registerInstance",
        "getInstanceInfo",
        "getCacheMeta",
        "getCacheLocation",
        "getCacheLocationLen",
        "startWriteCache",
        "finishWriteCache",
        "removeCache",
        "trimCache",
        "getClusterInfo",
    ] {
        assert!(paths.contains_key(&format!("/api/{rpc}")), "missing {rpc}");
    }
    let s = &meta["components"]["schemas"];
    let req = &s["meta.GetCacheLocationRequest"]["properties"];
    // snake_case names, int64 as string, enums by name.
    assert_eq!(req["block_keys"]["type"], "array");
    assert_eq!(req["block_keys"]["items"]["type"], "string");
    assert_eq!(req["block_keys"]["items"]["format"], "int64");
    let qt = &req["query_type"];
    let r = qt["$ref"]
        .as_str()
        .or(qt["allOf"][0]["$ref"].as_str())
        .unwrap();
    assert_eq!(r, "#/components/schemas/meta.QueryType");
    assert!(
        s["meta.QueryType"]["enum"]
            .as_array()
            .unwrap()
            .contains(&Value::from("QT_PREFIX_MATCH"))
    );
    assert_eq!(
        s["meta.GetCacheLocationLenResponse"]["properties"]["cache_location_len"]["type"],
        "string"
    );
    // Every $ref resolves within its own document.
    let admin = admin_document();
    for doc in [&meta, &admin] {
        let text = doc.to_string();
        for part in text.split("#/components/schemas/").skip(1) {
            let name = &part[..part.find('"').unwrap()];
            assert!(
                doc["components"]["schemas"].get(name).is_some(),
                "dangling $ref {name}"
            );
        }
    }
    assert_eq!(
        admin["components"]["schemas"]["admin.MetaIndexerConfig"]["properties"]["persist_metadata_interval_time_ms"]
            ["type"],
        "string",
        "Int64Value wrapper as an int64 string"
    );
    assert!(admin["paths"]["/metrics"].is_object());
}

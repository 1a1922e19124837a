//! OpenAPI 3.1 documents of the HTTP side, derived from the protobuf
//! descriptors of `crates/meta/proto` (encoded by this crate's build
//! script), so the document cannot disagree with the wire types.
//!
//! One document per service, because both services define some of the same
//! paths (`/api/getCacheMeta`, ...) on different listeners: [`meta_document`]
//! is served by the meta HTTP listener and checked in as
//! `docs/openapi.json`, [`admin_document`] by the admin listener and checked
//! in as `docs/openapi-admin.json`.
//!
//! Schemas follow the JSON conventions of docs/meta-api.md §1.1: snake_case
//! property names, enums as names, 64-bit integers as strings, unknown
//! properties allowed (they are ignored).

use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorProto, FileDescriptorSet, SourceCodeInfo};
use serde_json::{Map, Value, json};

use crate::methods::lower_camel;

static DESCRIPTOR: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kvtier_meta_descriptor.bin"));

const PACKAGE_PREFIX: &str = "kv_cache_manager.proto.";

/// The meta service's document (`GET /openapi.json` on the meta listener).
pub fn meta_document() -> Value {
    document("meta", "MetaService", 6382)
}

/// The admin service's document (`GET /openapi.json` on the admin listener).
pub fn admin_document() -> Value {
    document("admin", "AdminService", 6492)
}

/// The document of a listener serving both services: the meta document
/// plus the admin paths the meta service does not define (on a shared
/// listener the meta spelling of a shared method wins) and their schemas.
pub fn combined_document() -> Value {
    let mut doc = meta_document();
    let admin = admin_document();
    for section in [&["paths"][..], &["components", "schemas"][..]] {
        let mut from = &admin;
        for k in section {
            from = &from[*k];
        }
        let mut to = &mut doc;
        for k in section {
            to = &mut to[*k];
        }
        if let (Some(from), Some(to)) = (from.as_object(), to.as_object_mut()) {
            for (k, v) in from {
                to.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    doc
}

/// `v` with every object's keys inserted in sorted order, so the text is
/// the same whether or not some crate in the build turns on serde_json's
/// `preserve_order` (which keeps insertion order).
fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&m[k])))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// A document as the text served and checked in (pretty, keys sorted,
/// newline-ended).
pub fn render(doc: &Value) -> String {
    let mut s = serde_json::to_string_pretty(&sorted(doc)).unwrap_or_else(|_| "{}".into());
    s.push('\n');
    s
}

fn file(short: &str) -> Option<FileDescriptorProto> {
    let set = FileDescriptorSet::decode(DESCRIPTOR).ok()?;
    let package = format!("{PACKAGE_PREFIX}{short}");
    set.file
        .into_iter()
        .find(|f| f.package.as_deref() == Some(package.as_str()))
}

/// The comment attached to the element at `path`, cleaned up.
fn comment(info: Option<&SourceCodeInfo>, path: &[i32]) -> Option<String> {
    let loc = info?.location.iter().find(|l| l.path == path)?;
    let text = loc
        .leading_comments
        .as_deref()
        .or(loc.trailing_comments.as_deref())?;
    let text = text
        .lines()
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ")
        .trim()
        .to_owned();
    (!text.is_empty()).then_some(text)
}

fn int64_schema() -> Value {
    json!({
        "type": "string",
        "format": "int64",
        "pattern": "^-?[0-9]+$",
        "description": "64-bit integer, written as a JSON string; numbers are accepted on input"
    })
}

/// `.kv_cache_manager.proto.meta.Foo` -> `meta.Foo`.
fn schema_name(type_name: &str) -> String {
    type_name
        .trim_start_matches('.')
        .trim_start_matches(PACKAGE_PREFIX)
        .to_owned()
}

fn reference(type_name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{}", schema_name(type_name)) })
}

fn field_schema(f: &prost_types::FieldDescriptorProto) -> Value {
    let t = f.type_name.as_deref().unwrap_or("");
    let one = match f.r#type() {
        Type::Double | Type::Float => json!({"type": "number"}),
        Type::Int64 | Type::Uint64 | Type::Sint64 | Type::Fixed64 | Type::Sfixed64 => {
            int64_schema()
        }
        Type::Int32 | Type::Uint32 | Type::Sint32 | Type::Fixed32 | Type::Sfixed32 => {
            json!({"type": "integer", "format": "int32"})
        }
        Type::Bool => json!({"type": "boolean"}),
        Type::String => json!({"type": "string"}),
        Type::Bytes => json!({"type": "string", "contentEncoding": "base64"}),
        Type::Enum => reference(t),
        Type::Message | Type::Group => match t {
            // Wrapper types are written as their bare value.
            ".google.protobuf.Int64Value" | ".google.protobuf.UInt64Value" => int64_schema(),
            ".google.protobuf.Int32Value" | ".google.protobuf.UInt32Value" => {
                json!({"type": "integer", "format": "int32"})
            }
            ".google.protobuf.StringValue" => json!({"type": "string"}),
            ".google.protobuf.BoolValue" => json!({"type": "boolean"}),
            ".google.protobuf.DoubleValue" | ".google.protobuf.FloatValue" => {
                json!({"type": "number"})
            }
            _ => reference(t),
        },
    };
    if f.label() == Label::Repeated {
        json!({"type": "array", "items": one})
    } else {
        one
    }
}

fn message_schema(
    m: &DescriptorProto,
    info: Option<&SourceCodeInfo>,
    path: &[i32],
    out: &mut Map<String, Value>,
    prefix: &str,
) {
    let name = format!("{prefix}.{}", m.name());
    let mut props = Map::new();
    for (j, f) in m.field.iter().enumerate() {
        let mut s = field_schema(f);
        let mut fpath = path.to_vec();
        fpath.extend([2, j as i32]);
        let mut desc = comment(info, &fpath).unwrap_or_default();
        if let Some(i) = f.oneof_index {
            let oneof = m.oneof_decl.get(i as usize).map_or("", |o| o.name());
            desc = format!("Member of oneof `{oneof}`: at most one member is set. {desc}");
        }
        let desc = desc.trim();
        if !desc.is_empty() {
            s = if s.get("$ref").is_some() {
                // Siblings of $ref are allowed in 3.1, but wrap to keep
                // older tools happy.
                json!({"allOf": [s], "description": desc})
            } else {
                let mut s = s;
                if let Some(o) = s.as_object_mut() {
                    o.insert("description".into(), Value::String(desc.to_owned()));
                }
                s
            };
        }
        props.insert(f.name().to_owned(), s);
    }
    let mut schema = json!({
        "type": "object",
        "properties": props,
        "additionalProperties": true,
    });
    if let Some(d) = comment(info, path) {
        schema["description"] = Value::String(d);
    }
    out.insert(name.clone(), schema);
    for (k, nested) in m.nested_type.iter().enumerate() {
        let mut npath = path.to_vec();
        npath.extend([3, k as i32]);
        message_schema(nested, info, &npath, out, &name);
    }
    for (k, e) in m.enum_type.iter().enumerate() {
        let mut epath = path.to_vec();
        epath.extend([4, k as i32]);
        out.insert(format!("{name}.{}", e.name()), enum_schema(e, info, &epath));
    }
}

fn enum_schema(
    e: &prost_types::EnumDescriptorProto,
    info: Option<&SourceCodeInfo>,
    path: &[i32],
) -> Value {
    let names: Vec<&str> = e.value.iter().map(|v| v.name()).collect();
    let mut s = json!({
        "type": "string",
        "enum": names,
        "description": "Written by name; the numbers of the .proto file are accepted on input",
    });
    if let Some(d) = comment(info, path) {
        s["description"] = Value::String(format!(
            "{d} Written by name; numbers are accepted on input."
        ));
    }
    s
}

fn response(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"type": "object"}}}
    })
}

fn document(short: &str, service: &str, port: u16) -> Value {
    let Some(f) = file(short) else {
        return json!({"openapi": "3.1.0", "info": {"title": "descriptor missing", "version": "0"}});
    };
    let info = f.source_code_info.as_ref();
    let mut schemas = Map::new();
    for (i, m) in f.message_type.iter().enumerate() {
        message_schema(m, info, &[4, i as i32], &mut schemas, short);
    }
    for (i, e) in f.enum_type.iter().enumerate() {
        schemas.insert(
            format!("{short}.{}", e.name()),
            enum_schema(e, info, &[5, i as i32]),
        );
    }
    let mut paths = Map::new();
    for (s_idx, s) in f.service.iter().enumerate() {
        if s.name() != service {
            continue;
        }
        for (m_idx, m) in s.method.iter().enumerate() {
            let rpc = m.name();
            let summary = comment(info, &[6, s_idx as i32, 2, m_idx as i32]);
            let mut op = json!({
                "operationId": rpc,
                "tags": [short],
                "description": format!(
                    "Also served as `POST /api/{rpc}`. gRPC: `/{}{short}.{service}/{rpc}`. \
                     Application errors are answered 200 with `header.status.code` set.",
                    PACKAGE_PREFIX
                ),
                "requestBody": {
                    "required": true,
                    "content": {"application/json": {"schema": reference(m.input_type())}}
                },
                "responses": {
                    "200": {
                        "description": "The call ran; its outcome is in header.status",
                        "content": {"application/json": {"schema": reference(m.output_type())}}
                    },
                    "400": {"description": "The body is not valid JSON for the request type; body `{}`",
                            "content": {"application/json": {"schema": {"type": "object"}}}},
                    "401": response("Authentication is on and the API key is missing or wrong"),
                    "403": response("The account may not use this listener (admin role required)"),
                    "413": response("The body is larger than the server's limit"),
                    "415": response("The content type is not JSON"),
                    "504": response("The request took longer than the server's time limit"),
                },
            });
            if let Some(summary) = summary {
                op["summary"] = Value::String(summary);
            }
            paths.insert(format!("/api/{}", lower_camel(rpc)), json!({"post": op}));
        }
    }
    let health = json!({"get": {
        "operationId": "health",
        "tags": ["ops"],
        "security": [],
        "responses": {
            "200": response("Healthy: the index answers and a storage takes writes"),
            "503": response("Unhealthy; the body says why"),
        }
    }});
    paths.insert("/health".into(), health);
    paths.insert(
        "/openapi.json".into(),
        json!({"get": {
            "operationId": "openapi",
            "tags": ["ops"],
            "security": [],
            "responses": {"200": response("This document")}
        }}),
    );
    if short == "admin" {
        paths.insert(
            "/metrics".into(),
            json!({"get": {
                "operationId": "metrics",
                "tags": ["ops"],
                "responses": {"200": {
                    "description": "Prometheus / OpenMetrics text",
                    "content": {"application/openmetrics-text": {"schema": {"type": "string"}}}
                }}
            }}),
        );
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": format!("kvtier {short} service (Tair KVCM compatible)"),
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Generated from crates/meta/proto by kvtier-server; see docs/meta-api.md \
                            and docs/server.md. Field names are the snake_case proto names \
                            (lowerCamel accepted on input); every field is written; 64-bit integers \
                            are strings; enums are names; unknown fields are ignored.",
        },
        "servers": [{"url": format!("http://localhost:{port}")}],
        "security": [{"bearer": []}, {}],
        "tags": [
            {"name": short, "description": format!("{PACKAGE_PREFIX}{short}.{service}")},
            {"name": "ops", "description": "Health, metrics and this document"}
        ],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                "description": "API key; `x-api-key: <key>` is accepted too"}}
        }
    })
}

//! Compiles `proto/` (the Tair-KVCM wire API, see docs/meta-api.md) without
//! a `protoc` binary: protox parses the files, tonic-prost-build emits the
//! messages and gRPC stubs, and pbjson-build emits serde implementations
//! with Tair KVCM's JSON conventions (original snake_case field names, enums
//! by name, 64-bit integers as strings, every field written, unknown fields
//! ignored).

use prost::Message as _;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    let files = [
        dir.join("meta_service.proto"),
        dir.join("admin_service.proto"),
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile(&files, [&dir])?;
    let descriptor = fds.encode_to_vec();
    tonic_prost_build::configure()
        // Well-known types come from pbjson-types so that wrappers such as
        // Int64Value accept JSON strings as well as numbers.
        .compile_well_known_types(true)
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_fds(fds)?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptor)?
        .preserve_proto_field_names()
        .emit_fields()
        .ignore_unknown_fields()
        .build(&[".kv_cache_manager"])?;
    Ok(())
}

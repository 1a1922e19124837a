//! Encodes the wire schema of `kvtier-meta` (`crates/meta/proto`) as a
//! `FileDescriptorSet`, so the server can derive its OpenAPI document from
//! the very descriptors the generated types come from, without a `protoc`
//! binary and without touching the meta crate.

use prost::Message as _;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let dir = manifest.join("../meta/proto");
    let files = [
        dir.join("meta_service.proto"),
        dir.join("admin_service.proto"),
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile(&files, [&dir])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("kvtier_meta_descriptor.bin");
    std::fs::write(out, fds.encode_to_vec())?;
    Ok(())
}

//! The node's block shape and its shape file (docs/disk-format.md §16).
//!
//! A node holds blocks of one shape: its arena slots and disk slots are
//! sized for it. The shape is the configured `[geometry]`, else the one
//! kept in `<serve.data_dir>/shape.toml`, else it is learned from the
//! first engine's `Hello` and kept there, so a restart needs no `Hello`.
//! The file is one `[geometry]` section with every field set; it is made
//! whole or not at all, mode 0600, and read only when it is a regular
//! file of the daemon's user that nobody else can write.

use std::io::Read;
use std::path::{Path, PathBuf};

use kvtier_core::{Attention, Dtype, Geometry, GeometryDocument};
use kvtier_protocol::Hello;

use crate::{NodeConfig, NodeError, own_file};

/// Largest shape file read; a `[geometry]` section is a few hundred bytes.
const SHAPE_FILE_MAX: u64 = 64 << 10;

/// Where a node's shape came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShapeOrigin {
    /// The configured `[geometry]` (kept in the shape file too).
    Configured,
    /// The shape file, from an earlier start.
    Kept,
    /// The first engine's `Hello` of this start.
    Learned,
}

/// A node's block shape and where it came from.
#[derive(Debug, Clone)]
pub struct Shape {
    /// The geometry.
    pub geometry: Geometry,
    /// Where it came from.
    pub origin: ShapeOrigin,
    /// The shape file that keeps it.
    pub file: PathBuf,
}

impl Shape {
    /// The shape in human terms, with where it came from.
    pub fn describe(&self) -> String {
        let from = match self.origin {
            ShapeOrigin::Configured => "the configured [geometry]".to_owned(),
            ShapeOrigin::Kept => format!("kept in {}", self.file.display()),
            ShapeOrigin::Learned => format!(
                "learned from the first engine's Hello, kept in {}",
                self.file.display()
            ),
        };
        format!("{} ({from})", self.geometry.describe())
    }
}

fn file_err(op: &'static str, path: &Path, source: std::io::Error) -> NodeError {
    NodeError::ShapeFile {
        op,
        path: path.to_owned(),
        source,
    }
}

fn bad_file(path: &Path, why: String) -> NodeError {
    NodeError::BadShapeFile {
        path: path.to_owned(),
        why,
    }
}

/// The geometry kept at `path`, `None` when there is no file. A file that
/// is not a regular file of this user, that its group or others may
/// write, or that does not hold one valid `[geometry]` section is refused;
/// one others may read is made 0600.
pub fn load(path: &Path) -> Result<Option<Geometry>, NodeError> {
    let (file, meta) = match own_file::open(path) {
        Ok(opened) => opened,
        Err((_, e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err((op, e)) => return Err(file_err(op, path, e)),
    };
    let hint = "its group or others may change it (chmod 600 it)";
    if let Some(why) = own_file::refusal(&meta, 0o022, hint) {
        return Err(bad_file(path, why));
    }
    // Others may have read it (an older build's 0644), never changed it:
    // it stays usable, and private from now on.
    kvtier_io::restrict_mode(&file, kvtier_io::PRIVATE_FILE_MODE)
        .map_err(|e| file_err("narrowing the mode of", path, e))?;
    let mut text = String::new();
    file.take(SHAPE_FILE_MAX + 1)
        .read_to_string(&mut text)
        .map_err(|e| file_err("reading", path, e))?;
    if text.len() as u64 > SHAPE_FILE_MAX {
        return Err(bad_file(
            path,
            format!("longer than {SHAPE_FILE_MAX} bytes"),
        ));
    }
    GeometryDocument::parse_geometry(&text)
        .map(Some)
        .map_err(|e| bad_file(path, e.to_string()))
}

/// The shape file's text for `g`.
fn text_of(g: &Geometry, origin: ShapeOrigin) -> String {
    let from = match origin {
        ShapeOrigin::Configured => "written from the configured [geometry]",
        _ => "learned from the first engine's Hello",
    };
    format!(
        "# The block shape this kvtier node's data holds ({from}).\n\
         # Written by the daemon; a configured [geometry] must equal it.\n\
         # Shape: {}\n{}",
        g.describe(),
        GeometryDocument::exact(g).to_toml()
    )
}

/// Keeps `g` at `path` unless a file is there (then false: it was left).
fn store(path: &Path, g: &Geometry, origin: ShapeOrigin) -> Result<bool, NodeError> {
    own_file::publish(path, text_of(g, origin).as_bytes()).map_err(|(op, e)| file_err(op, path, e))
}

/// The shape a node starts with: the configured `[geometry]`, which must
/// equal a kept one (the stored blocks have the kept shape); else the kept
/// one; else `None` (learned at the first `Hello`). Once the node has
/// opened with it, keep it (`keep`).
pub fn at_start(config: &NodeConfig) -> Result<Option<Shape>, NodeError> {
    let file = config.shape_file();
    let kept = load(&file)?;
    let Some(section) = &config.geometry else {
        return Ok(kept.map(|geometry| Shape {
            geometry,
            origin: ShapeOrigin::Kept,
            file,
        }));
    };
    let geometry = section.resolve()?;
    match kept {
        Some(k) if k == geometry => {}
        Some(k) => {
            return Err(NodeError::ShapeConflict {
                path: file,
                configured: geometry.describe(),
                kept: k.describe(),
            });
        }
        // Kept once the tiers opened with it (`keep`): a configuration
        // the node cannot open with is not kept.
        None => {}
    }
    Ok(Some(Shape {
        geometry,
        origin: ShapeOrigin::Configured,
        file,
    }))
}

/// Keeps `shape` in its file, unless it came from there. A file there
/// already (written since the start looked) must hold the same geometry.
pub(crate) fn keep(shape: &Shape) -> Result<(), NodeError> {
    if shape.origin == ShapeOrigin::Kept {
        return Ok(());
    }
    let (path, g) = (shape.file.as_path(), &shape.geometry);
    // A configured shape an earlier start kept: nothing to write, so a
    // full file system does not stop the start.
    if load(path)?.as_ref() == Some(g) {
        return Ok(());
    }
    if store(path, g, shape.origin)? {
        return Ok(());
    }
    match load(path)? {
        Some(k) if k == *g => Ok(()),
        Some(k) => Err(NodeError::ShapeConflict {
            path: path.to_owned(),
            configured: g.describe(),
            kept: k.describe(),
        }),
        None => Err(bad_file(path, "vanished while it was written".into())),
    }
}

/// The geometry a `Hello` declares: its layers, tokens per block and
/// element type, and each layer's bytes as one part of that many elements
/// per token (what the node needs: it stores bytes; the head split is the
/// engine's). Refused, with why, when the bytes do not make such a shape.
pub(crate) fn learn(hello: &Hello) -> Result<Geometry, String> {
    let (ns, w) = (&hello.namespace, &hello.geometry);
    let dtype: Dtype = ns.dtype.parse().map_err(|_| {
        format!(
            "the node has no block shape yet and cannot learn one from dtype {:?} (known: f32, f16, bf16, fp8, int8 and torch's names); configure [geometry]",
            crate::conn::clip(&ns.dtype)
        )
    })?;
    let tokens = ns.block_size_tokens as u64;
    let per_token = tokens * dtype.bytes() as u64;
    let layers_bytes = (w.layers as u64).checked_mul(w.layer_bytes);
    if w.layers == 0 || tokens == 0 || w.layer_bytes == 0 || layers_bytes != Some(w.block_bytes) {
        return Err(format!(
            "the node has no block shape yet and cannot learn one from {}: blocks must be layers x layer bytes, both positive",
            describe_hello(hello)
        ));
    }
    let latent = u32::try_from(w.layer_bytes / per_token).ok();
    let g = match latent {
        Some(latent_dim) if w.layer_bytes.is_multiple_of(per_token) => Geometry {
            layers: w.layers,
            attention: Attention::Mla { latent_dim },
            dtype,
            tokens_per_block: ns.block_size_tokens,
            tp_size: 1,
            tp_rank: 0,
        },
        _ => {
            return Err(format!(
                "the node has no block shape yet and cannot learn one from {}: a layer is not a whole number of {} elements per token",
                describe_hello(hello),
                dtype.name()
            ));
        }
    };
    g.validate().map_err(|e| e.to_string())?;
    Ok(g)
}

/// The shape a `Hello` declares, in human terms.
pub(crate) fn describe_hello(hello: &Hello) -> String {
    let (ns, w) = (&hello.namespace, &hello.geometry);
    let per_token = ns
        .dtype
        .parse::<Dtype>()
        .ok()
        .map(|d| ns.block_size_tokens as u64 * d.bytes() as u64)
        .filter(|&b| b > 0 && w.layer_bytes.is_multiple_of(b))
        .map(|b| format!(" ({} elements per token)", w.layer_bytes / b))
        .unwrap_or_default();
    format!(
        "{} layers, {}, {} tokens per block, TP rank {} of {}: {} B per layer of a block{per_token}, {} B per block",
        w.layers,
        crate::conn::clip(&ns.dtype),
        ns.block_size_tokens,
        ns.tp_rank,
        ns.tp_size,
        w.layer_bytes,
        w.block_bytes
    )
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use kvtier_core::ModelPreset;

    use super::*;

    fn keep_learned(path: &Path, g: &Geometry) -> Result<(), NodeError> {
        keep(&Shape {
            geometry: *g,
            origin: ShapeOrigin::Learned,
            file: path.to_owned(),
        })
    }

    #[test]
    fn a_kept_shape_is_private_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shape.toml");
        assert!(load(&path).unwrap().is_none());
        let g = ModelPreset::DeepSeekV3.geometry(16);
        keep_learned(&path, &g).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(load(&path).unwrap(), Some(g));
        keep_learned(&path, &g).unwrap();
        let other = ModelPreset::Tiny.geometry(16);
        let err = keep_learned(&path, &other).unwrap_err().to_string();
        assert!(
            err.contains("2 KV heads of 32") && err.contains("latent of 576"),
            "{err}"
        );
        assert!(!own_file::temporary_name(&path).exists());
    }

    #[test]
    fn a_shape_file_others_may_write_or_that_does_not_parse_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shape.toml");
        keep_learned(&path, &ModelPreset::Tiny.geometry(32)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(load(&path).unwrap().is_some(), "readable by others: used");
        assert_eq!(
            std::fs::metadata(&path).unwrap().mode() & 0o777,
            0o600,
            "and narrowed"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o620)).unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(err.contains("0620") && err.contains("chmod 600"), "{err}");
        std::fs::remove_file(&path).unwrap();
        own_file::write_private(&path, b"[geometry]\nlayers = \"two\"\n").unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(err.contains("cannot be used"), "{err}");
        let link = dir.path().join("link.toml");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(load(&link).is_err(), "a link is not followed");
    }
}

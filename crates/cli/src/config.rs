//! Loading the configuration at the binary's edge.

use anyhow::{Context, Result};
use kvtier_core::Config;
use std::path::{Path, PathBuf};

/// Loads the configuration: `explicit` path, else `$KVTIER_CONFIG`, else
/// `./kvtier.toml` if present, else defaults; then environment overrides.
pub fn load(explicit: Option<&Path>) -> Result<Config> {
    let path: Option<PathBuf> = explicit
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("KVTIER_CONFIG").map(PathBuf::from))
        .or_else(|| Some(PathBuf::from("kvtier.toml")).filter(|p| p.exists()));
    let text = match &path {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("reading config file {}", p.display()))?,
        None => String::new(),
    };
    let source = path
        .as_ref()
        .map_or("built-in defaults".to_string(), |p| p.display().to_string());
    Config::from_toml_with_env(&text, std::env::vars())
        .with_context(|| format!("configuration from {source}"))
}

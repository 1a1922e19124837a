//! Request traces: readers for public LLM-serving trace formats and kvtier's
//! own schema.
//!
//! Every reader turns one JSON line into one [`Request`] whose `keys` are
//! **prefix keys**: an equal key at an equal position means an equal prefix,
//! so the replay can match prefixes by comparing keys. Formats whose ids are
//! per-block content hashes (Bailian) are chained here, once, so that nothing
//! downstream needs to know where a trace came from.
//!
//! Readers stream: [`TraceReader`] holds one line at a time, so a trace larger
//! than memory can be replayed with [`crate::replay::replay_stream`]. The
//! formats are described in `docs/traces.md`.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::str::FromStr;

pub mod bailian;
mod kvtier;
pub mod mooncake;
pub mod random;

use kvtier_core::BlockHash;
use serde::{Deserialize, Serialize};

/// The on-disk format of a trace file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceFormat {
    /// Mooncake FAST'25 JSONL: prefix `hash_ids`, 512 tokens per block.
    Mooncake,
    /// Alibaba Qwen Bailian JSONL: per-block `hash_ids`, 16 tokens per block.
    Bailian,
    /// kvtier's own JSONL schema with explicit prefix keys.
    Kvtier,
}

impl TraceFormat {
    /// Every format, in a stable order.
    pub const ALL: [TraceFormat; 3] = [
        TraceFormat::Mooncake,
        TraceFormat::Bailian,
        TraceFormat::Kvtier,
    ];

    /// The format's name as accepted by [`FromStr`].
    pub const fn name(self) -> &'static str {
        match self {
            TraceFormat::Mooncake => "mooncake",
            TraceFormat::Bailian => "bailian",
            TraceFormat::Kvtier => "kvtier",
        }
    }
}

impl std::fmt::Display for TraceFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TraceFormat {
    type Err = TraceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TraceFormat::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| TraceError::UnknownFormat(s.to_owned()))
    }
}

/// One request of a trace: its arrival, its sizes and its prefix keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Arrival time in milliseconds (relative to the trace's start).
    pub timestamp_ms: u64,
    /// Interned instance / model id; 0 when the trace has none. Blocks are
    /// reused only inside one instance.
    pub instance: u32,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Generated tokens.
    pub output_tokens: u32,
    /// Prefix keys of the prompt's blocks: an equal key at an equal position
    /// means an equal prefix.
    pub keys: Vec<BlockHash>,
    /// Tokens per block of this trace.
    pub tokens_per_block: u32,
    /// Tokens in the last block: `tokens_per_block` when it is full, fewer
    /// when the prompt ends inside it.
    pub last_block_tokens: u32,
}

impl Request {
    /// Tokens covered by the first `blocks` blocks of this request.
    pub fn tokens_in_blocks(&self, blocks: usize) -> u64 {
        let n = self.keys.len();
        let blocks = blocks.min(n);
        if blocks == 0 {
            return 0;
        }
        let full = (blocks - 1) as u64 * u64::from(self.tokens_per_block);
        let last = if blocks == n {
            self.last_block_tokens
        } else {
            self.tokens_per_block
        };
        full + u64::from(last)
    }
}

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The trace file could not be opened or read.
    #[error("reading trace {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A line is not a valid record of the trace's format.
    #[error("line {line}: {message}")]
    Parse {
        /// 1-based line number in the file.
        line: u64,
        /// What is wrong with it.
        message: String,
    },
    /// The format could not be detected from the first record.
    #[error("cannot detect the trace format of {path}: {message}")]
    Detect {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// A format name that is not one of `mooncake`, `bailian`, `kvtier`.
    #[error("unknown trace format {0:?} (expected mooncake, bailian or kvtier)")]
    UnknownFormat(String),
    /// A replay option that cannot work on this input (for example Belady
    /// over a stream).
    #[error("unsupported: {0}")]
    Unsupported(String),
}

/// A streaming reader of one trace file: yields one [`Request`] per
/// non-blank line, reading one line at a time. After the first error it
/// yields nothing more.
pub struct TraceReader {
    format: TraceFormat,
    path: PathBuf,
    lines: Box<dyn BufRead + Send>,
    line_no: u64,
    buf: String,
    /// The first non-blank line, read by format detection and not yet parsed.
    pending: Option<(u64, String)>,
    state: ParseState,
    done: bool,
}

/// Per-reader parse state (interned names).
#[derive(Debug)]
enum ParseState {
    Mooncake,
    Bailian(bailian::State),
    Kvtier(kvtier::State),
}

impl ParseState {
    fn new(format: TraceFormat) -> Self {
        match format {
            TraceFormat::Mooncake => ParseState::Mooncake,
            TraceFormat::Bailian => ParseState::Bailian(bailian::State::default()),
            TraceFormat::Kvtier => ParseState::Kvtier(kvtier::State::default()),
        }
    }

    fn parse(&mut self, line: &str) -> Result<Request, String> {
        match self {
            ParseState::Mooncake => mooncake::parse(line),
            ParseState::Bailian(s) => bailian::parse(line, s),
            ParseState::Kvtier(s) => kvtier::parse(line, s),
        }
    }
}

impl std::fmt::Debug for TraceReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceReader")
            .field("format", &self.format)
            .field("path", &self.path)
            .field("line_no", &self.line_no)
            .finish_non_exhaustive()
    }
}

impl TraceReader {
    /// Reads any [`BufRead`] source (the `path` only names it in errors);
    /// `format: None` detects the format from the first non-blank line.
    pub fn from_reader(
        mut lines: Box<dyn BufRead + Send>,
        path: &Path,
        format: Option<TraceFormat>,
    ) -> Result<Self, TraceError> {
        let mut line_no = 0;
        let mut pending = None;
        let format = match format {
            Some(f) => f,
            None => {
                let mut buf = String::new();
                loop {
                    buf.clear();
                    let n = lines.read_line(&mut buf).map_err(|source| TraceError::Io {
                        path: path.to_owned(),
                        source,
                    })?;
                    if n == 0 {
                        // An empty trace: any format reads it as nothing.
                        break TraceFormat::Kvtier;
                    }
                    line_no += 1;
                    if !buf.trim().is_empty() {
                        let f = detect(buf.trim()).map_err(|message| TraceError::Detect {
                            path: path.to_owned(),
                            message: format!("line {line_no}: {message}"),
                        })?;
                        pending = Some((line_no, std::mem::take(&mut buf)));
                        break f;
                    }
                }
            }
        };
        Ok(TraceReader {
            format,
            path: path.to_owned(),
            lines,
            line_no,
            buf: String::new(),
            pending,
            state: ParseState::new(format),
            done: false,
        })
    }

    /// The format being read.
    pub fn format(&self) -> TraceFormat {
        self.format
    }

    /// The 1-based number of the last line read.
    pub fn line(&self) -> u64 {
        self.line_no
    }
}

/// Detects a format from one JSON record by its field names.
fn detect(line: &str) -> Result<TraceFormat, String> {
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    if obj.contains_key("keys") && obj.contains_key("tokens_per_block") {
        Ok(TraceFormat::Kvtier)
    } else if obj.contains_key("hash_ids")
        && (obj.contains_key("chat_id")
            || obj.contains_key("parent_chat_id")
            || obj.contains_key("turn"))
    {
        Ok(TraceFormat::Bailian)
    } else if obj.contains_key("hash_ids") {
        Ok(TraceFormat::Mooncake)
    } else {
        Err(
            "no `hash_ids` (mooncake, bailian) nor `keys` and `tokens_per_block` (kvtier)"
                .to_owned(),
        )
    }
}

impl Iterator for TraceReader {
    type Item = Result<Request, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let (line_no, line) = match self.pending.take() {
            Some(p) => p,
            None => loop {
                self.buf.clear();
                match self.lines.read_line(&mut self.buf) {
                    Ok(0) => {
                        self.done = true;
                        return None;
                    }
                    Ok(_) => {
                        self.line_no += 1;
                        if !self.buf.trim().is_empty() {
                            break (self.line_no, std::mem::take(&mut self.buf));
                        }
                    }
                    Err(source) => {
                        self.done = true;
                        return Some(Err(TraceError::Io {
                            path: self.path.clone(),
                            source,
                        }));
                    }
                }
            },
        };
        let parsed = self.state.parse(line.trim());
        // Keep the line's allocation for the next read.
        self.buf = line;
        match parsed {
            Ok(r) => Some(Ok(r)),
            Err(message) => {
                self.done = true;
                Some(Err(TraceError::Parse {
                    line: line_no,
                    message,
                }))
            }
        }
    }
}

/// Opens `path` for streaming; `format: None` detects the format from the
/// first non-blank line.
pub fn open(path: &Path, format: Option<TraceFormat>) -> Result<TraceReader, TraceError> {
    let file = File::open(path).map_err(|source| TraceError::Io {
        path: path.to_owned(),
        source,
    })?;
    TraceReader::from_reader(
        Box::new(BufReader::with_capacity(1 << 16, file)),
        path,
        format,
    )
}

/// Reads a whole trace into memory.
pub fn read_all(path: &Path, format: Option<TraceFormat>) -> Result<Vec<Request>, TraceError> {
    open(path, format)?.collect()
}

/// Writes `requests` in kvtier's own JSONL schema (see `docs/traces.md`);
/// [`open`] reads them back equal.
pub fn write_kvtier<W: std::io::Write>(w: W, requests: &[Request]) -> std::io::Result<()> {
    kvtier::write(w, requests)
}

/// Tokens in the last of `blocks` blocks of a prompt of `input` tokens,
/// clamped into `1..=tpb` when the trace's lengths disagree with its ids.
fn last_block_tokens(input: u32, blocks: usize, tpb: u32) -> u32 {
    if blocks == 0 {
        return tpb;
    }
    let before = (blocks as u64 - 1) * u64::from(tpb);
    let last = u64::from(input).saturating_sub(before);
    last.clamp(1, u64::from(tpb)) as u32
}

/// A trace timestamp in `scale` milliseconds per unit, as whole milliseconds.
fn millis(t: f64, scale: f64) -> Result<u64, String> {
    let ms = (t * scale).round();
    if !ms.is_finite() || ms < 0.0 || ms > u64::MAX as f64 {
        return Err(format!("timestamp {t} is not a non-negative time"));
    }
    Ok(ms as u64)
}

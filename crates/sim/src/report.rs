//! Reports of a sweep: one JSON object, CSV, or one self-contained HTML page.
//!
//! The three render the same [`Report`]: JSON for programs (every field of
//! every [`Point`]), CSV for spreadsheets (one row per point, summaries
//! flattened), HTML for people (plots drawn as inline SVG by [`svg`] and a
//! table; no script, no external asset, so the file can be mailed or
//! attached to a ticket and still open).

pub mod csv;
pub mod html;
pub mod svg;

use serde::Serialize;

use crate::model::ServingModel;
use crate::sweep::{Point, SearchResult, Target, TraceFacts};

pub use csv::to_csv;
pub use html::to_html;

/// Errors while rendering a report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Serialising to JSON failed.
    #[error("cannot serialise the report to JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// The outcome of a search, as reported.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SearchSummary {
    /// The target.
    pub target: Target,
    /// Index into `results` of the cheapest point meeting it.
    pub best: Option<usize>,
}

/// Everything a report shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Title (the trace's file name, say).
    pub title: String,
    /// What the trace is.
    pub trace: TraceFacts,
    /// The model the TTFT and cost figures come from, if any.
    pub model: Option<ServingModel>,
    /// One entry per configuration.
    pub results: Vec<Point>,
    /// The search, when the points come from one.
    pub search: Option<SearchSummary>,
}

impl Report {
    /// A report of sweep `results`.
    pub fn new(
        title: &str,
        trace: TraceFacts,
        model: Option<ServingModel>,
        results: Vec<Point>,
    ) -> Self {
        Report {
            title: title.to_owned(),
            trace,
            model,
            results,
            search: None,
        }
    }

    /// A report of a search.
    pub fn from_search(
        title: &str,
        trace: TraceFacts,
        model: ServingModel,
        search: SearchResult,
    ) -> Self {
        Report {
            title: title.to_owned(),
            trace,
            model: Some(model),
            results: search.points,
            search: Some(SearchSummary {
                target: search.target,
                best: search.best,
            }),
        }
    }

    /// The report as one pretty-printed JSON object.
    pub fn to_json(&self) -> Result<String, ReportError> {
        Ok(serde_json::to_string_pretty(self)?)
    }
}

/// `s` with `& < > " '` replaced by HTML entities: safe in text and in
/// quoted attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A tier layout as `G1=1000+G2=4000`.
pub fn layout_label(p: &Point) -> String {
    p.tiers
        .iter()
        .map(|t| format!("{}={}", t.name, t.capacity_blocks))
        .collect::<Vec<_>>()
        .join("+")
}
